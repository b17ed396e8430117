"""`bulkfetch.stream(workers=2)` against `bulkfetch get --sink null -w 2`, in one run (issue 24):

    python benchmarks/stream.py [--files 200000] [--rounds 3] [--rss-files 200000 2000000]

Speed: nginx serves the standard static export (docs/guide/benchmarks.md) pinned to core 0;
every row
runs pinned to core 1 as its own process, two worker processes each:

- `bulkfetch get URL DEST --sink null -w 2`: the engine with nothing handed over;
- `bulkfetch.stream(URL, workers=2)`: every body handed to the caller's process, a page's
  bodies as one message; the caller checks every body (CRC-32 of name and body, summed,
  against the export's files);
- the same stream with each body pickled as its own message (`Stream(one_by_one=True)`),
  the usual multiprocessing design, for comparison.

Memory: the same stream against the reference server (synthetic bodies, nothing on disk)
for each of --rss-files, peak RSS of the whole tree (caller + workers).

Bars (issue 24): the stream reaches at least 0.8x the null sink's files/s; peak RSS at the
largest count at most 1.15x the smallest's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from harness import (
    Measured,
    alternating_rounds,
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    per_file,
    pinning,
    report_verified,
    run_measured,
    start_nginx,
    start_reference,
)

SPEED_BAR = 0.8
RSS_BAR = 1.15


def checksum(pairs: object) -> tuple[int, int, int]:
    """(files, bytes, sum of CRC-32(name + body) mod 2**64) of (name, body) pairs."""
    files = size = total = 0
    crc32 = zlib.crc32
    for name, body in pairs:  # type: ignore[attr-defined]
        files += 1
        size += len(body)
        total += crc32(body, crc32(name.encode()))
    return files, size, total % (1 << 64)


def row_stream(base: str, one_by_one: bool) -> dict[str, int]:
    from bulkfetch.streaming import Stream

    with Stream(base, workers=2, one_by_one=one_by_one) as bodies:
        files, size, total = checksum(bodies)
    return {"files": files, "bytes": size, "crc": total}


def expected_of(export: Path) -> dict[str, int]:
    files = sorted((export / "files").iterdir())
    found = checksum((path.name, path.read_bytes()) for path in files)
    return {"files": found[0], "bytes": found[1], "crc": found[2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-files", type=int, nargs="*", default=[200_000, 2_000_000])
    parser.add_argument("--row", nargs=2, metavar=("KIND", "BASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:  # one measured row, in its own process
        kind, base = args.row
        print(json.dumps(row_stream(base, one_by_one=kind == "each")))
        return 0
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-stream-"))
    export = work / "export"
    config, note = cached_export(args.files, export)
    if config is None:
        raise SystemExit(note)
    conf, _ = fit_open_file_cache(config, work, 64)
    expected = expected_of(export)
    me = [*place.client, sys.executable, str(Path(__file__).resolve())]
    nginx = start_nginx(place.server, conf)
    rows = {
        "bulkfetch get --sink null -w 2": [
            *place.client, *bulkfetch_command(), "get", nginx.url, str(work / "null"),
            "--sink", "null", "-w", "2", "-q", "--report", str(work / "null.json")],
        "bulkfetch.stream(workers=2)": [*me, "--row", "page", nginx.url],
        "stream, a message per body (pickled one by one)": [*me, "--row", "each", nginx.url],
    }

    def verify(label: str, run: Measured) -> str:
        if label.startswith("bulkfetch get"):
            return report_verified(work / "null.json", args.files, run, work / "null")
        found = json.loads(run.stdout.strip().splitlines()[-1]) \
            if run.returncode == 0 else {"files": 0, "bytes": 0, "crc": 0}
        if found != expected:
            log(run.stderr[-800:])
        return f"{'yes' if found == expected else 'NO'}: {found['files']:,} bodies, " \
               f"{found['bytes']:,} bytes, CRC sum " \
               f"{'equal' if found['crc'] == expected['crc'] else 'DIFFERS'}"

    try:
        subprocess.run(rows["bulkfetch.stream(workers=2)"], capture_output=True, timeout=600)
        measured, verified = alternating_rounds(rows, args.rounds, args.files, verify)
    finally:
        nginx.stop()

    memory: list[tuple[int, float, int, str]] = []
    try:
        for files in args.rss_files:
            server = start_reference(place.server, files, processes=1)
            try:
                run = run_measured([*me, "--row", "page", server.url], timeout=3600)
            finally:
                server.stop()
            found = json.loads(run.stdout.strip().splitlines()[-1]) \
                if run.returncode == 0 else {"files": 0}
            memory.append((files, files / run.seconds, run.peak_rss,
                           "yes" if found["files"] == files else f"NO: {found['files']:,}"))
            log(f"  memory: {files:,} files: {run.peak_rss / 2**20:.0f} MiB peak")
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)

    medians = per_file(measured, args.files)

    def rate(label: str) -> float:
        return medians[label][0]

    def cpu_us(label: str) -> float:
        return medians[label][1]

    print(f"{args.files:,} files of 100 bytes from nginx (static export); {place.note}; "
          f"median of {args.rounds} rounds, every other one in reverse order\n")
    print("| row | files/s | CPU µs/file | verified |\n|---|---:|---:|---|")
    for label in rows:
        print(f"| {label} | {rate(label):,.0f} | {cpu_us(label):.1f} | {verified[label]} |")
    null, stream, each = list(rows)
    speed = rate(stream) / rate(null)
    print(f"\n- [{'x' if speed >= SPEED_BAR else ' '}] stream files/s × get --sink null -w 2: "
          f"{speed:.2f} (>= {SPEED_BAR:g}); a message per body: "
          f"{rate(each) / rate(null):.2f}")
    if memory:
        print("\nbulkfetch.stream(workers=2) against bulkfetch serve (one process), peak RSS "
              "of the tree\n")
        print("| files | files/s | peak RSS MiB | all delivered |\n|---:|---:|---:|---|")
        for files, speed_of, rss, ok in memory:
            print(f"| {files:,} | {speed_of:,.0f} | {rss / 2**20:.0f} | {ok} |")
        growth = memory[-1][2] / memory[0][2]
        print(f"\n- [{'x' if growth <= RSS_BAR else ' '}] peak RSS at {memory[-1][0]:,} files "
              f"× at {memory[0][0]:,}: {growth:.2f} (<= {RSS_BAR})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
