"""What `pull` shows: a bar per layer and one for the whole pull, as `docker pull` does, or
plain lines when stderr is not a terminal.

The engine reports the big bodies in flight ((name, bytes so far, size), Progress.largest);
a layer not among them is waiting, or done once its blob is in the layout.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bulkfetch.cli.progress import QuietDisplay, is_terminal
from bulkfetch.models import Progress


def size(n: float) -> str:
    from rich.filesize import decimal

    return decimal(max(int(n), 0))


@dataclass
class Row:
    name: str  # blobs/ALG/HEX
    label: str  # the 12-digit short digest
    size: int
    state: str  # "waiting" | "downloading" | "done" | "exists" | "cached"
    done: int = 0


def _finished(dest: Path, row: Row) -> bool:
    try:
        return os.stat(dest / row.name).st_size == row.size
    except OSError:
        return False


class LayerBoard:
    """Per-layer state from the engine's Progress; both displays draw it."""

    def __init__(self, dest: Path, rows: list[Row]) -> None:
        self.dest = dest
        self.rows = rows
        self.fetching = [row for row in rows if row.state == "waiting"]
        self.total = sum(row.size for row in self.fetching)

    def update(self, progress: Progress) -> list[Row]:
        """Move the rows on; the rows that changed state."""
        moving = {name: done for name, done, _ in progress.largest}
        changed = []
        for row in self.fetching:
            if row.state == "done":
                continue
            if row.name in moving:
                row.done = moving[row.name]
                if row.state != "downloading":
                    row.state = "downloading"
                    changed.append(row)
            elif _finished(self.dest, row):
                row.state, row.done = "done", row.size
                changed.append(row)
        return changed

    @property
    def bytes_done(self) -> int:
        return sum(row.done for row in self.fetching)


class PlainPullDisplay:
    def __init__(self, board: LayerBoard, out: TextIO, interval_s: float = 5.0) -> None:
        self.board, self.out, self.interval_s = board, out, interval_s
        self.started = self.last = time.monotonic()

    def start(self) -> None:
        for row in self.board.rows:
            if row.state in ("exists", "cached"):
                where = "already in DEST" if row.state == "exists" else "from the cache"
                self._line(f"{row.label}: {where} ({size(row.size)})")

    def _line(self, text: str) -> None:
        self.out.write(f"bulkfetch: {text}\n")
        self.out.flush()

    def update(self, progress: Progress) -> None:
        for row in self.board.update(progress):
            if row.state == "done":
                self._line(f"{row.label}: done ({size(row.size)})")
            else:
                self._line(f"{row.label}: downloading ({size(row.size)})")
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.last = now
            done, total = self.board.bytes_done, self.board.total
            rate = done / max(now - self.started, 1e-9)
            self._line(f"{size(done)} of {size(total)} "
                       f"({100 * done / max(total, 1):.0f}%), {size(rate)}/s")

    def stop(self) -> None:
        self.board.update(Progress())


class RichPullDisplay:
    def __init__(self, board: LayerBoard, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import (
            Progress as Bars,
        )

        self.board = board
        self.bars = Bars(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                         TransferSpeedColumn(), TimeRemainingColumn(),
                         console=Console(file=out), refresh_per_second=4)
        self.tasks: dict[str, Any] = {}
        for row in board.rows:
            done = row.size if row.state != "waiting" else 0
            self.tasks[row.name] = self.bars.add_task(self._describe(row), total=row.size,
                                                      completed=done)
        self.overall = self.bars.add_task("[bold]total", total=max(board.total, 1))

    @staticmethod
    def _describe(row: Row) -> str:
        words = {"waiting": "waiting", "downloading": "downloading", "done": "pull complete",
                 "exists": "already exists", "cached": "from cache"}
        return f"{row.label} {words[row.state]:<14}"

    def start(self) -> None:
        self.bars.start()

    def update(self, progress: Progress) -> None:
        self.board.update(progress)
        for row in self.board.fetching:
            self.bars.update(self.tasks[row.name], completed=row.done,
                             description=self._describe(row))
        self.bars.update(self.overall, completed=self.board.bytes_done)

    def stop(self) -> None:
        self.update(Progress())
        self.bars.stop()


def make_pull_display(board: LayerBoard, *, quiet: bool, plain: bool,
                      out: TextIO | None = None) -> Any:
    stream = out if out is not None else sys.stderr
    if quiet:
        return QuietDisplay()
    if plain or not is_terminal(stream):
        return PlainPullDisplay(board, stream)
    return RichPullDisplay(board, stream)
