"""The end of a run: a summary on the terminal and a JSON report on disk.

Names, reasons and errors may come from a hostile server. On the terminal they are shown
escaped (control, format and surrogate characters as Python escapes, never raw) and cut to a
sane length; they are always passed to rich as Text, never as markup. In JSON they are kept
exactly, written with ensure_ascii so lone surrogates and control characters become \\u
escapes and the file is plain ASCII.

Secrets in URLs (user-info, signed query strings) are masked in both (bulkfetch.util.redact): the
source and the options hold the URL as typed, errors and reasons may quote one.
"""

from __future__ import annotations

import json
import math
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.filesize import decimal

from bulkfetch.models import Report
from bulkfetch.util.atomic import write_durably
from bulkfetch.util.redact import USAGE_TEXT_LIMIT, redact_text, redact_value, safe_name, safe_text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "MAX_REPORT_FAILURES",
    "SUMMARY_FAILURES",
    "print_summary",
    "report_dict",
    "summary_table",
    "write_report",
]

MAX_REPORT_FAILURES = 1000  # failures listed in the JSON report
SUMMARY_FAILURES = 10  # failures listed on the terminal


def _stored_of_unfinished_pages(report: Report, syncing: bool) -> int:
    """Files a stopped run stored whose pages were not done: the live display counted
    them, the journal (files_ok) does not until their whole page is."""
    if report.exit_code == 0 or syncing or report.pages_reassigned:
        return 0  # (a lost worker's files count twice in the workers' summaries)
    stored = sum(count for worker in report.workers
                 if isinstance(count := worker.get("files_ok"), int))
    return max(0, stored - (report.files_ok - report.resumed_files))


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s"
    s = int(seconds)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d} ({seconds:,.0f} s)"


def _failures_total(report: Report) -> int:
    return max(report.files_failed, len(report.failures))


def _status(report: Report) -> tuple[str, str]:
    """(one line saying what the exit status means, style)."""
    code = report.exit_code
    if code == 0:
        return "Exit status 0: all files downloaded.", "bold green"
    if code == 130:
        return ("Exit status 130: interrupted. Rerun the same command to resume.",
                "bold yellow")
    if code == 2:  # what to change is in the message; the same command would fail again
        return (f"Exit status 2: {safe_text(report.error or 'usage error', USAGE_TEXT_LIMIT)}.",
                "bold red")
    parts = ["Exit status 1:"]
    if report.error is not None:
        parts.append(f"the run stopped on an error: {safe_text(report.error)}.")
    elif not report.listing_complete:
        parts.append("listing did not finish.")
    if report.error is not None or not report.listing_complete:
        parts.append("Rerun the same command to resume.")
    if report.files_failed:
        parts.append(_failed_advice(report))
    return " ".join(parts), "bold red"


def _failed_advice(report: Report) -> str:
    """How many files failed and whether --retry-failed can help: a file refused before any
    request (an unsafe name, no usable URL: what the listing says of it) is refused the same
    way every time."""
    failed = report.files_failed
    files = f"{failed:,} file{'' if failed == 1 else 's'}"
    retry = ("rerun the same command with --retry-failed to try "
             f"{'it' if failed == 1 else 'them'} again.")
    if len(report.failures) != failed:  # the report holds the first 1,000 only
        return f"{files} failed; {retry}"
    refused = sum(failure.refused for failure in report.failures)
    if refused == failed:
        return (f"{files} failed, all refused before any request for what the "
                "listing says of them (see the reasons): a retry would refuse them again.")
    if refused:
        return (f"{files} failed; {refused:,} of them refused before any request "
                "for what the listing says of them, which a retry would refuse again. Rerun "
                "the same command with --retry-failed to try the others again.")
    return f"{files} failed; {retry}"


def stop_line(report: Report) -> str | None:
    """What --quiet still says: why a run stopped on an error (None when it did not)."""
    return _status(report)[0] if report.error is not None else None


