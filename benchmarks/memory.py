"""Peak memory of `bulkfetch get` must not grow with the number of files:

    python benchmarks/memory.py [--small 100000] [--large 1000000] [--sink null]

The reference server (synthetic data, nothing on disk) serves each size; the client runs with
one worker. Peak RSS is the sum over the client's whole process tree (main process and
worker), sampled every 50 ms. The bar of the issue: the large run under 150 MB and within 10%
of the small one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from harness import bulkfetch_command, log, pinning, run_measured, start_reference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--sink", choices=["null", "dir"], default="null")
    args = parser.parse_args(argv)
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-memory-"))
    rows = []
    try:
        for files in (args.small, args.large):
            server = start_reference(place.server, files, processes=1)
            try:
                log(f"{files:,} files ...")
                report = work / f"report-{files}.json"
                measured = run_measured([*place.client, *bulkfetch_command(), "get", server.url,
                                         str(work / f"dest-{files}"), "--workers", "1",
                                         "--sink", args.sink, "-q", "--report", str(report)])
            finally:
                server.stop()
            done = json.loads(report.read_text())["files_ok"] if report.exists() else 0
            rows.append((files, measured, done))
            shutil.rmtree(work / f"dest-{files}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"bulkfetch get --workers 1 --sink {args.sink} against bulkfetch serve; "
          f"{place.note}\n")
    print("| files | done | seconds | files/s | CPU µs/file | peak RSS of the tree MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for files, measured, done in rows:
        print(f"| {files:,} | {done:,} | {measured.seconds:.1f} | "
              f"{files / measured.seconds:,.0f} | {measured.cpu_seconds / files * 1e6:.1f} | "
              f"{measured.peak_rss / 2**20:.1f} |")
    small, large = rows[0][1].peak_rss, rows[1][1].peak_rss
    growth = large / small - 1
    ok = large < 150 * 2**20 and abs(growth) <= 0.10
    print(f"\n- [{'x' if ok else ' '}] large run {large / 2**20:.1f} MB < 150 MB and within 10% "
          f"of the small run ({growth:+.1%})")
    return 0 if all(done == files for files, _, done in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
