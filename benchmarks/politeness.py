"""--max-rps and --limit-rate held over time, counted by the server (issue 21):

    python benchmarks/politeness.py [--only rps,bytes,mixed,one] [--seconds 35]
                                    [--workers cores,1] [--max-rps 500] [--limit-rate 5m]
                                    [--file-size 100k] [--mixed-sizes lognormal:64k:2:16m]
                                    [--page-size 100]

Two setups, each a `bulkfetch serve` (1 process, pinned to core 0) writing its access log,
and rows of `bulkfetch get URL DEST --sink null -q --report R.json` (pinned to core 1) with
the default workers (one a core: they share the limit) and with -w 1:

- rps: `serve --files N` (100-byte files), `get --max-rps 500`, N = 500 x (--seconds + 1).
  Bar: every full 10-s window holds 500 requests/s within 5%.
- bytes: `serve --files N --file-size 100k`, `get --limit-rate 5m`; sizes are binary, as
  both commands parse them (5m = 5,242,880 bytes/s, 100k = 102,400 bytes: 51.2 files/s),
  N = 51.2 x (--seconds + 1). Bar: every full 10-s window holds 5m bytes/s within 5%.

- mixed: `serve --file-size lognormal:64k:2:16m --seed 3` (in-memory bodies and streamed
  ones), as many files as make the limit's bytes for the run, --limit-rate 5m.
- one: one file of the limit's bytes for the run (fetched in ranges), --limit-rate 5m.
  For these two the server's log is no measure: it logs each answer's whole length when
  asked, and a body over --spool-above is asked twice (its in-memory attempt is stopped
  at its headers), a piece is 16 MiB or more. Their bar is the report's bytes/s (bytes
  stored over the whole run, its start-up included) within -10%/+5% of the limit. (At
  6d8ab71: mixed went over the rate, the small bodies in flight charged the mean of their
  start, corrected by the mean at their store, while the mean rose; one file with the
  default 2 workers went at half the rate, each worker holding half of it.)

The windows are cut from the access log's /get/ requests (the time the server took each
request; bytes: the length it answered): 10 s each from the first one, only those that end
before the last one (the rest, a partial window, is shown but not held to the bar). The
default 35 s makes three full windows and leaves the run's last seconds, when the workers
finish their last pages one by one, to the rest. Every row is verified by its report (every
file stored, none failed, exit 0); answers other than 200 are counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.testing import LoggedRequest
from bulkfetch.util.sizes import parse_bytes
from harness import bulkfetch_command, log, pinning, run_measured, start_reference

WINDOW = 10.0  # seconds
TOLERANCE = 0.05
SETUPS = ("rps", "bytes", "mixed", "one")
MIXED_SEED = "3"
ONE_BELOW, ONE_ABOVE = 0.10, 0.05  # the one file's bar: -10% / +5% of the limit


@dataclass
class Window:
    start: float  # seconds after the first request
    end: float
    requests: int
    bytes: int
    full: bool

    def amount(self, unit: str) -> float:
        return self.requests if unit == "requests" else self.bytes

    def rate(self, unit: str) -> float:
        return self.amount(unit) / (self.end - self.start) if self.end > self.start else 0.0


@dataclass
class Run:
    label: str
    files: int
    ok: bool = False
    note: str = ""
    windows: list[Window] = field(default_factory=list)
    overall: dict[str, float] = field(default_factory=dict)  # unit -> per second
    span: float = 0.0
    other_statuses: int = 0  # /get/ answers other than 200
    reported: float = 0.0  # the report's bytes/s (the whole run, its start-up included)

    def full(self) -> list[Window]:
        return [w for w in self.windows if w.full]


def windows(requests: list[LoggedRequest]) -> tuple[list[Window], float]:
    """10-s windows from the first request to the last (the last one partial), and the span
    from the first request to the last."""
    if not requests:
        return [], 0.0
    first = requests[0].time
    span = requests[-1].time - first
    whole = int(span // WINDOW)
    found = []
    for number in range(whole + 1):
        start = number * WINDOW
        end = min(start + WINDOW, span) if number == whole else start + WINDOW
        inside = [r for r in requests if start <= r.time - first < start + WINDOW]
        if number == whole and (not inside or span <= start):
            break  # nothing after the last full window
        found.append(Window(start, end, len(inside), sum(r.length for r in inside),
                            number < whole))
    return found, span


def run_row(run: Run, url: str, client: list[str], limit: list[str], work: Path,
            access_log: Path, timeout: float) -> None:
    report = work / f"report-{run.label}.json"
    report.unlink(missing_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="dest-", dir=work))
    workers = [] if run.label == "cores" else ["--workers", run.label]
    command = [*client, *bulkfetch_command(), "get", url, str(dest), "--sink", "null",
               *limit, *workers, "--quiet", "--report", str(report)]
    access_log.write_text("")  # the server appends (O_APPEND): this row's lines only
    log(f"  {' '.join(command[len(client):])}")
    measured = run_measured(command, timeout=timeout)
    requests = sorted((LoggedRequest.parse(line) for line in access_log.read_text().splitlines()
                       if line.strip()), key=lambda r: r.time)
    got = [r for r in requests if r.target.startswith("/get/")]
    run.other_statuses = sum(1 for r in got if r.status != 200)
    run.windows, run.span = windows(got)
    if len(got) > 1 and run.span > 0:
        run.overall = {"requests": (len(got) - 1) / run.span,
                       "bytes": sum(r.length for r in got[:-1]) / run.span}
    try:
        found = json.loads(report.read_text())
    except (OSError, ValueError):
        found = {}
    run.ok = (measured.returncode == 0 and found.get("files_ok") == run.files
              and found.get("files_failed") == 0)
    run.reported = float(found.get("bytes_per_s") or 0.0)
    run.note = (f"exit {measured.returncode}, report: {found.get('files_ok', 0):,} of "
                f"{run.files:,} ok, {found.get('files_failed', '?')} failed, "
                f"{found.get('retries', '?')} retries; {len(got):,} /get/ requests"
                f"{f', {run.other_statuses:,} not 200' if run.other_statuses else ''}")
    log(f"  {run.label}: {len(got):,} /get/ requests over {run.span:.1f} s, "
        f"{measured.seconds:.1f} s in all; {run.note}"
        f"{'' if run.ok else ' FAILED: ' + measured.stderr[-500:]}")


def deviation(value: float, target: float) -> float:
    return value / target - 1.0


def table(title: str, runs: list[Run], unit: str, target: float, what: str) -> str:
    """`unit`: "requests" or "bytes"; `target`: per second; `what`: the limit as asked."""
    amount = "/get/ requests" if unit == "requests" else "bytes"
    per_second = "requests/s" if unit == "requests" else "bytes/s"
    lines = [title, "", f"| workers | window | {amount} | {per_second} | vs {what} | note |",
             "|---|---|---:|---:|---:|---|"]
    for run in runs:
        name = "default (cores)" if run.label == "cores" else f"-w {run.label}"
        for window in run.windows:
            label = f"{window.start:.0f}–{window.end:.0f} s" if window.full else \
                f"rest {window.start:.0f}–{window.end:.1f} s"
            rate = window.rate(unit)
            lines.append(f"| {name} | {label} | {window.amount(unit):,} | {rate:,.1f} | "
                         f"{deviation(rate, target):+.2%} | "
                         f"{'' if window.full else 'partial: not held to the bar'} |")
        if run.overall:
            rate = run.overall[unit]
            lines.append(f"| {name} | overall 0–{run.span:.1f} s | | {rate:,.1f} | "
                         f"{deviation(rate, target):+.2%} | "
                         f"{'verified' if run.ok else 'NOT VERIFIED'}: {run.note} |")
        else:
            lines.append(f"| {name} | - | | | | NOT VERIFIED: {run.note} |")
    lines.append("")
    for run in runs:
        name = "default workers (cores)" if run.label == "cores" else f"-w {run.label}"
        full = run.full()
        if not full:
            lines.append(f"- [ ] {name}: every full {WINDOW:g}-s window within "
                         f"±{TOLERANCE:.0%} of {what}: no full window (the run took "
                         f"{run.span:.1f} s)")
            continue
        worst = max((deviation(w.rate(unit), target) for w in full), key=abs)
        good = all(abs(deviation(w.rate(unit), target)) <= TOLERANCE for w in full)
        lines.append(f"- [{'x' if good else ' '}] {name}: every full {WINDOW:g}-s window "
                     f"within ±{TOLERANCE:.0%} of {what} ({len(full)} window"
                     f"{'' if len(full) == 1 else 's'}; worst "
                     f"{worst:+.2%})")
    verified = all(run.ok for run in runs)
    lines.append(f"- [{'x' if verified else ' '}] every run verified: exit 0, the report "
                 "says every file ok and none failed")
    return "\n".join(lines)


def overall_table(title: str, runs: list[Run], target: float, what: str) -> str:
    """The one-file setup: each row's rate as its report gives it."""
    lines = [title, "", f"| workers | MiB/s (report) | vs {what} | note |", "|---|---:|---:|---|"]
    for run in runs:
        name = "default (cores)" if run.label == "cores" else f"-w {run.label}"
        lines.append(f"| {name} | {run.reported / 2**20:,.2f} | "
                     f"{deviation(run.reported, target):+.2%} | "
                     f"{'verified' if run.ok else 'NOT VERIFIED'}: {run.note} |")
    lines.append("")
    for run in runs:
        name = "default workers (cores)" if run.label == "cores" else f"-w {run.label}"
        off = deviation(run.reported, target)
        good = -ONE_BELOW <= off <= ONE_ABOVE
        lines.append(f"- [{'x' if good else ' '}] {name}: the report's rate within "
                     f"-{ONE_BELOW:.0%}/+{ONE_ABOVE:.0%} of {what} ({off:+.2%})")
    verified = all(run.ok for run in runs)
    lines.append(f"- [{'x' if verified else ' '}] every run verified: exit 0, the report "
                 "says every file ok and none failed")
    return "\n".join(lines)