def straggler_lines(report: Report) -> list[str]:
    """What --concurrency auto did about transfers left without an answer, if anything."""
    lines = []
    if report.hedged:
        lines.append(f"{report.hedged:,} asked for again on another connection (silent far "
                     f"longer than their host's answers take); {report.hedges_won:,} of those "
                     "answered first")
    if report.redialed:
        lines.append(f"{report.redialed:,} connects dialled again (unanswered within a few of "
                     "the host's latencies: a full accept queue drops them)")
    if report.requeued:
        lines.append(f"{report.requeued:,} transfers queued again when the server wanted fewer "
                     "in flight")
    return lines


def summary_table(report: Report) -> Table:
    """The end-of-run summary: outcome, counts, bytes, time and rates."""
    # rich's tables and consoles load late: a --quiet run never draws one, and importing
    # them is about a third of bulkfetch's start-up.
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title="bulkfetch summary", show_header=False, box=box.SIMPLE_HEAD,
                  title_justify="left", title_style="bold")
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    style = _status(report)[1]
    outcome = {0: "complete", 130: "interrupted"}.get(report.exit_code, "incomplete")
    table.add_row("status", Text(f"{outcome} (exit status {report.exit_code})", style=style))
    table.add_row("source", Text(safe_text(report.source)))
    table.add_row("destination", Text(safe_text(report.dest)))
    sync = report.options.get("sync")
    syncing = isinstance(sync, dict) and bool(sync.get("sync"))
    files = Text.assemble((f"{report.files_ok:,}", "bold green"),
                          " in step with the source" if syncing else " downloaded")
    if report.resumed_files:
        files.append(f" ({report.resumed_files:,} of them by earlier runs)", style="cyan")
    files.append(" · ")
    files.append(f"{report.files_failed:,}", style="bold red" if report.files_failed else "bold")
    files.append(" failed")
    if unfinished := _stored_of_unfinished_pages(report, syncing):
        files.append(f" · {unfinished:,} more stored, of pages not finished (a rerun "
                     "fetches those pages again)", style="yellow")
    table.add_row("files", files)
    if syncing:
        table.add_row("sync", Text(
            f"{report.unchanged:,} unchanged (not fetched again: "
            f"{report.unchanged_listed:,} by the listing, {_answered_304(report):,} "
            "answered 304"
            + (f", {report.unchanged_same_body:,} fetched whole and equal to DEST's copy, "
               "left as they were" + ("" if sync.get("checksum")  # type: ignore[union-attr]
                                      else ": the server ignores conditional requests")
               if report.unchanged_same_body else "")
            + f") · {report.deleted:,} "
            + ("removed as no longer listed" if sync.get("delete")  # type: ignore[union-attr]
               else "removed (no --delete)")
            + (f" · {report.changed_in_dest:,} modified in DEST since stored (fetched again)"
               if report.changed_in_dest else "")))
    stored = Text(f"{decimal(report.bytes)} ({report.bytes:,} bytes)")
    if report.continued_bytes:
        stored.append(f" ({decimal(report.continued_bytes)} of it already in partial files "
                      "a stopped run left)", style="cyan")
    table.add_row("bytes", stored)
    if report.partial_bytes:
        table.add_row("kept", Text(
            f"{decimal(report.partial_bytes)} in {report.partial_files:,} partial file"
            f"{'s' * (report.partial_files != 1)} (DEST/.bulkfetch/partial): the rerun asks "
            "only for the rest", style="cyan"))
    table.add_row("duration", Text(_duration(report.duration_s)))
    table.add_row("rate", Text(f"{report.files_per_s:,.0f} files/s · "
                               f"{decimal(int(report.bytes_per_s))}/s"
                               + (" (this run)" if report.resumed_files
                                  or report.continued_bytes else "")))
    under_way = report.pages_listed - report.pages
    table.add_row("pages", Text(f"{report.pages:,} done"
                                + (f" · {under_way:,} under way (a rerun finishes them)"
                                   if under_way > 0 else "")
                                + " · listing "
                                + ("complete" if report.listing_complete else "incomplete")))
    table.add_row("retries", Text(f"{report.retries:,}"))
    limits = report.options.get("limits")
    if isinstance(limits, dict) and limits.get("adaptive") and report.concurrency_peak:
        table.add_row("concurrency", Text(
            f"auto: {report.concurrency_final:,} in flight allowed at the end, at most "
            f"{report.concurrency_peak:,} (all workers)"))
    stragglers = straggler_lines(report)
    if stragglers:
        table.add_row("stragglers", Text("; ".join(stragglers)))
    if report.ranged_restarts:
        table.add_row("ranges", Text(f"{report.ranged_restarts:,} split files started over as "
                                     "one stream (the server's ranges could not be trusted)",
                                     style="yellow"))
    ways = [(report.checked_md5, "by MD5"), (report.checked_digest, "by checksum"),
            (report.checked_size, "by size only")]
    if any(count for count, _ in ways):
        table.add_row("checked", Text(" · ".join(f"{count:,} {way}" for count, way in ways
                                                  if count)))
    if report.sizes_estimated:
        table.add_row("", Text(f"{report.sizes_estimated:,} listed with a rounded size ('12K'): "
                               "checked by the answer's length, not the listing"))
    if report.ranged_size_only:
        table.add_row("", Text(f"{report.ranged_size_only:,} split files by size only: "
                               "the server stated no digest of the whole file",
                               style="yellow"))
    runner = report.options.get("runner")
    if isinstance(runner, dict) and runner.get("kind") == "ray" and report.workers:
        table.add_row("workers", Text(_by_node(report)))
    lost = sum(1 for worker in report.workers if worker.get("lost"))
    if report.pages_reassigned or lost:
        silent = f" ({report.leases_lapsed:,} silent past --lease)" \
            if report.leases_lapsed else ""
        whose = "its" if lost == 1 else "their"
        table.add_row("", Text(f"{lost:,} worker{'' if lost == 1 else 's'} lost{silent}; "
                               f"{report.pages_reassigned:,} of {whose} pages fetched by the "
                               "others", style="yellow"))
    if report.error is not None:
        table.add_row("error", Text(safe_text(report.error), style="red"))
    return table


