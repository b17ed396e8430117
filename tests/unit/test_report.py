"""The end-of-run summary and the JSON report: caps, atomic writes, hostile names."""

from __future__ import annotations

import json
import os
import re
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

import bulkfetch
from bulkfetch.cli.report import (
    print_summary,
    report_dict,
    safe_name,
    safe_text,
    summary_table,
    write_report,
)
from bulkfetch.models import Failure, Report
from bulkfetch.util import atomic

HOSTILE = [
    "\x1b]0;pwned\x07",  # set the terminal title
    "\x1b[2J\x1b[H",  # clear the screen
    "evil\r\x1b[1Aover",  # rewrite the line above
    "bad-\udcff-utf8",  # a lone surrogate (undecodable byte via surrogateescape)
    "\u202egnp.exe",  # right-to-left override
    "[bold red]markup[/bold red] :smile:",
    "nul\x00byte",
    "x" * 10_000,
]


def render(report: Report, *, terminal: bool = False) -> str:
    console = Console(file=StringIO(), force_terminal=terminal, width=120)
    print_summary(report, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def failed_report(n_failures: int, files_failed: int | None = None, **kw: object) -> Report:
    failures = [Failure(f"f{i:05d}", "HTTP 404", 1) for i in range(n_failures)]
    return Report(source="http://127.0.0.1:8000", dest="/tmp/d", files_ok=100,
                  files_failed=n_failures if files_failed is None else files_failed,
                  listing_complete=True, failures=failures, **kw)  # type: ignore[arg-type]


# -- report_dict ----------------------------------------------------------------------------


def test_report_dict_caps_failures_and_counts_them_all() -> None:
    data = report_dict(failed_report(1_500, files_failed=5_000))
    assert data["failures_total"] == 5_000
    assert data["failures_truncated"] is True
    failures = data["failures"]
    assert isinstance(failures, list) and len(failures) == 1_000
    assert failures[0] == {"name": "f00000", "reason": "HTTP 404", "attempts": 1, "url": None}
    assert failures[-1]["name"] == "f00999"

    small = report_dict(failed_report(3))
    assert small["failures_total"] == 3
    assert small["failures_truncated"] is False
    assert len(small["failures"]) == 3  # type: ignore[arg-type]


def test_report_dict_fields() -> None:
    report = Report(source="http://h/", dest="/d", files_ok=1_007, bytes=100_700, retries=3,
                    pages=2, duration_s=2.0, listing_complete=True, resumed_files=7,
                    resumed_bytes=700,
                    started_at=1_700_000_000.0, finished_at=1_700_000_002.5,
                    options={"limits": {"workers": 4}, "dest": Path("/d"), "t": (1, 2),
                             "nan": float("nan"), 3: "int key"})
    data = report_dict(report)
    assert data["bulkfetch_version"] == bulkfetch.__version__
    assert data["exit_code"] == 0
    assert data["files_per_s"] == 500.0
    assert data["bytes_per_s"] == 50_000.0
    assert data["duration_s"] == 2.0
    assert data["resumed_files"] == 7
    assert data["resumed_bytes"] == 700
    assert data["files_ok"] == 1_007
    assert data["listing_complete"] is True
    assert data["interrupted"] is False
    assert data["error"] is None
    assert data["started"] == "2023-11-14T22:13:20.000+00:00"
    assert data["finished"] == "2023-11-14T22:13:22.500+00:00"
    assert data["options"] == {"limits": {"workers": 4}, "dest": "/d", "t": [1, 2],
                               "nan": None, "3": "int key"}
    json.dumps(data, allow_nan=False)  # strictly JSON


@pytest.mark.parametrize(
    ("kw", "code"),
    [({}, 0), ({"files_failed": 1}, 1), ({"listing_complete": False}, 1),
     ({"error": "disk full"}, 1), ({"interrupted": True, "files_failed": 1}, 130)],
)
def test_report_dict_exit_code(kw: dict[str, object], code: int) -> None:
    report = Report(source="s", dest="d", listing_complete=True)
    for key, value in kw.items():
        setattr(report, key, value)
    assert report_dict(report)["exit_code"] == code


# -- write_report ---------------------------------------------------------------------------


def test_write_report_is_valid_json_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")
    write_report(failed_report(2_000), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    text = path.read_text(encoding="ascii")
    assert text.startswith('{\n  "bulkfetch_version"')  # indent 2
    data = json.loads(text)
    assert data["failures_total"] == 2_000
    assert len(data["failures"]) == 1_000
    assert data["exit_code"] == 1


def test_write_report_failure_keeps_the_old_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_report(failed_report(1), path)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_write_report_hostile_names_round_trip_as_ascii(tmp_path: Path) -> None:
    report = Report(source="s", dest="d", files_failed=len(HOSTILE), listing_complete=True,
                    error="server said \x1b[31m\udcfe",
                    failures=[Failure(name, f"reason {name}", 2) for name in HOSTILE])
    path = tmp_path / "r.json"
    write_report(report, path)
    raw = path.read_bytes()
    assert raw.isascii()
    assert b"\x1b" not in raw and b"\x00" not in raw
    data = json.loads(raw)
    assert [f["name"] for f in data["failures"]] == HOSTILE
    assert data["error"] == "server said \x1b[31m\udcfe"
    assert os.stat(path).st_mode & 0o777 == 0o644


# -- the terminal summary -------------------------------------------------------------------


@pytest.mark.parametrize("terminal", [False, True])
def test_summary_escapes_hostile_names(terminal: bool) -> None:
    report = Report(source="http://h/\x1b[2J", dest="/d\x07", files_failed=len(HOSTILE),
                    error="boom \x1b]8;;http://x\x07", listing_complete=True,
                    failures=[Failure(name, f"HTTP 500 \x1b[5m{name[:20]}", 3)
                              for name in HOSTILE],
                    failures_file="/d\x07/.bulkfetch/failures.jsonl")
    out = render(report, terminal=terminal)
    # no terminal control from the data: no BEL, no OSC, no NUL, no CR, no surrogate,
    # no bidi override; ESC only as rich's own colour codes (SGR) on a terminal
    for bad in ("\x07", "\x1b]", "\x00", "\r", "\udcff", "\u202e", "\x1b[2J", "\x1b[1A",
                "\x1b[H", "\x1b[5m"):
        assert bad not in out, repr(bad)
    assert not re.search(r"\x1b(?!\[[0-9;]*m)", out)  # every ESC starts a colour code
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert (plain == out) is not terminal
    for visible in (r"'\x1b]0;pwned\x07'", r"'\x1b[2J\x1b[H'", r"\udcff", r"\u202e",
                    r"'nul\x00byte'", "[bold red]markup[/bold red] :smile:",
                    "(10,000 characters)", r"HTTP 500 \x1b[5m", r"boom \x1b]8;;http://x\x07",
                    r"http://h/\x1b[2J", r"/d\x07/.bulkfetch/failures.jsonl"):
        assert visible in plain, visible
    assert "x" * 201 not in plain  # the long name is cut


def test_safe_name_and_safe_text() -> None:
    assert safe_name("plain/name.txt") == "plain/name.txt"
    assert safe_name("it's fine") == "it's fine"
    assert safe_name("a\tb") == r"'a\tb'"
    assert safe_name(r"looks\x1bescaped") == r"'looks\\x1bescaped'"  # not mistaken for ESC
    assert safe_name("\udcff") == r"'\udcff'"
    assert safe_name("\u00a0") == r"'\xa0'"  # invisible no-break space shown
    assert safe_text("HTTP 404 for 'x'") == "HTTP 404 for 'x'"
    assert safe_text("bell\x07here") == r"bell\x07here"
    assert safe_text("y" * 500, limit=10) == "y" * 10 + "… (500 characters)"


def test_summary_lists_the_first_failures_and_how_many_more() -> None:
    out = render(failed_report(25, files_failed=3_000))
    assert "f00000" in out and "f00009" in out
    assert "f00010" not in out
    assert "first 10 of 3,000" in out
    assert "2,990 more in the report/journal" in out
    assert "HTTP 404" in out
    assert "Exit status 1" in out and "3,000 files failed" in out and "--retry-failed" in out


def test_summary_names_the_list_of_all_failures() -> None:
    where = "/tmp/d/.bulkfetch/failures.jsonl"
    out = render(failed_report(25, files_failed=3_000, failures_file=where))
    plain = " ".join(out.split())  # the console wraps long lines
    assert f"2,990 more; all 3,000, one JSON object a line (url, name, reason, attempts, " \
           f"status): {where}" in plain
    assert "more in the report/journal" not in plain
    few = " ".join(render(failed_report(2, failures_file=where)).split())
    assert "all 2, one JSON object a line" in few and "more;" not in few
    assert "JSON object a line" not in render(failed_report(2))  # no list written


def test_report_dict_names_the_list_and_each_failures_url() -> None:
    report = Report(source="s", dest="/d", files_failed=2, listing_complete=True,
                    failures=[Failure("a", "HTTP 404", 1, "http://h/get/a"),
                              Failure("b", "unsafe name: '..' component", 0)],
                    failures_file="/r.failures.jsonl")
    data = report_dict(report)
    assert data["failures_file"] == "/r.failures.jsonl"
    assert data["failures"] == [
        {"name": "a", "reason": "HTTP 404", "attempts": 1, "url": "http://h/get/a"},
        {"name": "b", "reason": "unsafe name: '..' component", "attempts": 0, "url": None}]
    assert report_dict(failed_report(0))["failures_file"] is None


@pytest.mark.parametrize(
    ("kw", "expect"),
    [
        ({}, "Exit status 0: all files downloaded."),
        ({"interrupted": True}, "Exit status 130: interrupted. Rerun the same command to resume."),
        ({"listing_complete": False}, "listing did not finish. Rerun the same command to resume"),
        ({"error": "disk full"}, "stopped on an error: disk full. Rerun the same command"),
    ],
)
def test_summary_says_what_the_exit_status_means(kw: dict[str, object], expect: str) -> None:
    report = Report(source="s", dest="d", files_ok=50, bytes=1_000, duration_s=125.0,
                    listing_complete=True, resumed_files=40)
    for key, value in kw.items():
        setattr(report, key, value)
    out = render(report)
    assert expect in " ".join(out.split())
    assert "more in the report" not in out
    assert "50 downloaded (40 of them by earlier runs)" in out


@pytest.mark.parametrize(
    ("attempts", "total", "expect"),
    [
        ([1, 9], 2, "2 files failed; rerun the same command with --retry-failed to try them "
                    "again."),
        ([0, 0], 2, "2 files failed, all refused before any request for what the listing "
                    "says of them (see the reasons): a retry would refuse them again."),
        ([0, 3], 2, "2 files failed; 1 of them refused before any request for what the "
                    "listing says of them, which a retry would refuse again. Rerun the same "
                    "command with --retry-failed to try the others again."),
        ([4], 1, "1 file failed; rerun the same command with --retry-failed to try it "
                 "again."),
        # the report holds only the first failures: what the rest are is not known
        ([0, 0], 5000, "5,000 files failed; rerun the same command with --retry-failed"),
    ],
)
def test_retry_failed_is_advised_only_where_a_retry_can_help(attempts: list[int], total: int,
                                                              expect: str) -> None:
    report = Report(source="s", dest="d", files_failed=total, listing_complete=True,
                    failures=[Failure(f"n{i}", "unsafe name: absolute path" if tries == 0
                                      else "HTTP 500", tries)
                              for i, tries in enumerate(attempts)])
    assert expect in " ".join(render(report).split())


def test_summary_table_figures() -> None:
    report = Report(source="http://h/", dest="/d", files_ok=1_234_567, files_failed=3,
                    bytes=118_000_000, retries=9, pages=1_235, duration_s=3_725.0,
                    listing_complete=True)
    console = Console(file=StringIO(), width=120)
    console.print(summary_table(report))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    for figure in ("1,234,567 downloaded", "3 failed", "118.0 MB", "01:02:05", "331 files/s",
                   "31.7 kB/s", "1,235 done · listing complete", "incomplete (exit status 1)"):
        assert figure in out, figure


def test_bytes_partial_files_already_held_are_said_and_left_out_of_the_rate() -> None:
    report = Report(source="http://h/", dest="/d", files_ok=2, bytes=300_000_000,
                    continued_bytes=100_000_000, duration_s=10.0, listing_complete=True)
    assert report.bytes_per_s == 20_000_000
    console = Console(file=StringIO(), width=160)
    console.print(summary_table(report))
    out = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "300.0 MB (300,000,000 bytes) (100.0 MB of it already in partial files" in out
    assert "20.0 MB/s (this run)" in out
    assert report_dict(report)["continued_bytes"] == 100_000_000


@pytest.mark.parametrize(("kw", "said"), [
    ({"interrupted": True}, "1,262 more stored, of pages not finished"),
    ({"interrupted": True, "pages_reassigned": 1}, None),  # a lost worker's files count twice
    ({"listing_complete": True}, None),  # complete: every stored file is journaled
])
def test_a_stopped_run_says_what_it_stored_beyond_its_finished_pages(
        kw: dict[str, object], said: str | None) -> None:
    """The live display counts every stored file; the journal a page's once it is done.
    A stopped run's summary said 85,000 downloaded under a final line of 86,262 files."""
    report = Report(source="http://h/", dest="/d", files_ok=90_000, resumed_files=5_000,
                    workers=[{"worker": 0, "files_ok": 43_000},
                             {"worker": 1, "files_ok": 43_262}], **kw)  # type: ignore[arg-type]
    console = Console(file=StringIO(), width=200)
    console.print(summary_table(report))
    out = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "90,000 downloaded (5,000 of them by earlier runs)" in out
    assert (said in out) if said else ("more stored" not in out), out
