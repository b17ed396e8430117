"""The local runner's ProcessPool, as the coordinator uses it: real forked processes, with
engine/worker.py itself or a small stand-in that holds its pages and ticks."""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path
from typing import Any

from bulkfetch.api import build_options
from bulkfetch.models import Page, PageReport
from bulkfetch.runners.holdings import Holding, LeaseClock, Message
from bulkfetch.runners.pool import ProcessPool

LEASE = 2.0


def holding_worker(worker: int, options: Any, tasks: Any, results: Any, stop: Any,
                   parent_pid: int, *, share: Any = None) -> None:
    """Ticks every 50 ms and keeps each page it is given, unfinished, until told to stop;
    a page named "done" it reports done at once, and "exit 3" makes it exit with 3."""
    while not stop.is_set() and os.getppid() == parent_pid:
        try:
            page = tasks.get(timeout=0.05)
        except queue.Empty:
            page = False
        if page is None:
            break
        if page and page.names == ("done",):
            results.put(("pages", 1, [PageReport(page.seq, 1, 1)]))
        elif page and page.names == ("exit 3",):
            os._exit(3)
        results.put(("tick", worker))
    results.put(("exit", worker))


def started(tmp_path: Path, workers: int = 2) -> ProcessPool:
    options = build_options("http://127.0.0.1:9", tmp_path / "dest", workers=workers,
                            sink="null", lease=LEASE)
    pool = ProcessPool(options, target=holding_worker)
    pool.start()
    return pool


def wait_for(pool: ProcessPool, kind: str, within: float) -> tuple[Message, list[Message]]:
    said: list[Message] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        said += pool.receive(0.1)
        for message in said:
            if message[0] == kind:
                return message, said
    raise AssertionError(f"no {kind!r} within {within} s; said {said[-5:]}")


def ended(pool: ProcessPool, expected: set[int]) -> set[int]:
    """Finish: the workers that say they exit (all of `expected` within 30 s)."""
    pool.finish(stop_now=False)
    exited: set[int] = set()
    deadline = time.monotonic() + 30
    while exited != expected and time.monotonic() < deadline:
        exited |= {message[1] for message in pool.receive(0.2) if message[0] == "exit"}
    pool.join()
    pool.close()
    return exited


def test_workers_that_exit_leave_nothing_to_read_not_an_end_of_file(tmp_path: Path) -> None:
    options = build_options("http://127.0.0.1:9", tmp_path / "dest", workers=2, sink="null")
    pool = ProcessPool(options)
    pool.start()
    pool.finish(stop_now=False)  # no pages: each worker says it exits
    exited: set[int] = set()
    deadline = time.monotonic() + 30
    while len(exited) < pool.size and time.monotonic() < deadline:
        exited |= {message[1] for message in pool.receive(0.2) if message[0] == "exit"}
    assert exited == {0, 1}
    pool.join()
    # an end asked for is not a death; the drain's last look reads nothing, not EOFError
    assert pool.all_gone() and pool.dead() is None
    assert pool.receive(0.05) == []
    pool.close()


def test_pages_go_to_the_worker_with_the_fewest_unfetched(tmp_path: Path) -> None:
    pool = started(tmp_path)
    for seq in range(5):
        pool.send(Page(seq, None, ("a",)))
    assert sorted(proc.unfetched for proc in pool.procs.values()) == [2, 3]
    pool.send(Page(9, None, ("done",)))  # to the one with 2; reported done at once
    wait_for(pool, "pages", 10)
    assert sorted(len(proc.held) for proc in pool.procs.values()) == [2, 3]
    assert ended(pool, {0, 1}) == {0, 1}


