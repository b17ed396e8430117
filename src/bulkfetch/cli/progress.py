"""Watching a run: a rich live display on terminals, a plain status line in logs, or nothing.

The engine calls `update(progress)` about ten times a second with cumulative counters. An
update only stores the snapshot and one rate sample; the rich display renders on its own
refresh thread (4/s) and the plain display formats a line once per interval.

The counters are the journal's totals: `files_ok` and `bytes` include what earlier runs of the
same journal did (`resumed_files`, `resumed_bytes`). The displays show this run's files and
bytes plus "+N from earlier runs", and no rate counts resumed work. The progress bar and the
ETA count every finished file against `total_files`, which is the whole listing.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO

from rich.filesize import decimal

if TYPE_CHECKING:  # the models load with `get`; `bulkfetch hash` borrows only the rates
    from rich.console import Console, RenderableType

    from bulkfetch.models import InFlight, Progress, Report

__all__ = [
    "Display",
    "PlainDisplay",
    "QuietDisplay",
    "RateWindow",
    "RichDisplay",
    "make_display",
]

WINDOW_S = 5.0  # the "now" rates look back this far
BAR_WIDTH = 40


class Display(Protocol):
    def start(self) -> None: ...
    def update(self, progress: Progress) -> None: ...
    def finish(self, report: Report) -> None:
        """The run ended as `report` says: shown last with its counts and rates, so the
        display's last figures are the summary's."""
        ...
    def stop(self) -> None: ...


def settled(last: Progress | None, report: Report) -> Progress:
    """The Progress a display ends on: `report`'s counts over `report`'s duration."""
    from bulkfetch.models import Progress

    return Progress(
        files_ok=report.files_ok, files_failed=report.files_failed, bytes=report.bytes,
        retries=report.retries, continued_bytes=report.continued_bytes,
        pages_listed=max(report.pages_listed, report.pages), pages_done=report.pages,
        listing_done=report.listing_complete,
        total_files=last.total_files if last is not None else None,
        elapsed_s=report.duration_s, resumed_files=report.resumed_files,
        resumed_bytes=report.resumed_bytes)


def make_display(*, quiet: bool, stream: TextIO | None = None, force_plain: bool = False,
                 interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> Display:
    """Rich on a terminal, a plain line every `interval_s` elsewhere, nothing when quiet."""
    if quiet:
        return QuietDisplay()
    out = stream if stream is not None else sys.stderr
    if force_plain or not is_terminal(out):
        return PlainDisplay(out, interval_s=interval_s, clock=clock)
    from rich.console import Console

    return RichDisplay(Console(file=out), clock=clock)


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class RateWindow:
    """Rates over the last `window_s` seconds of samples; O(1) amortised per sample.

    A sample closer than `min_gap_s` to the one before the newest replaces the newest, so
    the window holds at most about 2 * window_s / min_gap_s samples however often it is fed.
    Safe to read from another thread while one thread adds (deque indexing and append are
    atomic in CPython).
    """

    __slots__ = ("_min_gap", "_samples", "_window")

    def __init__(self, window_s: float = WINDOW_S, min_gap_s: float = 0.05) -> None:
        self._window = window_s
        self._min_gap = min_gap_s
        # (time, files done ok+failed, files ok, bytes)
        self._samples: deque[tuple[float, int, int, int]] = deque()

    def add(self, t: float, done: int, ok: int, nbytes: int) -> None:
        samples = self._samples
        if len(samples) > 2 and t - samples[-2][0] < self._min_gap:
            samples[-1] = (t, done, ok, nbytes)
        else:
            samples.append((t, done, ok, nbytes))
        cutoff = t - self._window
        # keep the newest sample at or before the cutoff as the window's left edge
        while len(samples) > 2 and samples[1][0] <= cutoff:
            samples.popleft()

    def rates(self) -> tuple[float, float, float] | None:
        """(files done/s, files ok/s, bytes/s) across the window, None before two samples."""
        samples = self._samples
        if len(samples) < 2:
            return None
        t0, done0, ok0, b0 = samples[0]
        t1, done1, ok1, b1 = samples[-1]
        dt = t1 - t0
        if dt <= 0:
            return None
        return (done1 - done0) / dt, (ok1 - ok0) / dt, (b1 - b0) / dt


class QuietDisplay:
    """Prints nothing."""

    def start(self) -> None:
        pass

    def update(self, progress: Progress) -> None:
        pass

    def finish(self, report: Report) -> None:
        pass

    def stop(self) -> None:
        pass


# -- figures shared by both displays ------------------------------------------------------


def hms(seconds: float) -> str:
    """00:01:05; hours keep growing past 99."""
    s = max(int(seconds), 0)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _ok_now(p: Progress) -> int:
    """Files this run downloaded."""
    return max(p.files_ok - p.resumed_files, 0)


def _bytes_now(p: Progress) -> int:
    """Bytes this run moved, stored or on their way (big bodies count as they come)."""
    return p.moved_now


def _averages(p: Progress) -> tuple[float, float, float]:
    """(files done/s, files ok/s, bytes/s) over this run."""
    if p.elapsed_s <= 0:
        return 0.0, 0.0, 0.0
    ok = _ok_now(p)
    return (ok + p.files_failed) / p.elapsed_s, ok / p.elapsed_s, _bytes_now(p) / p.elapsed_s


def _finished(p: Progress) -> int:
    """Files settled either way, earlier runs included (what counts against the total)."""
    return p.files_ok + p.files_failed


def _eta_s(p: Progress, done_per_s: float) -> float | None:
    """Seconds left, or None without a total or without a rate to go by."""
    if p.total_files is None:
        return None
    left = p.total_files - _finished(p)
    if left <= 0:
        return 0.0
    return left / done_per_s if done_per_s > 0 else None


def _go_by(now: tuple[float, float, float] | None,
           avg: tuple[float, float, float]) -> float:
    """The files-done rate an ETA is based on: now when it is moving, else the average."""
    return now[0] if now is not None and now[0] > 0 else avg[0]


def _rate(bytes_per_s: float) -> str:
    return decimal(max(int(bytes_per_s), 0)) + "/s"


# Bytes lead the rates when big files are in flight or the average file is this big.
BYTES_LEAD_AT = 1 << 20


def _bytes_lead(p: Progress) -> bool:
    ok = _ok_now(p)
    return bool(p.largest) or (ok > 0 and _bytes_now(p) / ok >= BYTES_LEAD_AT)


class FileRates:
    """Each big file's rate since the display first saw it (or since it restarted from a
    lower byte count, as a retry does). Replaced whole at each update: a reader on another
    thread sees one consistent dict."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int]] = {}

    def update(self, t: float, largest: tuple[InFlight, ...]) -> None:
        seen = self._seen
        fresh = {}
        for name, done, _ in largest:
            first = seen.get(name)
            # the clock starts with the first bytes (a server may think before it sends)
            keep = first is not None and 0 < first[1] <= done
            fresh[name] = first if keep else (t, done)
        self._seen = fresh

    def rate(self, t: float, name: str, done: int) -> float | None:
        first = self._seen.get(name)
        if first is None or t - first[0] < 0.5:
            return None
        return (done - first[1]) / (t - first[0])