def _by_node(report: Report) -> str:
    """Per node: workers and the files they stored, e.g. '10.0.0.5 node 1a2b3c4d: 2 workers,
    51,200 files'."""
    nodes: dict[str, list[int]] = {}
    for worker in report.workers:
        counts = nodes.setdefault(str(worker.get("node") or "?"), [0, 0])
        counts[0] += 1
        files = worker.get("files_ok")
        counts[1] += files if isinstance(files, int) else 0
    return " · ".join(f"{safe_text(node)}: {workers:,} workers, {files:,} files"
                      for node, (workers, files) in sorted(nodes.items()))


def print_summary(report: Report, console: Console) -> None:
    """The summary table, the first few failures, and what the exit status means."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    console.print(summary_table(report))
    total = _failures_total(report)
    shown = report.failures[:SUMMARY_FAILURES]
    if shown:
        failures = Table(title=f"failures (first {len(shown):,} of {total:,})",
                         title_justify="left", title_style="bold red", box=box.SIMPLE_HEAD)
        failures.add_column("name", overflow="fold", ratio=3)
        failures.add_column("reason", overflow="fold", ratio=2)
        failures.add_column("attempts", justify="right", no_wrap=True)
        for f in shown:
            failures.add_row(Text(safe_name(f.name)), Text(safe_text(f.reason)),
                             Text(f"{f.attempts:,}"))
        console.print(failures)
    if report.failures_file:
        more = f"{total - len(shown):,} more; " if total > len(shown) else ""
        where = safe_text(report.failures_file, limit=4096)  # whole: a path to copy
        console.print(Text(f"{more}all {total:,}, one JSON object a line (url, name, reason, "
                           f"attempts, status): {where}", style="dim"))
    elif total > len(shown):
        console.print(Text(f"{total - len(shown):,} more in the report/journal "
                           "(--report FILE.json lists up to "
                           f"{MAX_REPORT_FAILURES:,}; DEST/.bulkfetch/journal.sqlite has all).",
                           style="dim"))
    message, style = _status(report)
    console.print(Text(message, style=style))


def _answered_304(report: Report) -> int:
    """get --sync: the files a 304 showed unchanged."""
    return report.unchanged - report.unchanged_listed - report.unchanged_same_body


def _finite(x: float, digits: int = 3) -> float | None:
    return round(x, digits) if math.isfinite(x) else None


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _jsonable(value: object) -> object:
    """Options as plain JSON: str keys, lists for sequences, str() for anything unknown."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