def test_a_stopped_worker_loses_its_pages_after_a_lease_and_another_takes_its_place(
        tmp_path: Path) -> None:
    pool = started(tmp_path)
    for seq in range(4):
        pool.send(Page(seq, None, ("a",)))
    frozen = pool.procs[0]
    frozen_pages = sorted(frozen.held)
    wait_for(pool, "tick", 10)
    stopped_at = time.monotonic()
    os.kill(frozen.process.pid, signal.SIGSTOP)
    lost, said = wait_for(pool, "lost", 10 * LEASE)
    took = time.monotonic() - stopped_at
    assert LEASE <= took < 3 * LEASE, took
    _, worker, pages, unfetched, why, lapsed = lost
    assert (worker, [page.seq for page in pages], unfetched) == (0, frozen_pages, 2)
    assert lapsed and "--lease" in why
    assert ("exit", 0) in said  # the drain counts it among the workers that ended
    assert frozen.process.exitcode == -signal.SIGKILL
    assert pool.size == 3 and pool.procs[2].slot == 0 and pool.dead() is None
    pool.send(Page(7, None, ("a",)))  # the new worker and the healthy one take pages
    assert {proc.worker for proc in pool._live() if proc.held} >= {1}
    assert ended(pool, {1, 2}) == {1, 2}  # (0's exit came with its loss)


def test_no_lease_lapses_once_the_run_is_finishing(tmp_path: Path) -> None:
    """A last shard's flush may be long and silent: the drain, with its own deadline,
    decides then, not the lease."""
    pool = started(tmp_path)
    wait_for(pool, "tick", 10)
    slow = pool.procs[0]
    os.kill(slow.process.pid, signal.SIGSTOP)
    pool.finish(stop_now=False)
    said: list[Message] = []
    deadline = time.monotonic() + 2 * LEASE
    while time.monotonic() < deadline:
        said += pool.receive(0.1)
    assert not [message for message in said if message[0] == "lost"]
    assert slow.process.is_alive() and slow.lapsed is None
    os.kill(slow.process.pid, signal.SIGCONT)
    exited = {message[1] for message in said if message[0] == "exit"}
    deadline = time.monotonic() + 30
    while exited != {0, 1} and time.monotonic() < deadline:
        exited |= {message[1] for message in pool.receive(0.2) if message[0] == "exit"}
    assert exited == {0, 1}
    pool.join()
    pool.close()


def test_a_killed_worker_is_replaced_at_once(tmp_path: Path) -> None:
    pool = started(tmp_path)
    pool.send(Page(0, None, ("a",)))
    victim = next(proc for proc in pool.procs.values() if proc.held)
    killed_at = time.monotonic()
    os.kill(victim.process.pid, signal.SIGKILL)  # as the OOM killer does
    lost, _ = wait_for(pool, "lost", 10)
    assert time.monotonic() - killed_at < LEASE  # its pipe ended: no lease to wait out
    assert lost[1] == victim.worker and [page.seq for page in lost[2]] == [0]
    assert "signal 9" in lost[4] and not lost[5]
    assert pool.size == 3 and pool.dead() is None
    assert ended(pool, {0, 1, 2} - {victim.worker}) == {0, 1, 2} - {victim.worker}


def test_a_worker_that_ends_by_itself_stops_the_run_without_a_replacement(
        tmp_path: Path) -> None:
    pool = started(tmp_path)
    pool.send(Page(0, None, ("exit 3",)))
    wait_for(pool, "exit", 10)
    deadline = time.monotonic() + 10
    while pool.dead() is None and time.monotonic() < deadline:
        pool.receive(0.1)
    assert "exit code 3" in (pool.dead() or "")
    assert pool.size == 2
    pool.finish(stop_now=True)
    pool.join()
    pool.close()


def test_the_pool_s_own_silence_renews_every_lease() -> None:
    """Ctrl-Z stops the whole run: on `fg`, no worker was silent, the pool was."""
    clock = LeaseClock(LEASE)
    quiet, lapsed = Holding(), Holding()
    quiet.heard = lapsed.heard = time.monotonic() - 10 * LEASE
    lapsed.lapsed = time.monotonic() - 5 * LEASE
    clock.looked = time.monotonic() - 10 * LEASE
    now = clock.look([quiet, lapsed])
    assert not clock.silent(quiet, now) and not clock.unanswered(lapsed, now)
    # while the pool looks often, a silent worker's lease lapses
    assert clock.silent(quiet, now + LEASE + 0.1)
    assert clock.look([quiet]) - clock.looked == 0
