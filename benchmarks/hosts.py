"""Two hosts in one URL table, one worker: a capped host must not hold back a far one
(issue 21, `--concurrency auto` per host):

    python benchmarks/hosts.py [--far-files 30000] [--capped-files 8000] [--cap 16]
                               [--fixed 64] [--rounds 1]

Two `bulkfetch serve` on core 0, each writing its access log: the capped host
(`--max-concurrent CAP --latency 20`: beyond CAP requests in flight it answers 503 with
Retry-After) and the far host (`--latency 100`, 2 processes). A CSV (url, name) interleaves
their files evenly. Rows, on core 1, `bulkfetch get --from-file TABLE DEST --name-col
name -w 1 --sink null`:

- far host alone, -c auto: the far host's files only (what the far host gives by itself);
- both hosts, -c auto;
- both hosts, each fixed -c of --fixed (a fixed number has no per-host limit: what
  hammering the capped host costs, and what the far host gets at that number).

Per host from its access log: /get/ requests, 503 answers, and files/s over the span from
its first to its last /get/ request. Bars: under -c auto the capped host's 503 answers stay
under 2% of its requests (issue 21's bar for one capped host), and the far host beside it
gets more files/s than under the old default -c 64 (its neighbour's pushback no longer
shrinks its share). The far host alone is shown for reference, not held to a bar: pages
finish, and new ones come (at most --pages-ahead, default 8 a worker + 2), only once the
capped host's files in them are done, so beside a capped host the far one is held to the
capped host's pace times its share of each page. Every row is verified by its report
(every file stored, none failed, exit 0).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.testing import LoggedRequest
from harness import bulkfetch_command, log, pinning, run_measured, start_reference

REFUSED_BAR = 0.02


@dataclass
class HostCounts:
    requests: int = 0
    refused: int = 0  # 503 answers
    files_per_s: float = 0.0


@dataclass
class Row:
    label: str
    files: int
    args: list[str]
    far_only: bool = False
    far: list[HostCounts] = field(default_factory=list)
    capped: list[HostCounts] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ok: bool = True


def names_of(base: str) -> list[str]:
    """Every name the server lists, following its pages."""
    names: list[str] = []
    url = f"{base}/list"
    while url:
        with urllib.request.urlopen(url, timeout=60) as answer:
            page = json.load(answer)
        names += page["FileNames"]
        token = page.get("NextMarker")
        url = f"{base}/list?next-marker={token}" if token else ""
    return names


def write_table(path: Path, far: str, far_names: list[str], capped: str | None,
                capped_names: list[str]) -> int:
    """A CSV interleaving both hosts' files evenly; names prefixed by host (they collide)."""
    rows = [(f"{far}/get/{n}", f"far/{n}", i / len(far_names))
            for i, n in enumerate(far_names)]
    if capped is not None:
        rows += [(f"{capped}/get/{n}", f"capped/{n}", i / len(capped_names))
                 for i, n in enumerate(capped_names)]
    rows.sort(key=lambda row: row[2])
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["url", "name"])
        writer.writerows(row[:2] for row in rows)
    return len(rows)


