"""What each worker holds, and its lease: the bookkeeping both pools share.

A pool sends a page to one worker and keeps it in that worker's Holding until a durable
report covers it. Anything the worker says renews its lease (a healthy worker ticks every
100 ms; a Ray actor answers about twice a second). A worker silent past the lease is
stopped, and what it holds goes to the others (runners/coordinator.py: "lost").

The pool's own silence is not the worker's: when the coordinator did not look for longer
than a lease allows (the whole run suspended with Ctrl-Z, the machine asleep), every lease
starts again instead of lapsing at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bulkfetch.models import Page

Message = tuple[Any, ...]


@dataclass(kw_only=True)
class Holding:
    held: dict[int, Page] = field(default_factory=dict)  # sent, no durable report yet, by seq
    unfetched: int = 0  # of those, not fetched yet (the coordinator's pages out)
    heard: float = field(default_factory=time.monotonic)  # its last message: the lease's start
    lapsed: float | None = None  # when its lease lapsed and it was told to stop

    def give(self, page: Page) -> None:
        self.held[page.seq] = page
        self.unfetched += 1

    def hear(self, messages: Iterable[Message], now: float) -> bool:
        """Take in what the worker said (renewing its lease); True if it said it exits."""
        self.heard = now
        exited = False
        for message in messages:
            if message[0] == "pages":
                self.unfetched -= message[1]
                for report in message[2]:
                    self.held.pop(report.seq, None)
            elif message[0] == "exit":
                exited = True
        return exited

    def surrender(self, worker: int, why: str) -> Message:
        """("lost", worker, its pages in order, how many unfetched, why, lease lapsed): what
        the coordinator sends to the others. The holding is empty after."""
        pages = sorted(self.held.values(), key=lambda page: page.seq)
        lost = ("lost", worker, pages, self.unfetched, why, self.lapsed is not None)
        self.held, self.unfetched = {}, 0
        return lost


class LeaseClock:
    """When leases lapse, discounting the pool's own silence."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.looked = time.monotonic()

    def look(self, holdings: Iterable[Holding]) -> float:
        """Now, for a pool about to check its workers' leases. After a gap longer than half
        a lease since the last look, every lease is renewed: the pool did not run, so no
        worker could be heard."""
        now = time.monotonic()
        if now - self.looked > self.lease_s / 2:
            for holding in holdings:
                holding.heard = max(holding.heard, now)
                if holding.lapsed is not None:
                    holding.lapsed = max(holding.lapsed, now)
        self.looked = now
        return now

    def silent(self, holding: Holding, now: float) -> bool:
        """Its lease lapsed just now: silent for longer than the lease."""
        return holding.lapsed is None and now - holding.heard > self.lease_s

    def unanswered(self, holding: Holding, now: float) -> bool:
        """Told to stop a lease ago, and not known to be gone: give its pages away anyway
        (a node cut off; the index and the temporaries fence what it writes later)."""
        return holding.lapsed is not None and now - holding.lapsed > self.lease_s

    def why(self) -> str:
        return f"silent for {self.lease_s:g} s (--lease): frozen, or its node cut off"
