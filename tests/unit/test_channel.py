"""The worker -> coordinator pipe: whole messages from several processes, timeouts."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest

from bulkfetch.engine.channel import Outbox, channel


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