def counts(log_path: Path) -> HostCounts:
    got = sorted((r for r in (LoggedRequest.parse(line) for line in
                              log_path.read_text().splitlines() if line.strip())
                  if r.target.startswith("/get/")), key=lambda r: r.time)
    found = HostCounts(len(got), sum(1 for r in got if r.status == 503))
    ok = [r for r in got if r.status == 200]
    if len(ok) > 1 and ok[-1].time > ok[0].time:
        found.files_per_s = (len(ok) - 1) / (ok[-1].time - ok[0].time)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--far-files", type=int, default=30000)
    parser.add_argument("--capped-files", type=int, default=8000)
    parser.add_argument("--cap", type=int, default=16, help="the capped host's --max-concurrent")
    parser.add_argument("--fixed", default="64", help="fixed -c rows, comma-separated "
                        "(the far-host bar compares with -c 64's row)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    fixed = [value.strip() for value in args.fixed.split(",") if value.strip()]
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-hosts-"))
    far_log, capped_log = work / "far.log", work / "capped.log"
    far = start_reference(place.server, args.far_files, 2,
                          ["--latency", "100", "--access-log", str(far_log)])
    capped = start_reference(place.server, args.capped_files, 1,
                             ["--latency", "20", "--max-concurrent", str(args.cap),
                              "--access-log", str(capped_log)])
    try:
        far_names, capped_names = names_of(far.url), names_of(capped.url)
        alone, both = work / "far.csv", work / "both.csv"
        alone_files = write_table(alone, far.url, far_names, None, [])
        both_files = write_table(both, far.url, far_names, capped.url, capped_names)
        rows = [Row("far host alone, -c auto", alone_files, ["-c", "auto"], far_only=True),
                Row("both hosts, -c auto", both_files, ["-c", "auto"])]
        rows += [Row(f"both hosts, -c {value}", both_files, ["-c", value]) for value in fixed]
        log(f"far host {far.url} (--latency 100, 2 processes), capped host {capped.url} "
            f"(--max-concurrent {args.cap} --latency 20); {place.note}")
        for number in range(args.rounds):
            for row in rows if number % 2 == 0 else rows[::-1]:
                far_log.write_text("")
                capped_log.write_text("")
                report = work / "report.json"
                report.unlink(missing_ok=True)
                dest = Path(tempfile.mkdtemp(prefix="dest-", dir=work))
                command = [*place.client, *bulkfetch_command(), "get", "--from-file",
                           str(alone if row.far_only else both), str(dest),
                           "--name-col", "name", "-w", "1", "--sink", "null", "--quiet",
                           "--report", str(report), *row.args]
                log(f"  round {number + 1}: {row.label}")
                measured = run_measured(command, timeout=900)
                try:
                    found = json.loads(report.read_text())
                except (OSError, ValueError):
                    found = {}
                ok = (measured.returncode == 0 and found.get("files_ok") == row.files
                      and found.get("files_failed") == 0)
                row.ok = row.ok and ok
                row.notes.append(f"{found.get('files_ok', 0):,} ok, "
                                 f"{found.get('retries', '?')} retries, concurrency "
                                 f"{found.get('concurrency', {})}")
                if not ok:
                    log(f"    FAILED: exit {measured.returncode} {measured.stderr[-400:]}")
                row.far.append(counts(far_log))
                if not row.far_only:
                    row.capped.append(counts(capped_log))
                row.cpu_us.append(measured.cpu_seconds / row.files * 1e6)
                row.seconds.append(measured.seconds)
                shutil.rmtree(dest, ignore_errors=True)
    finally:
        far.stop()
        capped.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows, args))
    return 0


def table(rows: list[Row], args: argparse.Namespace) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    lines = [f"{args.far_files:,} files from a far host (`serve --latency 100`, 2 processes) "
             f"and {args.capped_files:,} from a capped one (`--max-concurrent {args.cap} "
             f"--latency 20`, 503 + Retry-After beyond) in one CSV, interleaved; "
             f"`get --name-col name -w 1 --sink null`; median of {args.rounds} round(s)", "",
             "| row | s | CPU µs/file | far host files/s | capped host files/s | capped 503s "
             "/ requests | verified |", "|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        far_rate = median([c.files_per_s for c in row.far])
        if row.capped:
            capped_rate = f"{median([c.files_per_s for c in row.capped]):,.0f}"
            refused = (f"{median([c.refused for c in row.capped]):,.0f} / "
                       f"{median([c.requests for c in row.capped]):,.0f}")
        else:
            capped_rate = refused = "–"
        lines.append(f"| {row.label} | {median(row.seconds):.1f} | {median(row.cpu_us):.1f} "
                     f"| {far_rate:,.0f} | {capped_rate} | {refused} | "
                     f"{'yes' if row.ok else 'NO'}: {row.notes[-1]} |")
    alone, auto = rows[0], rows[1]
    far_auto = median([c.files_per_s for c in auto.far])
    refused = median([c.refused / max(c.requests, 1) for c in auto.capped])
    lines += ["", "Bars:",
              f"- [{'x' if refused < REFUSED_BAR else ' '}] capped host's 503s under -c auto: "
              f"{refused:.2%} of its requests (< {REFUSED_BAR:.0%})"]
    old = next((row for row in rows if row.args == ["-c", "64"]), None)
    if old is not None:
        far_old = median([c.files_per_s for c in old.far])
        lines.append(f"- [{'x' if far_auto > far_old else ' '}] far host's files/s beside the "
                     f"capped host, -c auto × -c 64: {far_auto / max(far_old, 1e-9):.2f} (> 1)")
    lines.append(f"- for reference, far host's files/s beside the capped host × alone, both "
                 f"-c auto: {far_auto / max(median([c.files_per_s for c in alone.far]), 1e-9):.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
