"""The coordinator's dispatch: pages go out in order, up to the limit, and a starving run
waits on the lister rather than on the workers."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

from bulkfetch.api import build_options
from bulkfetch.dest.journal import Journal
from bulkfetch.listing.lister import Listed
from bulkfetch.runners.coordinator import Coordinator
from bulkfetch.sources import make_source
from bulkfetch.sources.listed import ListedPage


class BlockingOnlyQueue:
    """A lister queue whose page is there only for a caller that waits for it."""

    def __init__(self, events: list[Listed]) -> None:
        self.events = events
        self.waits: list[float] = []

    def get(self, timeout: float) -> Listed:
        self.waits.append(timeout)
        if not self.events:
            raise queue.Empty
        return self.events.pop(0)

    def get_nowait(self) -> Listed:
        raise queue.Empty


class FakeLister:
    def __init__(self, events: list[Listed]) -> None:
        self.out = BlockingOnlyQueue(events)


class Tasks:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, page: Any) -> None:
        self.sent.append(page)


def _coordinator(tmp_path: Path) -> Coordinator:
    options = build_options("http://127.0.0.1:9", tmp_path / "dest", workers=1, sink="null")
    (tmp_path / "dest").mkdir()
    journal = Journal.open(tmp_path / "dest", {"source": "test"})
    return Coordinator(options, make_source(options), journal, None)


def _pages(count: int) -> list[Listed]:
    return [Listed(seq, None if seq == 0 else f"t{seq}",
                   ListedPage((f"f{seq}-a", f"f{seq}-b"), f"t{seq + 1}"))
            for seq in range(count)]


def test_a_starving_dispatch_waits_for_the_first_page_then_takes_what_is_there(
        tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    lister, tasks = FakeLister(_pages(2)), Tasks()
    coordinator._dispatch(lister, tasks, wait=0.05)  # type: ignore[arg-type]
    # Only the first get waits; the page after it is taken without waiting (and here a
    # non-waiting get finds nothing, as when the lister has not listed it yet).
    assert lister.out.waits == [0.05]
    assert [page.seq for page in tasks.sent] == [0]
    assert tasks.sent[0].names == ("f0-a", "f0-b")
    assert coordinator.pages_out == 1
    coordinator.journal.close()


def test_a_busy_dispatch_does_not_wait(tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    lister, tasks = FakeLister(_pages(1)), Tasks()
    coordinator._dispatch(lister, tasks)  # type: ignore[arg-type]
    assert lister.out.waits == [] and tasks.sent == []
    coordinator.journal.close()


def test_a_lost_worker_s_pages_are_sent_again_first_and_its_slots_freed(
        tmp_path: Path) -> None:
    from bulkfetch.models import Page, PageReport, Tick

    coordinator = _coordinator(tmp_path)
    lister, tasks = FakeLister(_pages(3)), Tasks()
    for _ in range(3):
        coordinator._dispatch(lister, tasks, wait=0.05)  # type: ignore[arg-type]
    assert coordinator.pages_out == 3
    coordinator.ticks[7] = Tick(7, files_ok=2, in_flight=5, partial_bytes=9)
    # worker 7 fetched page 0 (its shard not yet durable), then died holding page 1 too;
    # page 2 is with another worker
    coordinator._handle(("pages", 1, []))
    assert coordinator.pages_out == 2
    lost = [Page(0, None, ("f0-a", "f0-b")), Page(1, "t1", ("f1-a", "f1-b"))]
    coordinator._handle(("lost", 7, lost, 1, "ActorDiedError: gone"))
    assert coordinator.pages_out == 1  # page 2 only: page 1's slot is free again
    assert coordinator.pages_reassigned == 2
    assert coordinator.ticks[7].in_flight == 0 and coordinator.ticks[7].files_ok == 2
    again = Tasks()
    coordinator._send_requeued(again)  # type: ignore[arg-type]
    assert [page.seq for page in again.sent] == [0, 1]
    assert coordinator.pages_out == 3 and not coordinator.requeue
    # their reports come back from the others: done once each, and the report says so
    coordinator._handle(("pages", 2, [PageReport(0, 2, 200), PageReport(1, 2, 200)]))
    assert coordinator.journal.totals().pages_done == 2
    assert coordinator.lost_workers == {7: "ActorDiedError: gone"}
    coordinator.journal.close()
