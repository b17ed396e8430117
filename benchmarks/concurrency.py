"""`--concurrency auto` against fixed settings, side by side in one run (issue 21):

    python benchmarks/concurrency.py [--files 20000] [--rounds 3] [--latency 100]
                                     [--far-settings 64,256,1024,4096,auto]
                                     [--capped-files 100000] [--loopback-files 200000]

Three setups, every row one worker with --sink null (the transfers are what is measured):

- far: `bulkfetch serve --latency MS` (every answer MS late, like a distant server), server
  on core 0 and the client on core 1: -c 64, 256, 1024, 4096 and auto. Bar: auto reaches at
  least 85% of the best fixed row's files/s.
- capped: `bulkfetch serve --max-concurrent 200 --latency 20` (503 with Retry-After: 1
  beyond 200 in flight): -c 180, 1000 and auto, with the share of answers that were 503
  (the server's access log). Bars: auto under 2% 503s and at least 85% of -c 180's
  files/s; -c 1000 shows what hammering costs.
- loopback: nginx serving the standard static export (docs/guide/benchmarks.md),
  pinned the same way:
  -c 64, 256 and auto. Bar: auto at least 90% of the best fixed row's files/s at no more
  than 1.1x its CPU per file.

Each round runs every row once, every other round in reverse order; the table shows the
median files/s and CPU per file (user + sys of the client's process tree), and every row is
verified by its report (every file stored, none failed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    pinning,
    run_measured,
    start_nginx,
    start_reference,
)

FAR_SETTINGS = ("64", "256", "1024", "4096", "auto")
CAPPED_SETTINGS = ("180", "1000", "auto")
LOOPBACK_SETTINGS = ("64", "256", "auto")


@dataclass
class Row:
    setup: str
    setting: str
    files: int
    speeds: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    ok: bool = True
    note: str = ""
    refused: list[float] = field(default_factory=list)  # share of answers that were 503

    @property
    def label(self) -> str:
        return f"{self.setup} -c {self.setting}"


def run_row(row: Row, url: str, client: list[str], work: Path,
            access_log: Path | None = None) -> None:
    report = work / "report.json"
    report.unlink(missing_ok=True)
    dest = work / "dest"
    command = [*client, *bulkfetch_command(), "get", url, str(dest), "--workers", "1",
               "--sink", "null", "-c", row.setting, "--quiet", "--restart", "--report",
               str(report)]
    if access_log is not None:
        access_log.write_text("")  # the server appends (O_APPEND): this row's lines only
    measured = run_measured(command)
    if access_log is not None:
        statuses = [line.split()[4] for line in access_log.read_text().splitlines()
                    if len(line.split()) > 4]
        row.refused.append(statuses.count("503") / max(1, len(statuses)))
    try:
        found = json.loads(report.read_text())
    except (OSError, ValueError):
        found = {}
    ok = measured.returncode == 0 and found.get("files_ok") == row.files
    row.ok &= ok
    row.speeds.append(row.files / measured.seconds)
    row.cpu_us.append(measured.cpu_seconds / row.files * 1e6)
    row.note = f"report says {found.get('files_ok', 0):,} ok"
    log(f"  {row.label}: {row.speeds[-1]:,.0f} files/s, {row.cpu_us[-1]:.1f} us/file CPU, "
        f"exit {measured.returncode}{'' if ok else ' FAILED: ' + measured.stderr[-500:]}")


def rounds(rows: list[Row], url: str, client: list[str], work: Path, count: int,
           access_log: Path | None = None) -> None:
    for number in range(count):
        log(f"round {number + 1} of {count}")
        for row in rows[::-1] if number % 2 else rows:
            run_row(row, url, client, work, access_log)


def table(title: str, rows: list[Row], speed_bar: float, cpu_bar: float | None,
          against: str | None = None) -> str:
    """`against`: the fixed setting auto is held to (default: the fastest fixed row)."""
    lines = [title, "", "| row | files/s | CPU µs/file | 503s | files/s by round | verified |",
             "|---|---:|---:|---:|---|---|"]
    for row in rows:
        refused = f"{statistics.median(row.refused):.2%}" if row.refused else "-"
        lines.append(f"| {row.label} | {statistics.median(row.speeds):,.0f} | "
                     f"{statistics.median(row.cpu_us):.1f} | {refused} | "
                     f"{', '.join(f'{s:,.0f}' for s in row.speeds)} | "
                     f"{'yes' if row.ok else 'NO'}: {row.note} |")
    auto = next(row for row in rows if row.setting == "auto")
    fixed = [row for row in rows if row.setting != "auto"]
    best = max(fixed, key=lambda row: statistics.median(row.speeds)) if against is None \
        else next(row for row in rows if row.setting == against)
    speed = statistics.median(auto.speeds) / statistics.median(best.speeds)
    cpu = statistics.median(auto.cpu_us) / statistics.median(best.cpu_us)
    lines.append("")
    lines.append(f"- [{'x' if speed >= speed_bar else ' '}] auto files/s × best fixed "
                 f"(-c {best.setting}) {speed:.2f} (>= {speed_bar:g})")
    if cpu_bar is not None:
        lines.append(f"- [{'x' if cpu <= cpu_bar else ' '}] auto CPU/file × best fixed "
                     f"{cpu:.2f} (<= {cpu_bar:g})")
    if auto.refused:
        share = statistics.median(auto.refused)
        lines.append(f"- [{'x' if share < 0.02 else ' '}] auto's answers that were 503 "
                     f"{share:.2%} (< 2%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000,
                        help="files of the far server (0: skip the far setup)")
    parser.add_argument("--latency", type=int, default=100, help="ms of the far server")
    parser.add_argument("--far-settings", default=",".join(FAR_SETTINGS),
                        help="the far rows' -c settings, comma-separated (auto among them); "
                             "-c 64 takes 40 s at 20,000 files")
    parser.add_argument("--loopback-files", type=int, default=200_000,
                        help="files of the nginx export (0: skip the loopback setup)")
    # The bar is on where auto settles: each refusal pauses the host for the server's
    # Retry-After (1 s), and the first overshoot's pause is a large share of a short run
    # (50,000 files, about 7 s: 0.76 of -c 180, against 0.86 at 100,000 files in the same
    # hour; benchmarks/results/2026-11-26-session21.txt).
    parser.add_argument("--capped-files", type=int, default=100_000,
                        help="files of the server capped at 200 in flight (0: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-concurrency-"))
    tables = []
    if args.files:
        far = start_reference(place.server, args.files, 1, ["--latency", str(args.latency)])
        try:
            log(f"far: bulkfetch serve --latency {args.latency}, {args.files:,} files at "
                f"{far.url}; {place.note}")
            settings = [setting.strip() for setting in args.far_settings.split(",")]
            if "auto" not in settings or len(settings) < 2:
                parser.error("--far-settings: give auto and at least one number")
            rows = [Row("far", setting, args.files) for setting in settings]
            rounds(rows, far.url, place.client, work, args.rounds)
        finally:
            far.stop()
        tables.append(table(f"{args.files:,} files from `bulkfetch serve --latency "
                            f"{args.latency}` (1 process), 1 worker, --sink null; "
                            f"{place.note}; median of {args.rounds} rounds", rows, 0.85, None))
    if args.capped_files:
        access_log = work / "access.log"
        capped = start_reference(place.server, args.capped_files, 1,
                                 ["--max-concurrent", "200", "--latency", "20",
                                  "--access-log", str(access_log)])
        try:
            log(f"capped: bulkfetch serve --max-concurrent 200 --latency 20, "
                f"{args.capped_files:,} files")
            rows = [Row("capped", setting, args.capped_files) for setting in CAPPED_SETTINGS]
            rounds(rows, capped.url, place.client, work, args.rounds, access_log)
        finally:
            capped.stop()
        tables.append(table(f"{args.capped_files:,} files from `bulkfetch serve "
                            "--max-concurrent 200 --latency 20` (1 process; beyond 200 in "
                            "flight: 503 with Retry-After: 1), 1 worker, --sink null; "
                            f"{place.note}; median of {args.rounds} rounds", rows, 0.85,
                            None, against="180"))
    if args.loopback_files:
        config, note = cached_export(args.loopback_files, work / "export")
        if config is None:
            raise SystemExit(f"no nginx export: {note}")
        config, _ = fit_open_file_cache(config, work, 4096)
        nginx = start_nginx(place.server, config)
        try:
            rows = [Row("loopback", setting, args.loopback_files)
                    for setting in LOOPBACK_SETTINGS]
            rounds(rows, nginx.url, place.client, work, args.rounds)
        finally:
            nginx.stop()
        tables.append(table(f"{args.loopback_files:,} files of 100 bytes from nginx (static "
                            f"export), 1 worker, --sink null; {place.note}; median of "
                            f"{args.rounds} rounds", rows, 0.90, 1.1))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
