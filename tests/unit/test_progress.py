"""Progress displays: plain status lines on a fake clock, rich rendering, quiet, the rate window."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console

from bulkfetch.cli.progress import (
    PlainDisplay,
    QuietDisplay,
    RateWindow,
    RichDisplay,
    hms,
    make_display,
)
from bulkfetch.models import Progress

ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-_])")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeTTY(StringIO):
    def isatty(self) -> bool:
        return True


def steady(t: float, **kw: object) -> Progress:
    """1,000 files/s of 100 bytes, elapsed = t."""
    return Progress(files_ok=int(1000 * t), bytes=100 * int(1000 * t), elapsed_s=t,
                    **kw)  # type: ignore[arg-type]


def drive(display: PlainDisplay | RichDisplay, clock: FakeClock, until: float,
          make=steady, step: float = 0.1, **kw: object) -> None:
    """Update ~10x a second from clock.t up to `until` (integer ticks, no float drift)."""
    start = round(clock.t / step)
    for i in range(start + 1, round(until / step) + 1):
        clock.t = i * step
        display.update(make(clock.t, **kw))


# -- plain ----------------------------------------------------------------------------------


def test_plain_emits_one_line_per_interval_with_the_right_numbers() -> None:
    clock, out = FakeClock(), StringIO()
    display = PlainDisplay(out, interval_s=5.0, clock=clock)
    display.start()
    drive(display, clock, 4.9)
    assert out.getvalue() == ""
    progress = Progress(files_ok=1_234_567, files_failed=12, bytes=118_000_000, retries=40,
                        in_flight=128, pages_listed=1_235, elapsed_s=65.0)
    clock.t = 5.0
    display.update(progress)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("[00:01:05] 1,234,567 files (12 failed) 118.0 MB  ")
    assert "pages 1,235 listed (listing)" in line
    assert "in flight 128" in line
    assert "retries 40" in line

    drive(display, clock, 12.0)
    assert len(out.getvalue().splitlines()) == 2  # at t=5 and t=10
    display.stop()
    display.stop()  # idempotent
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[-1].startswith("[00:00:12] final: 12,000 files 1.2 MB  1,000 files/s avg")


def test_plain_does_not_burst_after_a_stall() -> None:
    clock, out = FakeClock(), StringIO()
    display = PlainDisplay(out, interval_s=5.0, clock=clock)
    display.start()
    clock.t = 31.0
    display.update(steady(31.0))
    assert len(out.getvalue().splitlines()) == 1
    drive(display, clock, 35.9)
    assert len(out.getvalue().splitlines()) == 1
    drive(display, clock, 36.0)
    assert len(out.getvalue().splitlines()) == 2


def test_plain_line_shows_eta_only_with_a_total() -> None:
    for total, expect in ((None, False), (20_000, True)):
        clock, out = FakeClock(), StringIO()
        display = PlainDisplay(out, interval_s=5.0, clock=clock)
        display.start()
        drive(display, clock, 10.0, total_files=total)
        lines = out.getvalue().splitlines()
        assert len(lines) == 2
        assert all(("ETA" in line) is expect for line in lines)
    # 10,000 of 20,000 done at 1,000 files/s: 10 s left
    assert lines[-1].endswith("ETA 00:00:10")


def test_now_rate_and_average_differ_when_the_rate_changes() -> None:
    def speeding_up(t: float) -> Progress:
        # 1,000 files/s for 10 s, then 10,000 files/s (100 bytes each)
        files = round(1000 * t) if t <= 10 else 10_000 + round(10_000 * (t - 10))
        return Progress(files_ok=files, bytes=100 * files, elapsed_s=t, total_files=200_000)

    clock, out = FakeClock(), StringIO()
    display = PlainDisplay(out, interval_s=5.0, clock=clock)
    display.start()
    drive(display, clock, 20.0, make=speeding_up)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    # t=10: both 1,000; t=20: the last 5 s ran at 10,000, the whole run averaged 5,500
    assert "1,000 files/s now 1,000 avg" in lines[1]
    assert "10,000 files/s now 5,500 avg  1.0 MB/s now 550.0 kB/s avg" in lines[3]
    # ETA goes by the current rate: 90,000 left at 10,000/s
    assert lines[3].endswith("ETA 00:00:09")


def test_resumed_files_are_shown_but_not_in_the_rates() -> None:
    def resumed(t: float) -> Progress:
        # the counters include what earlier runs did: 1,000,000 files, 100 MB
        files = 1_000_000 + round(1000 * t)
        return Progress(files_ok=files, bytes=100 * files, elapsed_s=t, total_files=1_010_000,
                        resumed_files=1_000_000, resumed_bytes=100_000_000)

    clock, out = FakeClock(), StringIO()
    display = PlainDisplay(out, interval_s=5.0, clock=clock)
    display.start()
    drive(display, clock, 5.0, make=resumed)
    (line,) = out.getvalue().splitlines()
    assert "] 5,000 files (+1,000,000 from earlier runs) 500.0 kB  " in line
    assert "1,000 files/s now 1,000 avg  100.0 kB/s now 100.0 kB/s avg" in line
    assert line.endswith("ETA 00:00:05")  # 5,000 left of the total, resumed count as done


def test_plain_writes_nothing_when_the_run_never_started() -> None:
    """A usage error found after start() must not be preceded by a 'final: 0 files' line."""
    out = StringIO()
    display = PlainDisplay(out, clock=FakeClock())
    display.start()
    display.stop()
    assert out.getvalue() == ""


def test_plain_survives_a_closed_stream() -> None:
    out = StringIO()
    clock = FakeClock()
    display = PlainDisplay(out, interval_s=1.0, clock=clock)
    display.start()
    out.close()
    drive(display, clock, 2.0)
    display.stop()


# -- quiet and selection --------------------------------------------------------------------


def test_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    out = FakeTTY()
    for stream in (out, None):
        display = make_display(quiet=True, stream=stream, interval_s=0.0)
        assert isinstance(display, QuietDisplay)
        display.start()
        for i in range(50):
            display.update(steady(i * 0.1, total_files=10))
        display.stop()
    assert out.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_make_display_picks_by_stream() -> None:
    assert isinstance(make_display(quiet=False, stream=StringIO()), PlainDisplay)
    assert isinstance(make_display(quiet=False, stream=FakeTTY(), force_plain=True),
                      PlainDisplay)
    assert isinstance(make_display(quiet=False, stream=FakeTTY()), RichDisplay)
    closed = StringIO()
    closed.close()
    assert isinstance(make_display(quiet=False, stream=closed), PlainDisplay)


def test_make_display_plain_uses_the_clock_and_interval() -> None:
    clock, out = FakeClock(), StringIO()
    display = make_display(quiet=False, stream=out, interval_s=2.0, clock=clock)
    display.start()
    drive(display, clock, 6.0)  # type: ignore[arg-type]
    assert len(out.getvalue().splitlines()) == 3


# -- rich -----------------------------------------------------------------------------------


def rich_output(progress: Progress, *, before: float = 5.0) -> str:
    console = Console(file=StringIO(), force_terminal=True, width=120)
    clock = FakeClock()
    display = RichDisplay(console, clock=clock)
    display.start()
    drive(display, clock, before)
    clock.t += 0.1
    display.update(progress)
    display.stop()
    return ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]


def test_rich_display_renders_key_figures() -> None:
    text = rich_output(Progress(files_ok=1_239_567, files_failed=12, bytes=118_500_000,
                                retries=40, in_flight=128, pages_listed=1_235, pages_done=1_200,
                                total_files=2_900_000, elapsed_s=65.0, resumed_files=5_000,
                                resumed_bytes=500_000))
    for figure in ("1,234,567 done", "12 failed", "+5,000 from earlier runs", "118.0 MB",
                   "1,239,579 / 2,900,000 files", "42.7%", "ETA", "elapsed 00:01:05",
                   "files/s now", "MB/s now", "pages 1,235 listing…", "1,200 done",
                   "in flight 128", "retries 40"):
        assert figure in text, figure
    assert "total unknown" not in text
    assert len([line for line in text.splitlines() if line.strip()]) <= 6  # compact


def test_rich_display_without_a_total_has_no_eta() -> None:
    text = rich_output(Progress(files_ok=50, bytes=5_000, pages_listed=3, listing_done=True,
                                elapsed_s=2.0))
    assert "total unknown" in text
    assert "ETA" not in text
    assert "%" not in text
    assert "pages 3 listed" in text


def test_rich_now_rate_follows_the_window() -> None:
    console = Console(file=StringIO(), width=120)
    clock = FakeClock()
    display = RichDisplay(console, clock=clock)
    drive(display, clock, 10.0)  # not started: update renders nothing
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]
    console.print(display.render())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "1,000 files/s now · 1,000 avg" in text
    assert "10,000 / " not in text and "10,000 done" in text


# -- helpers --------------------------------------------------------------------------------


def test_rate_window_stays_bounded_and_measures_the_last_seconds() -> None:
    window = RateWindow(window_s=5.0, min_gap_s=0.05)
    assert window.rates() is None
    window.add(0.0, 0, 0, 0)
    assert window.rates() is None
    files = 0
    for i in range(1, 100_001):  # 1,000 updates a second for 100 s
        t = i / 1000
        files += 2 if t <= 50 else 20
        window.add(t, files, files, files * 100)
        assert len(window._samples) <= 2 * 5.0 / 0.05 + 3
    rates = window.rates()
    assert rates is not None
    done, ok, nbytes = rates
    assert done == ok == pytest.approx(20_000, rel=0.02)
    assert nbytes == pytest.approx(2_000_000, rel=0.02)


def test_hms() -> None:
    assert hms(0) == "00:00:00"
    assert hms(65.9) == "00:01:05"
    assert hms(360_000) == "100:00:00"
    assert hms(-3) == "00:00:00"


# -- big files in flight ----------------------------------------------------------------------


def big_progress(t: float) -> Progress:
    """Two big files in flight, one growing 10 MB/s (1 GB in all), one of unknown size."""
    done = int(10_000_000 * t)
    return Progress(files_ok=3, bytes=3_000_000_000, elapsed_s=t, partial_bytes=done + 5_000,
                    largest=(("layer-a.tar", done, 1_000_000_000), ("stream.bin", 5_000, -1)))


def test_rich_shows_a_bar_per_big_file_and_bytes_lead_the_rates() -> None:
    console = Console(file=StringIO(), width=140)
    clock = FakeClock()
    display = RichDisplay(console, clock=clock)
    drive(display, clock, 10.0, make=lambda t: big_progress(t))
    console.print(display.render())
    text = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    rate_line = next(line for line in text.splitlines() if "rate" in line)
    assert rate_line.index("MB/s now") < rate_line.index("files/s now")  # bytes first
    assert "10.0 MB/s now" in rate_line  # partial bytes move the rate
    layer = next(line for line in text.splitlines() if "layer-a.tar" in line)
    assert "100.0 MB / 1.0 GB" in layer and "10.0 MB/s" in layer and "ETA 00:01:30" in layer
    assert "5.0 kB" in next(line for line in text.splitlines() if "stream.bin" in line)


def test_plain_names_the_largest_file_in_flight() -> None:
    out = StringIO()
    clock = FakeClock()
    display = PlainDisplay(out, interval_s=5.0, clock=clock)
    display.start()
    drive(display, clock, 5.0, make=lambda t: big_progress(t))
    line = out.getvalue().splitlines()[0]
    assert "largest in flight: layer-a.tar 5% 50.0 MB / 1.0 GB (+1 more)" in line


def test_small_files_keep_files_per_second_first() -> None:
    text = rich_output(steady(10.0))
    rate_line = next(line for line in text.splitlines() if "rate" in line)
    assert rate_line.index("files/s now") < rate_line.index("B/s now")
    assert "big" not in text
