"""The worker -> coordinator pipe: whole messages from several processes, timeouts."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import time

import pytest

from bulkfetch.engine.channel import Outbox, channel
from bulkfetch.models import Page


def _send(outbox: Outbox, worker: int, count: int) -> None:
    for i in range(count):
        outbox.put(("page", worker, i, "x" * (i % 7000)))  # some above PIPE_BUF


def test_messages_of_several_workers_arrive_whole_and_in_order_per_worker() -> None:
    context = multiprocessing.get_context("fork")
    inbox, outbox = channel(context)
    workers = [context.Process(target=_send, args=(outbox, w, 300)) for w in range(3)]
    for worker in workers:
        worker.start()
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 30
    while sum(map(len, seen.values())) < 900 and time.monotonic() < deadline:
        kind, worker, i, text = inbox.get(timeout=1)
        assert kind == "page" and text == "x" * (i % 7000)
        seen[worker].append(i)
    for worker in workers:
        worker.join(10)
    assert all(seen[w] == list(range(300)) for w in seen)
    with pytest.raises(queue.Empty):
        inbox.get_nowait()


def test_get_waits_about_the_timeout_then_raises_empty() -> None:
    inbox, _ = channel(multiprocessing.get_context("fork"))
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)
    assert time.monotonic() - started >= 0.04


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
