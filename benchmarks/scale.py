"""Cost at scale: bulkfetch's CPU per file with 4,096 transfers in flight against a bare C
libcurl multi loop (benchmarks/curl_loop.c) at the same concurrency (issue 21):

    python benchmarks/scale.py [--files 40000] [--rounds 3] [--latency 100]
                               [--server-processes 2] [--libcurl pycurl|system]

`bulkfetch serve --latency MS` (every answer MS late, like a distant server) on core 0, the
client on core 1 (as benchmarks/concurrency.py). Rows: `bulkfetch get URL DEST --sink null
-w 1 -c 1024` and `-c 4096`, and curl_loop at 1024 and 4096 fed the URLs of the same files
(the server's listing, paged through once before the rounds). curl_loop is compiled into a
temporary directory with gcc -O2, by default against the libcurl pycurl loads (so both sides
run the same libcurl; --libcurl system: the distribution's, `-lcurl`); it needs libcurl's
headers (Debian/Ubuntu: apt-get install libcurl4-openssl-dev).

CPU per file is user + sys of the client's process tree (bulkfetch: main process and worker,
listing and journal included, start-up too) over the files. Each round runs every row once,
every other round in reverse order; the table shows medians. Every row is verified: the
report of bulkfetch says every file stored, none failed; curl_loop's JSON says every file
answered 200 and none failed. Bars: bulkfetch -c 4096 at most 1.3x curl_loop 4096's CPU per
file, and no more than bulkfetch -c 1024's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    build_curl_loop,
    bulkfetch_command,
    log,
    pinning,
    run_measured,
    start_reference,
)

SETTINGS = (1024, 4096)

@dataclass
class Row:
    client: str  # "bulkfetch" or "curl_loop"
    setting: int
    files: int
    speeds: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    ok: bool = True
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.client} -c {self.setting}" if self.client == "bulkfetch" \
            else f"{self.client} {self.setting}"

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_us)


def list_urls(base: str, path: Path) -> int:
    """Page through the seed API's /list and write every file's URL to `path`."""
    count, token = 0, None
    with path.open("w") as out:
        while True:
            url = f"{base}/list" if token is None else \
                f"{base}/list?next-marker={urllib.parse.quote(token, safe='')}"
            with urllib.request.urlopen(url, timeout=60) as answer:
                page = json.load(answer)
            for name in page["FileNames"]:
                out.write(f"{base}/get/{urllib.parse.quote(name, safe='/')}\n")
            count += len(page["FileNames"])
            token = page.get("NextMarker")
            if not token:
                return count


def run_row(row: Row, url: str, urls: Path, binary: Path, client: list[str],
            work: Path) -> None:
    if row.client == "bulkfetch":
        report = work / "report.json"
        report.unlink(missing_ok=True)
        command = [*client, *bulkfetch_command(), "get", url, str(work / "dest"), "--workers",
                   "1", "--sink", "null", "-c", str(row.setting), "--quiet", "--restart",
                   "--report", str(report)]
    else:
        command = [*client, str(binary), str(row.setting), str(urls)]
    measured = run_measured(command)
    if row.client == "bulkfetch":
        try:
            found = json.loads(report.read_text())
        except (OSError, ValueError):
            found = {}
        ok = measured.returncode == 0 and found.get("files_ok") == row.files \
            and not found.get("files_failed")
        row.note = f"report says {found.get('files_ok', 0):,} ok, " \
                   f"{found.get('files_failed', 0):,} failed"
    else:
        try:
            found = json.loads(measured.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            found = {}
        ok = measured.returncode == 0 and found.get("ok") == row.files \
            and found.get("failed") == 0
        row.note = f"{found.get('ok', 0):,} ok, {found.get('failed', '?')} failed " \
                   f"(libcurl {found.get('libcurl', '?')})"
    row.ok &= ok
    row.speeds.append(row.files / measured.seconds)
    row.cpu_us.append(measured.cpu_seconds / row.files * 1e6)
    log(f"  {row.label}: {row.speeds[-1]:,.0f} files/s, {row.cpu_us[-1]:.1f} us/file CPU, "
        f"exit {measured.returncode}{'' if ok else ' FAILED: ' + measured.stderr[-500:]}")


def table(title: str, rows: list[Row]) -> str:
    lines = [title, "", "| row | files/s | CPU µs/file | CPU µs/file by round | "
             "files/s by round | verified |", "|---|---:|---:|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.label} | {statistics.median(row.speeds):,.0f} | {row.cpu:.1f} | "
                     f"{', '.join(f'{c:.1f}' for c in row.cpu_us)} | "
                     f"{', '.join(f'{s:,.0f}' for s in row.speeds)} | "
                     f"{'yes' if row.ok else 'NO'}: {row.note} |")
    by = {(row.client, row.setting): row for row in rows}
    ours, ours_1024 = by["bulkfetch", 4096], by["bulkfetch", 1024]
    bare, bare_1024 = by["curl_loop", 4096], by["curl_loop", 1024]
    against_c = ours.cpu / bare.cpu
    against_1024 = ours.cpu / ours_1024.cpu
    verified = all(row.ok for row in rows)
    lines += ["",
              f"- [{'x' if against_c <= 1.3 and verified else ' '}] bulkfetch -c 4096 CPU/file "
              f"÷ curl_loop 4096 CPU/file {against_c:.2f} (<= 1.3)",
              f"- [{'x' if against_1024 <= 1.0 and verified else ' '}] bulkfetch -c 4096 "
              f"CPU/file ÷ bulkfetch -c 1024 CPU/file {against_1024:.2f} (<= 1.0)",
              # libcurl itself costs more a file at 4096 (its connection pool is searched
              # per transfer): the growth bulkfetch adds is what is ours to answer for
              f"- [{'x' if against_1024 <= bare.cpu / bare_1024.cpu and verified else ' '}] "
              f"(proposed bar) bulkfetch's growth from 1024 to 4096 {against_1024:.2f} no "
              f"more than the bare C loop's {bare.cpu / bare_1024.cpu:.2f}",
              f"- (for comparison) bulkfetch -c 1024 ÷ curl_loop 1024 "
              f"{ours_1024.cpu / bare_1024.cpu:.2f}"]
    if not verified:
        lines.append("- [ ] every row verified (see the table: a row that did not fetch every "
                     "file is not a measurement)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=int, default=100, help="ms of every answer")
    parser.add_argument("--server-processes", type=int, default=2,
                        help="processes of `bulkfetch serve` (all on the server's core)")
    parser.add_argument("--libcurl", choices=("pycurl", "system"), default="pycurl",
                        help="the libcurl curl_loop is linked with: the one pycurl loads "
                             "(default) or the system's -lcurl")
    args = parser.parse_args(argv)
    if args.files < 1 or args.rounds < 1:
        parser.error("--files and --rounds must be at least 1")
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-scale-"))
    try:
        binary, linked = build_curl_loop(work, args.libcurl)
        server = start_reference(place.server, args.files, args.server_processes,
                                 ["--latency", str(args.latency)])
        try:
            log(f"bulkfetch serve --latency {args.latency}, {args.files:,} files, "
                f"{args.server_processes} processes at {server.url}; {place.note}; "
                f"curl_loop linked with {linked}")
            urls = work / "urls.txt"
            listed = list_urls(server.url, urls)
            if listed != args.files:
                raise SystemExit(f"the server listed {listed:,} files, not {args.files:,}")
            rows = [Row(client, setting, args.files)
                    for client in ("bulkfetch", "curl_loop") for setting in SETTINGS]
            for number in range(args.rounds):
                log(f"round {number + 1} of {args.rounds}")
                for row in rows[::-1] if number % 2 else rows:
                    run_row(row, server.url, urls, binary, place.client, work)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(f"{args.files:,} files of 100 bytes from `bulkfetch serve --latency "
                f"{args.latency}` ({args.server_processes} processes), bulkfetch 1 worker "
                f"--sink null, curl_loop linked with {linked}; {place.note}; median of "
                f"{args.rounds} rounds", rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
