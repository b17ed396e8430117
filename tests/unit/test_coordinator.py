"""The coordinator's dispatch: pages go out in order, up to the limit, and a starving run
waits on the lister rather than on the workers."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

from bulkfetch.api import build_options
from bulkfetch.engine.lister import Listed
from bulkfetch.journal import Journal
from bulkfetch.runners.coordinator import Coordinator
from bulkfetch.sources import make_source
from bulkfetch.sources.base import ListedPage


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