def _of_total(done: int, total: int) -> str:
    if total < 0:
        return decimal(done)
    return f"{decimal(done)} / {decimal(total)}"


# -- plain ----------------------------------------------------------------------------------


class PlainDisplay:
    """One status line every `interval_s` seconds (by `clock`), and a final line at stop()."""

    def __init__(self, stream: TextIO | None = None, *, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._interval = interval_s
        self._clock = clock
        self._window = RateWindow()
        self._next: float | None = None
        self._last: Progress | None = None
        self._stopped = False

    def start(self) -> None:
        self._next = self._clock() + self._interval
        self._stopped = False

    def update(self, progress: Progress) -> None:
        t = self._clock()
        self._last = progress
        self._window.add(t, progress.files_ok + progress.files_failed, progress.files_ok,
                         progress.moving_bytes)
        if self._next is None:  # update() before start(): start now
            self._next = t + self._interval
        elif t >= self._next:
            self._write(self.line(progress))
            self._next += self._interval
            if self._next <= t:  # the engine stalled for several intervals: no burst
                self._next = t + self._interval

    def finish(self, report: Report) -> None:
        self._last = settled(self._last, report)
        self.stop()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._last is not None:  # a run that never started (a usage error) has no line
            self._write(self.line(self._last, final=True))

    def line(self, p: Progress, *, final: bool = False) -> str:
        """The status line for `p` with the current "now" rates (no newline)."""
        avg = _averages(p)
        now = None if final else self._window.rates()
        parts = [f"[{hms(p.elapsed_s)}]"]
        if final:
            parts.append("final:")
        files = f"{_ok_now(p):,} files"
        extra = []
        if p.files_failed:
            extra.append(f"{p.files_failed:,} failed")
        if p.resumed_files:
            extra.append(f"+{p.resumed_files:,} from earlier runs")
        if extra:
            files += f" ({', '.join(extra)})"
        parts.append(f"{files} {decimal(_bytes_now(p))} ")
        if final:
            parts.append(f"{avg[1]:,.0f} files/s avg  {_rate(avg[2])} avg ")
        else:
            now_files = f"{now[1]:,.0f}" if now is not None else "-"
            now_bytes = _rate(now[2]) if now is not None else "-"
            parts.append(f"{now_files} files/s now {avg[1]:,.0f} avg  "
                         f"{now_bytes} now {_rate(avg[2])} avg ")
        listing = "listing done" if p.listing_done else "listing"
        parts.append(f"pages {p.pages_listed:,} listed ({listing}) ")
        if not final:
            parts.append(f"in flight {p.in_flight:,} ")
        parts.append(f"retries {p.retries:,}")
        if not final and p.total_files is not None:
            eta = _eta_s(p, _go_by(now, avg))
            parts.append(f" ETA {hms(eta) if eta is not None else '--:--:--'}")
        if not final and p.largest:
            name, done, total = p.largest[0]
            share = f" {100 * done / total:.0f}%" if total > 0 else ""
            more = f" (+{len(p.largest) - 1} more)" if len(p.largest) > 1 else ""
            parts.append(f" largest in flight: {name}{share} {_of_total(done, total)}{more}")
        return " ".join(parts)

    def _write(self, line: str) -> None:
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken log stream must not stop the run
            pass


# -- rich -----------------------------------------------------------------------------------
# rich's live machinery is imported where it is used: logs and --quiet runs never need it,
# and with its tables it was about a third of bulkfetch's import time.


class RichDisplay:
    """A few live lines on a terminal: bar, files and bytes, rates, listing and queue."""

    def __init__(self, console: Console | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 refresh_per_second: float = 4.0) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        from bulkfetch.models import Progress

        self.console = console if console is not None else Console(stderr=True)
        self._clock = clock
        self._window = RateWindow()
        self._files = FileRates()
        self._progress = Progress()
        # No stdout/stderr redirection: worker processes are forked while the display runs,
        # and a child writing through rich's proxy could block on a lock copied held.
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second,
                          transient=False, redirect_stdout=False, redirect_stderr=False)
        self._spinner = Spinner("dots", style="cyan")
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._live.start()

    def update(self, progress: Progress) -> None:
        self._progress = progress  # one reference swap: the refresh thread reads a snapshot
        t = self._clock()
        self._window.add(t, progress.files_ok + progress.files_failed, progress.files_ok,
                         progress.moving_bytes)
        self._files.update(t, progress.largest)

    def finish(self, report: Report) -> None:
        self._progress = settled(self._progress, report)
        self._window = RateWindow()  # (no "now" rate at the end: the average is the rate)
        self.stop()

    def stop(self) -> None:
        if self._started:
            self._started = False
            self._live.stop()  # draws the last state once more and leaves it on screen

    def __rich__(self) -> RenderableType:
        return self.render()

    def render(self) -> RenderableType:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        p = self._progress
        avg = _averages(p)
        now = self._window.rates()

        head = Table.grid(padding=(0, 2))
        head.add_column(width=BAR_WIDTH, no_wrap=True)
        head.add_column(no_wrap=True, overflow="ellipsis")
        label: RenderableType
        if p.total_files is not None:
            total = max(p.total_files, 1)
            done = min(_finished(p), total) if p.total_files else total
            eta = _eta_s(p, _go_by(now, avg))
            label = Text(f"{100 * done / total:.1f}%", style="bold")
            head.add_row(ProgressBar(total=total, completed=done, width=BAR_WIDTH),
                         Text.assemble((f"{_finished(p):,}", "bold"),
                                       f" / {p.total_files:,} files  ",
                                       ("ETA ", "dim"),
                                       (hms(eta) if eta is not None else "--:--:--", "bold"),
                                       ("  elapsed ", "dim"), hms(p.elapsed_s)))
        else:
            label = self._spinner
            head.add_row(ProgressBar(total=None, width=BAR_WIDTH),
                         Text.assemble((f"{_finished(p):,}", "bold"), " files  ",
                                       ("total unknown  elapsed ", "dim"), hms(p.elapsed_s)))

        body = Table.grid(padding=(0, 1))
        body.add_column(justify="right", no_wrap=True, min_width=6)
        body.add_column(no_wrap=True, overflow="ellipsis")
        body.add_row(label, head)
        files = Text.assemble((f"{_ok_now(p):,}", "bold green"), " done · ",
                              (f"{p.files_failed:,}", "bold red" if p.files_failed else "bold"),
                              " failed")
        if p.resumed_files:
            files.append(f" · +{p.resumed_files:,} from earlier runs", style="cyan")
        files.append("   ")
        files.append(decimal(_bytes_now(p)), style="bold")
        body.add_row(Text("files", style="dim"), files)
        files_rate = ((f"{now[1]:,.0f}" if now is not None else "-", "bold"),
                      " files/s now · ", f"{avg[1]:,.0f} avg")
        bytes_rate = ((_rate(now[2]) if now is not None else "-", "bold"), " now · ",
                      f"{_rate(avg[2])} avg")
        if _bytes_lead(p):
            body.add_row(Text("rate", style="dim"),
                         Text.assemble(*bytes_rate, "   ", *files_rate))
        else:
            body.add_row(Text("rate", style="dim"),
                         Text.assemble(*files_rate, "   ", *bytes_rate))
        listing = (Text("listed", style="green") if p.listing_done
                   else Text("listing…", style="cyan"))
        body.add_row(Text("work", style="dim"), Text.assemble(
            "pages ", (f"{p.pages_listed:,}", "bold"), " ", listing,
            f" · {p.pages_done:,} done · in flight ", (f"{p.in_flight:,}", "bold"),
            " · retries ", (f"{p.retries:,}", "bold yellow" if p.retries else "bold")))
        if p.largest:
            body.add_row(Text("big", style="dim"), self._largest(p.largest))
        return body

    def _largest(self, largest: tuple[InFlight, ...]) -> RenderableType:
        """A bar per big file in flight, like a container pull shows its layers."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        t = self._clock()
        rows = Table.grid(padding=(0, 1))
        rows.add_column(no_wrap=True, overflow="ellipsis", max_width=32)
        rows.add_column(width=24, no_wrap=True)
        rows.add_column(no_wrap=True)
        for name, done, total in largest:
            rate = self._files.rate(t, name, done)
            eta = (total - done) / rate if rate and total > 0 else None
            rows.add_row(
                Text(name, style="bold"),
                ProgressBar(total=total if total > 0 else None, completed=done, width=24),
                Text.assemble(_of_total(done, total), "  ",
                              (_rate(rate) if rate is not None else "-", "bold"),
                              ("  ETA ", "dim"), hms(eta) if eta is not None else "--:--:--"))
        return rows
