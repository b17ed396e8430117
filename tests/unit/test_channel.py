"""engine/channel.py: each worker's results pipe, read by the coordinator without ever
blocking on a worker, and the stop flag every worker reads without a lock; a page's trip
down."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import struct
import time

import pytest

from bulkfetch.engine.channel import Inboxes, Outbox, StopFlag, pipe
from bulkfetch.models import Page


def _send(outbox: Outbox, worker: int, count: int) -> None:
    for i in range(count):
        outbox.put(("page", worker, i, "x" * (i % 70000)))  # some above a pipe's 64 KiB


def test_messages_of_several_workers_arrive_whole_and_in_order_per_worker() -> None:
    context = multiprocessing.get_context("fork")
    inboxes = Inboxes()
    workers, fds = [], {}
    for worker in range(3):
        reader, outbox = pipe()
        inboxes.add(reader)
        fds[reader] = worker
        workers.append(context.Process(target=_send, args=(outbox, worker, 300)))
        workers[-1].start()
        outbox.close()
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    ended: set[int] = set()
    deadline = time.monotonic() + 30
    while len(ended) < 3 and time.monotonic() < deadline:
        taken, done = inboxes.take(1.0)
        for fd, messages in taken.items():
            for kind, worker, i, text in messages:
                assert kind == "page" and worker == fds[fd] and text == "x" * (i % 70000)
                seen[worker].append(i)
        ended |= set(done)
    for worker in workers:
        worker.join(10)
    assert all(seen[w] == list(range(300)) for w in seen) and ended == set(fds)


def test_take_waits_about_the_timeout_then_gives_nothing() -> None:
    reader, _outbox = pipe()
    inboxes = Inboxes()
    inboxes.add(reader)
    started = time.monotonic()
    assert inboxes.take(0.05) == ({}, [])
    assert time.monotonic() - started >= 0.04


def test_messages_come_whole_and_in_order() -> None:
    reader, outbox = pipe()
    inboxes = Inboxes()
    inboxes.add(reader)
    for n in range(100):
        outbox.put(("tick", n))
    taken, ended = inboxes.take(1.0)
    assert taken == {reader: [("tick", n) for n in range(100)]} and ended == []
    assert inboxes.take(0.0) == ({}, [])
    outbox.close()
    assert inboxes.take(1.0) == ({}, [reader])  # its end: closed and forgotten
    assert reader not in inboxes.buffers


def test_half_a_message_waits_for_the_rest_without_blocking() -> None:
    """A worker frozen halfway through a write leaves half a message: the coordinator goes
    on, and takes the message once the rest comes."""
    reader, outbox = pipe()
    inboxes = Inboxes()
    inboxes.add(reader)
    data = pickle.dumps(("pages", 1, ["x" * 100]))
    frame = struct.pack("<Q", len(data)) + data
    os.write(outbox.fd, frame[:5])  # not even the whole length
    started = time.monotonic()
    assert inboxes.take(0.2) == ({}, [])
    os.write(outbox.fd, frame[5:60])
    assert inboxes.take(0.0) == ({}, [])
    assert time.monotonic() - started < 1.0
    os.write(outbox.fd, frame[60:] + frame)
    assert inboxes.take(0.0) == ({reader: [("pages", 1, ["x" * 100])] * 2}, [])
    os.write(outbox.fd, frame[:30])
    outbox.close()  # the writer died mid-message: the pipe ends, the half is dropped
    assert inboxes.take(0.2) == ({}, [reader])


def test_a_message_larger_than_the_pipe_from_a_writer_stopped_midway() -> None:
    reader, outbox = pipe()
    inboxes = Inboxes()
    inboxes.add(reader)
    big = ("bodies", "x" * (16 << 20))  # more than one take() reads (64 reads of a pipe)
    child = os.fork()
    if child == 0:  # pragma: no cover - the writer
        outbox.put(("tick", 0))
        outbox.put(big)
        os._exit(0)
    outbox.close()
    try:
        taken: list[object] = []
        deadline = time.monotonic() + 10
        while not taken and time.monotonic() < deadline:
            taken += inboxes.take(0.1)[0].get(reader, [])
        assert taken[0] == ("tick", 0)
        os.kill(child, signal.SIGSTOP)  # (somewhere in the middle of the big one)
        stopped_at = time.monotonic()
        while time.monotonic() - stopped_at < 0.5:
            taken += inboxes.take(0.05)[0].get(reader, [])
        assert time.monotonic() - stopped_at < 5  # never blocked on the frozen writer
        assert taken[-1] != big
        os.kill(child, signal.SIGCONT)
        ended: list[int] = []
        deadline = time.monotonic() + 10
        while not ended and time.monotonic() < deadline:
            more, ended = inboxes.take(0.1)
            taken += more.get(reader, [])
        assert taken == [("tick", 0), big] and ended == [reader]
    finally:
        os.waitpid(child, 0)


def test_the_stop_flag_is_seen_by_a_forked_worker() -> None:
    context = multiprocessing.get_context("fork")
    stop = StopFlag(context)
    seen = context.Value("b", 0)

    def worker() -> None:
        deadline = time.monotonic() + 10
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.value = 1 if stop.is_set() else 2

    process = context.Process(target=worker)
    process.start()
    assert not stop.is_set()
    stop.set()
    process.join(10)
    assert seen.value == 1 and stop.is_set()


@pytest.mark.parametrize("names", [
    tuple(f"f{i:010d}" for i in range(1000)),
    (),
    ("",),
    ("a", ""),
    ("a\0b", "c"),  # a NUL inside a name: the page travels as a tuple
    ("\0",),
    ("\udcff", "caf\u00e9", "x\ny"),
])
def test_a_page_survives_the_trip_to_a_worker(names: tuple[str, ...]) -> None:
    page = Page(7, "token", names)
    assert pickle.loads(pickle.dumps(page, protocol=pickle.HIGHEST_PROTOCOL)) == page


def test_a_page_of_plain_names_travels_as_one_string() -> None:
    names = tuple(f"f{i:010d}" for i in range(1000))
    data = pickle.dumps(Page(7, None, names), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) < 12 * 1000 + 200  # the names' bytes and NULs, no per-name framing
    assert pickle.loads(data).names == names