def files_for(spec: str, seed: int, total: float) -> tuple[int, int]:
    """(files, bytes): the fewest files of the `spec` data set with at least `total` bytes."""
    from bulkfetch.server.dataset import SyntheticDataSet
    from bulkfetch.util.sizes import parse_size_spec

    sizes = SyntheticDataSet(10**7, 1000, seed, parse_size_spec(spec))
    files = have = 0
    while have < total:
        have += sizes.size(files)
        files += 1
    return files, have


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SETUPS),
                        help="setups to run, comma-separated: rps, bytes")
    parser.add_argument("--seconds", type=float, default=35.0,
                        help="how long each run takes at its limit (the number of files is "
                             "set from it, plus a second); keep 5 s or more past a multiple "
                             "of 10, for the workers' uneven end (35: three full windows)")
    parser.add_argument("--workers", default="cores,1",
                        help="rows: worker counts, comma-separated ('cores': the default)")
    parser.add_argument("--max-rps", type=float, default=500.0)
    parser.add_argument("--limit-rate", default="5m", help="bytes/s (k/m/g: binary)")
    parser.add_argument("--file-size", default="100k", help="bytes per file of the bytes setup")
    parser.add_argument("--mixed-sizes", default="lognormal:64k:2:16m",
                        help="file sizes of the mixed setup (a --file-size spec of serve)")
    parser.add_argument("--page-size", type=int, default=100,
                        help="names per list page of both servers (small pages keep every "
                             "worker busy to the end)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(only) - set(SETUPS)
    if unknown:
        parser.error(f"--only: unknown setup(s) {', '.join(sorted(unknown))}")
    labels = [label.strip() for label in args.workers.split(",") if label.strip()]
    if any(label != "cores" and not label.isdigit() for label in labels):
        parser.error("--workers: 'cores' or numbers, comma-separated")
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-politeness-"))
    access_log = work / "access.log"
    timeout = args.seconds * 4 + 120
    tables = []

    def measure(serve: list[str], get: list[str], files: int, what: str) -> list[Run]:
        """Every worker setting's row against one server of `files` (serve flags added)."""
        server = start_reference(place.server, files, 1,
                                 [*serve, "--page-size", str(args.page_size),
                                  "--access-log", str(access_log)])
        try:
            log(f"{what} at {server.url}; {place.note}")
            runs = [Run(label, files) for label in labels]
            for run in runs:
                run_row(run, server.url, place.client, get, work, access_log, timeout)
        finally:
            server.stop()
        return runs

    if "rps" in only:
        files = math.ceil(args.max_rps * (args.seconds + 1))
        runs = measure([], ["--max-rps", f"{args.max_rps:g}"], files,
                       f"rps: {files:,} files, --max-rps {args.max_rps:g}")
        tables.append(table(f"`bulkfetch get --max-rps {args.max_rps:g} --sink null` of "
                            f"{files:,} files of 100 bytes from `bulkfetch serve --page-size "
                            f"{args.page_size}` (1 process, access log); {place.note}; "
                            f"windows of {WINDOW:g} s from the first /get/ request", runs,
                            "requests", args.max_rps, f"{args.max_rps:g}/s"))
    if "bytes" in only:
        rate, size = parse_bytes(args.limit_rate), parse_bytes(args.file_size)
        if rate <= 0 or size <= 0:
            parser.error("--limit-rate and --file-size must be positive")
        files = math.ceil(rate * (args.seconds + 1) / size)
        runs = measure(["--file-size", str(size)], ["--limit-rate", args.limit_rate], files,
                       f"bytes: {files:,} files of {size:,} bytes, --limit-rate "
                       f"{args.limit_rate} ({rate:,} bytes/s)")
        tables.append(table(f"`bulkfetch get --limit-rate {args.limit_rate} --sink null` "
                            f"({rate:,} bytes/s) of {files:,} files of {size:,} bytes from "
                            f"`bulkfetch serve --page-size {args.page_size}` (1 process, "
                            f"access log); {place.note}; windows of {WINDOW:g} s from the "
                            "first /get/ request, bytes as the server answered them", runs,
                            "bytes", rate, f"{args.limit_rate} ({rate:,} B/s)"))
    if "mixed" in only:
        rate = parse_bytes(args.limit_rate)
        files, total = files_for(args.mixed_sizes, int(MIXED_SEED), rate * (args.seconds + 1))
        runs = measure(["--file-size", args.mixed_sizes, "--seed", MIXED_SEED],
                       ["--limit-rate", args.limit_rate], files,
                       f"mixed: {files:,} files, {total:,} bytes, --limit-rate "
                       f"{args.limit_rate} ({rate:,} bytes/s)")
        tables.append(overall_table(f"`bulkfetch get --limit-rate {args.limit_rate} --sink "
                                    f"null` of {files:,} files of `{args.mixed_sizes}` "
                                    f"(seed {MIXED_SEED}; {total:,} bytes) from `bulkfetch "
                                    f"serve --page-size {args.page_size}` (1 process); "
                                    f"{place.note}", runs, rate,
                                    f"{args.limit_rate} ({rate:,} B/s)"))
    if "one" in only:
        rate = parse_bytes(args.limit_rate)
        size = int(rate * (args.seconds + 1))
        runs = measure(["--file-size", str(size)], ["--limit-rate", args.limit_rate], 1,
                       f"one: 1 file of {size:,} bytes, --limit-rate {args.limit_rate}")
        tables.append(overall_table(f"`bulkfetch get --limit-rate {args.limit_rate} --sink "
                                    f"null` of one file of {size:,} bytes (in ranges) from "
                                    f"`bulkfetch serve` (1 process); {place.note}", runs,
                                    rate, f"{args.limit_rate} ({rate:,} B/s)"))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
