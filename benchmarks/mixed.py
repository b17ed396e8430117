"""Mixed sizes through server faults, checked file by file, with the client's peak memory:

    python benchmarks/mixed.py [--files 20000] [--sizes lognormal:8k:3.2:2g] [--work DIR]

The reference server (two processes) serves FILES synthetic files whose sizes follow SIZES
(by default 0 bytes to 2 GiB, 23.5 GiB in all), failing, truncating, corrupting and
resetting answers at the rates of issue 18 (2%, 1%, 1%, 1%). `bulkfetch get` (dir sink,
defaults) fetches them all; the peak RSS of its whole process tree is sampled every 50 ms;
then every file is compared with the data set's formula (streamed, so a 2 GiB body needs
no 2 GiB of memory).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from bigfiles import MIB, md5_of
from bulkfetch.server.dataset import SyntheticDataSet, SyntheticEntry
from bulkfetch.util.sizes import parse_size_spec
from harness import bulkfetch_command, log, run_measured, start_reference

FAULTS = ["--fail-rate", "0.02", "--truncate-rate", "0.01", "--corrupt-rate", "0.01",
          "--reset-rate", "0.01"]
RSS_BAR_MB = 250


def expected_md5(data: SyntheticDataSet, index: int) -> str:
    size = data.size(index)
    digest = hashlib.md5()
    for chunk in SyntheticEntry(data, index, size).read(0, size):
        digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--sizes", default="lognormal:8k:3.2:2g")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bulkfetch-mixed-"))
    dest = work / "dest"
    shutil.rmtree(dest, ignore_errors=True)
    data = SyntheticDataSet(args.files, 1000, 0, parse_size_spec(args.sizes))
    sizes = [data.size(i) for i in range(args.files)]
    log(f"{args.files:,} files, {sum(sizes) / MIB:,.0f} MiB, from {min(sizes):,} to "
        f"{max(sizes):,} bytes")
    server = start_reference([], args.files, 2, extra=["--file-size", args.sizes, *FAULTS])
    try:
        run = run_measured([*bulkfetch_command(), "get", server.url, str(dest), "--quiet",
                            "--report", str(work / "report.json")])
    finally:
        server.stop()
    report = json.loads((work / "report.json").read_text())
    log("checking every file against the formula ...")
    wrong = missing = 0
    for index in range(args.files):
        path = dest / data.name(index)
        if not path.is_file():
            missing += 1
        elif md5_of(path) != expected_md5(data, index):
            wrong += 1
    if args.work is None:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    print(f"\n## {args.files:,} files, sizes {args.sizes} ({sum(sizes) / MIB:,.0f} MiB, "
          f"largest {max(sizes) / MIB:,.0f} MiB), faults {' '.join(FAULTS)}\n")
    print("| seconds | MB/s | peak RSS MB (client tree) | retries | files ok | failed | "
          "wrong | missing |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {run.seconds:.0f} | {sum(sizes) / MIB / run.seconds:,.0f} | "
          f"{run.peak_rss / MIB:.0f} | {report['retries']:,} | {report['files_ok']:,} | "
          f"{report['files_failed']:,} | {wrong:,} | {missing:,} |")
    print()
    good = run.returncode == 0 and wrong == missing == 0
    print(f"- [{'x' if good else ' '}] exit {run.returncode}, every file right")
    print(f"- [{'x' if run.peak_rss < RSS_BAR_MB * MIB else ' '}] peak RSS "
          f"{run.peak_rss / MIB:.0f} MB (< {RSS_BAR_MB})")


if __name__ == "__main__":
    main()
