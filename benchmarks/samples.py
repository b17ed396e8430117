"""Whole webdataset samples through faults and kill -9 (issue 19's first acceptance):

    python benchmarks/samples.py [--samples 20000] [--kills 2] [--seed S]

A tree of SAMPLES samples of 1-3 members (nested directories, multi-dot extensions:
bulkfetch.testing.write_sample_tree) is served by `bulkfetch serve --root` with
`--fail-rate 0.02 --reset-rate 0.01`, pages of 100 names. `bulkfetch get --sink tar
--shard-files 200 -w 2` runs, is killed with SIGKILL (the whole process group) at KILLS
random moments (a random number of pages journaled done), and runs again to the end. The
webdataset package then reads the shards: the bar is exactly SAMPLES samples, each with
every member its source has, bytes equal (MD5). The same is done without kills, for the
time of one clean run beside.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bulkfetch.testing import ReferenceServer, read_samples, write_sample_tree
from harness import pages_done

PAGE = 100


def command(url: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "bulkfetch", "get", url, str(dest), "--sink", "tar",
            "--shard-files", "200", "-w", "2", "--quiet"]


def killed_at(url: str, dest: Path, moment: int) -> int:
    """Run until `moment` pages are done, then SIGKILL the process group; pages done then."""
    run = subprocess.Popen(command(url, dest), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    done = 0
    while done < moment and run.poll() is None:
        done = pages_done(dest)
        time.sleep(0.005)
    if run.poll() is not None:
        raise SystemExit(f"the run ended (exit {run.returncode}) before {moment} pages")
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    return pages_done(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None, help="of the kill moments")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-samples-"))
    expected = write_sample_tree(work / "src", args.samples, seed=19)
    members = sum(map(len, expected.values()))
    pages = -(-members // PAGE)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    moments = sorted(rng.sample(range(2, pages - 2), args.kills))
    rows = []
    with ReferenceServer("--root", str(work / "src"), "--page-size", str(PAGE),
                         "--fail-rate", "0.02", "--reset-rate", "0.01") as server:
        for label, kills in (("one run", []), (f"kill -9 at {args.kills} moments, rerun",
                                                moments)):
            dest = work / f"dest-{len(rows)}"
            started = time.monotonic()
            at = [killed_at(server.url, dest, moment) for moment in kills]
            final = subprocess.run(command(server.url, dest), capture_output=True, text=True)
            elapsed = time.monotonic() - started
            if final.returncode != 0:
                raise SystemExit(f"{label}: exit {final.returncode}: {final.stderr}")
            count, found = read_samples(dest)
            whole = sum(found.get(key) == want for key, want in expected.items())
            shards = len(list(dest.glob("shard-*.tar")))
            rows.append((label, ", ".join(f"{d} of {pages}" for d in at) or "-", count,
                         whole, shards, elapsed))
    print(f"{args.samples:,} samples ({members:,} members) from `bulkfetch serve --root` "
          f"with --fail-rate 0.02 --reset-rate 0.01, pages of {PAGE}; `get --sink tar "
          f"--shard-files 200 -w 2`; kill moments seeded {seed}\n")
    print("| run | pages done at each kill | samples webdataset reads | whole and equal "
          "| shards | s, all runs |")
    print("|---|---|---:|---:|---:|---:|")
    for label, at, count, whole, shards, elapsed in rows:
        print(f"| {label} | {at} | {count:,} | {whole:,} | {shards} | {elapsed:.1f} |")
    ok = all(count == args.samples == whole for _, _, count, whole, *_ in rows)
    print(f"\n- [{'x' if ok else ' '}] exactly {args.samples:,} samples, each whole and "
          "equal to its source, in every run")


if __name__ == "__main__":
    main()
