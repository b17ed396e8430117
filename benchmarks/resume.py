"""kill -9 at about half of a big download, then the same command again:

    python benchmarks/resume.py [--size 4g] [--rate 40m] [--parts 8] [--work DIR]

The reference server (paced to RATE per connection, access log on) serves one file of
SIZE. `bulkfetch get` runs until its partial record says about half the file is written,
and its whole process group is killed with SIGKILL; the same command then runs to the end.
The access log says how many bytes the rerun asked for (issue 18: at most 55% of the
file), and the result is checked against the server's MD5 ETag.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from bigfiles import MIB, md5_of
from bulkfetch.engine import resume
from bulkfetch.testing import LoggedRequest
from bulkfetch.util.sizes import parse_bytes
from harness import bulkfetch_command, log, pinning, run_measured, start_reference

BAR = 0.55
NAME = "f0000000000"


def asked_bytes(log_path: Path, since: int) -> tuple[int, int, list[int]]:
    """(requests in the log, bytes asked for the file after request `since`, statuses)."""
    lines = log_path.read_text().splitlines()
    asked = [LoggedRequest.parse(line) for line in lines[since:]]
    asked = [r for r in asked if r.target.startswith("/get/")]
    return len(lines), sum(r.length for r in asked), [r.status for r in asked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4g")
    parser.add_argument("--rate", default="40m")
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    size = parse_bytes(args.size)
    work = args.work or Path(tempfile.mkdtemp(prefix="bulkfetch-resume-"))
    shutil.rmtree(work / "dest", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    access = work / "access.log"
    access.unlink(missing_ok=True)
    pin = pinning()
    server = start_reference(pin.server, 1, 1, extra=[
        "--file-size", args.size, "--bandwidth-per-connection", args.rate,
        "--access-log", str(access)])
    dest = work / "dest"
    command = [*pin.client, *bulkfetch_command(), "get", server.url, str(dest), "-w", "1",
               "--quiet", "--parts", str(args.parts)]
    try:
        log(f"warming the server (it hashes the {args.size} body once) ...")
        request = urllib.request.Request(f"{server.url}/get/{NAME}", method="HEAD")
        with urllib.request.urlopen(request, timeout=600) as answer:
            etag = answer.headers["ETag"].strip('"')
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
        kept, started = 0, time.monotonic()
        while first.poll() is None:
            found = resume.records(dest)
            if found and found[0].written >= size // 2:
                kept = found[0].written
                os.killpg(first.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        first.wait()
        killed_after = time.monotonic() - started
        if not kept:
            raise SystemExit("the first run ended before half the file was recorded")
        log(f"killed after {killed_after:.1f} s with {kept / MIB:,.0f} MiB recorded written")
        since, _, _ = asked_bytes(access, 0)
        rerun = run_measured(command)
        _, asked, statuses = asked_bytes(access, since)
        right = rerun.returncode == 0 and md5_of(dest / NAME) == etag
    finally:
        server.stop()
        if args.work is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
    print(f"\n## kill -9 at half of one file of {size / MIB:,.0f} MiB, --parts {args.parts}, "
          f"server paced to {args.rate}/s per connection ({pin.note})\n")
    print("| run | seconds | bytes of the file asked | share of the file | answers |")
    print("|---|---:|---:|---:|---|")
    print(f"| first, killed | {killed_after:.1f} | - | {kept / size:.1%} recorded | - |")
    print(f"| rerun | {rerun.seconds:.1f} | {asked:,} | {asked / size:.1%} | "
          f"{', '.join(f'{s}' for s in sorted(set(statuses)))} |")
    print()
    print(f"- [{'x' if right else ' '}] the rerun ends byte-exact (MD5 = ETag), exit "
          f"{rerun.returncode}")
    print(f"- [{'x' if asked <= BAR * size else ' '}] the rerun asked for {asked / size:.1%} "
          f"of the file (<= {BAR:.0%})")


if __name__ == "__main__":
    main()