def report_dict(report: Report) -> dict[str, object]:
    """The JSON report: counts, rates, options, outcome and the first 1,000 failures."""
    from bulkfetch._version import __version__

    total = _failures_total(report)
    return {
        "bulkfetch_version": __version__,
        "source": redact_text(report.source),
        "dest": report.dest,
        "started": _iso(report.started_at),
        "finished": _iso(report.finished_at),
        "exit_code": report.exit_code,
        "interrupted": report.interrupted,
        "listing_complete": report.listing_complete,
        "error": None if report.error is None else redact_text(report.error),
        "files_ok": report.files_ok,
        "files_failed": report.files_failed,
        "resumed_files": report.resumed_files,
        "resumed_bytes": report.resumed_bytes,
        "continued_bytes": report.continued_bytes,
        "partial": {"files": report.partial_files, "bytes": report.partial_bytes},
        "bytes": report.bytes,
        "retries": report.retries,
        "ranged_restarts": report.ranged_restarts,
        "ranged_size_only": report.ranged_size_only,
        "concurrency": {"final": report.concurrency_final, "peak": report.concurrency_peak},
        "checked": {"md5": report.checked_md5, "digest": report.checked_digest,
                    "size_only": report.checked_size},
        "sizes_estimated": report.sizes_estimated,
        "pages": report.pages,
        "pages_listed": report.pages_listed,
        "pages_reassigned": report.pages_reassigned,
        "leases_lapsed": report.leases_lapsed,
        "hedged": {"sent": report.hedged, "won": report.hedges_won},
        "redialed": report.redialed,
        "requeued": report.requeued,
        "unchanged": report.unchanged,
        "unchanged_by": {"listing": report.unchanged_listed,
                         "not_modified": _answered_304(report),
                         "same_body": report.unchanged_same_body},
        "changed_in_dest": report.changed_in_dest,
        "deleted": report.deleted,
        "workers": [dict(worker, lost=None if worker.get("lost") is None
                         else redact_text(str(worker["lost"]))) for worker in report.workers],
        "duration_s": _finite(report.duration_s),
        "files_per_s": _finite(report.files_per_s, 1),
        "bytes_per_s": _finite(report.bytes_per_s, 1),
        "options": _jsonable(redact_value(report.options)),
        "failures_total": total,
        "failures_truncated": total > min(len(report.failures), MAX_REPORT_FAILURES),
        "failures": [{"name": redact_text(f.name), "reason": redact_text(f.reason),
                      "attempts": f.attempts, "url": redact_text(f.url) or None}
                     for f in report.failures[:MAX_REPORT_FAILURES]],
        "failures_file": report.failures_file,
    }


def write_report(report: Report, path: Path) -> None:
    """Write the JSON report atomically: a temporary file in the same directory, then rename.

    The parent directory must exist. Readers see the old file or the whole new one, never a
    part; on any error the temporary file is removed and the error raised. A path that is not
    a regular file (/dev/stdout, a FIFO) is written into instead.
    """
    path = Path(path)
    text = json.dumps(report_dict(report), indent=2, ensure_ascii=True, allow_nan=False)
    data = (text + "\n").encode("ascii")
    try:
        found = os.stat(path)  # through symlinks: /dev/stdout is one, to the fd
    except FileNotFoundError:
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        # /dev/stdout, a FIFO, a device: written into, as a shell's `>` does. A rename
        # would replace the node itself (as root, /dev/stdout became a regular file).
        with open(path, "wb") as out:
            out.write(data)
        return
    # A symlink to a file: the file is replaced, the link kept.
    write_durably(Path(os.path.realpath(path)), data)  # 0644: a report is not a secret


