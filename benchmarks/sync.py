"""`bulkfetch get --sync` after a change at the source, the server's access log as witness
(issue 24):

    python benchmarks/sync.py [--files 100000] [--rate 0.01] [--grow 0.01]

1. `bulkfetch get` of the reference server's data set at epoch 1 (`--files N`) into DEST;
2. the server restarted on the same port at `--epoch 2 --mutate-rate RATE` with N x (1 +
   GROW) files, and `bulkfetch get --sync` into the same DEST;
3. a fresh `bulkfetch get` of epoch 2 into another directory, for comparison.

The table: what the sync asked for (200s and 304s in the log) against what
mutated_indices() says changed plus the new files, how many of DEST's other files kept their
inode and mtime, whether DEST then equals the fresh download byte for byte, and the time and
CPU of the sync against the fresh download. Bars: the 200s are exactly the changed and new
files; every other file is untouched; DEST equals the fresh download.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from harness import bulkfetch_command, log, run_measured

try:
    import bulkfetch  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.server.dataset import SyntheticDataSet, mutated_indices
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port
from bulkfetch.util.sizes import parse_size_spec

SEED = 11


def files_of(dest: Path) -> dict[str, tuple[int, int, str]]:
    """name -> (inode, mtime ns, MD5) of every file directly in DEST."""
    found = {}
    for entry in os.scandir(dest):
        if entry.is_file(follow_symlinks=False):
            status = entry.stat(follow_symlinks=False)
            with open(entry.path, "rb") as body:
                digest = hashlib.md5(body.read()).hexdigest()
            found[entry.name] = (status.st_ino, status.st_mtime_ns, digest)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--grow", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    grown = int(args.files * (1 + args.grow))
    port = ("--port", str(free_port()))
    common = ("--seed", str(SEED), "--file-size", "100")
    epoch_2 = ("--files", str(grown), *common, "--epoch", "2", "--mutate-rate", str(args.rate))
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-sync-"))
    dest, fresh = work / "dest", work / "fresh"

    def get(url: str, target: Path, *extra: str) -> tuple[dict[str, object], float, float]:
        report = work / "report.json"
        run = run_measured([*bulkfetch_command(), "get", url, str(target), "-w",
                            str(args.workers), "-q", "--report", str(report), *extra])
        if run.returncode != 0:
            raise SystemExit(f"bulkfetch get {' '.join(extra)} failed: {run.stderr[-800:]}")
        return json.loads(report.read_text()), run.seconds, run.cpu_seconds

    with ReferenceServer(*port, "--files", str(args.files), *common) as server:
        first, first_s, _ = get(server.url, dest)
    log(f"epoch 1: {first['files_ok']:,} files in {first_s:.1f} s")
    before = files_of(dest)
    with ReferenceServer(*port, *epoch_2, access_log=True) as server:
        synced, sync_s, sync_cpu = get(server.url, dest, "--sync")
        asked: dict[int, set[str]] = {}
        for request in server.requests():
            if request.target.startswith("/get/"):
                asked.setdefault(request.status, set()).add(request.target[5:])
        again, fresh_s, fresh_cpu = get(server.url, fresh)
    after, fresh_files = files_of(dest), files_of(fresh)
    data = SyntheticDataSet(grown, 1000, SEED, parse_size_spec("100"))
    changed = {data.name(i) for i in mutated_indices(SEED, args.files, args.rate, 1, 2)}
    new = {data.name(i) for i in range(args.files, grown)}
    fetched, not_modified = asked.get(200, set()), asked.get(304, set())
    others = set(before) - changed
    untouched = sum(1 for name in others if after.get(name, (0, 0, ""))[:2] == before[name][:2])
    equal = {name: value[2] for name, value in after.items()} == \
        {name: value[2] for name, value in fresh_files.items()}
    exact = fetched == changed | new

    print(f"bulkfetch serve, {args.files:,} files of 100 bytes at epoch 1, then epoch 2 with "
          f"--mutate-rate {args.rate:g} and {grown - args.files:,} new files; "
          f"-w {args.workers}\n")
    print("| | count |\n|---|---:|")
    print(f"| files at epoch 2 | {grown:,} |")
    print(f"| changed since epoch 1 (mutated_indices) | {len(changed):,} |")
    print(f"| new | {len(new):,} |")
    print(f"| sync: bodies fetched (200s in the log) | {len(fetched):,} |")
    print(f"| sync: answered 304 | {len(not_modified):,} |")
    print(f"| sync report: files in step, unchanged | {synced['files_ok']:,}, "
          f"{synced['unchanged']:,} |")
    print(f"| other files with the same inode and mtime | {untouched:,} of {len(others):,} |")
    print(f"| other statuses in the log | {sorted(set(asked) - {200, 304})} |")
    print("\n| run | seconds | CPU s |\n|---|---:|---:|")
    print(f"| get --sync (epoch 1 -> 2) | {sync_s:.2f} | {sync_cpu:.2f} |")
    print(f"| fresh get of epoch 2 | {fresh_s:.2f} | {fresh_cpu:.2f} |")
    print(f"\n- [{'x' if exact else ' '}] the sync fetched exactly the changed and new files "
          f"({len(fetched & (changed | new)):,} of {len(changed | new):,}, "
          f"{len(fetched - changed - new):,} others)")
    print(f"- [{'x' if untouched == len(others) else ' '}] every other file untouched "
          "(inode and mtime)")
    print(f"- [{'x' if equal else ' '}] DEST equals a fresh download of epoch 2 "
          f"({len(after):,} files, {again['files_ok']:,} fetched fresh)")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if exact and equal and untouched == len(others) else 1


if __name__ == "__main__":
    sys.exit(main())
