"""One big file in ranges, beside aria2c, from a server that paces each connection:

    python benchmarks/ranges.py [--size 4g] [--rate 40m] [--parts 8] [--work DIR]

The reference server (`bulkfetch serve --bandwidth-per-connection RATE`, one process on
core 0) serves one synthetic file of SIZE; every client row runs on core 1 into a fresh
directory and is checked against the server's MD5 ETag:

- `bulkfetch get` with --parts 1 (one connection) and with --parts N, and with --parts N
  --no-verify (sizes only, nothing hashed: the work aria2c does);
- `aria2c -x N -s N` (aria2 checks nothing: it has no digest to check), and the same
  followed by `md5sum` (what a user runs to know the file is right);
- `aria2c -x N -s N` with an MD5 of SIZE bytes beside it on its core, no faster than the
  server sends (MD5_BESIDE): aria2c doing the work bulkfetch does, hashing as it downloads;
- N `curl -r` ranges at once into /dev/null: what this server, on its one core, gives a
  client that neither writes nor checks anything (the ceiling of every row above).

Issue 18's bars: bulkfetch --parts N at least 6x its one-connection rate; at least aria2c's
MB/s; CPU per byte at most aria2c's. bulkfetch hashes every byte it stores (MD5 against the
ETag), so its CPU is also compared with aria2c + md5sum, and its MB/s with aria2c's when
aria2c's core hashes as much beside it: on one client core, whatever the writes into the
page cache cost (on this VM, from 0.1 to 2.5 s per GiB as its host backs new pages) is
paid from the same second as the MD5. The server hashes the whole body
once before its first answer: an unmeasured HEAD warms it. Where the ceiling is below 6x
one connection, the 6x bar measures the server's core, not the client. Before each row
that writes the file, harness.warm_memory() touches its size plus 2 GiB of free memory, so
that no row pays alone for memory the VM's host took back.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from bigfiles import MIB, Row, md5_of
from bulkfetch.util.sizes import parse_bytes
from harness import (
    bulkfetch_command,
    log,
    pinning,
    run_measured,
    settle,
    start_reference,
    warm_memory,
)

SPLIT_BAR = 6.0  # --parts N over one connection
# MD5 of SIZE bytes (a buffer of zeros, hashed like any bytes) no faster than RATE bytes/s
MD5_BESIDE = """import hashlib, sys, time
size, rate = int(sys.argv[1]), float(sys.argv[2])
block, digest, done, start = bytes(1 << 20), hashlib.md5(), 0, time.monotonic()
while done < size:
    ahead = start + done / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
    step = min(len(block), size - done)
    digest.update(block[:step])
    done += step
"""
NAME = "f0000000000"
WARM_SPARE = 2 << 30  # memory touched before a row beyond the file's size (harness.warm_memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4g", help="bytes of the file (k/m/g)")
    parser.add_argument("--rate", default="40m", help="the server's bytes/s per connection")
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of bulkfetch --parts N and aria2c, every other one in "
                             "reverse order (one connection and the ceiling run once)")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    size = parse_bytes(args.size)
    if shutil.which("aria2c") is None:
        raise SystemExit("aria2c is missing: apt-get install aria2")
    work = args.work or Path(tempfile.mkdtemp(prefix="bulkfetch-ranges-"))
    work.mkdir(parents=True, exist_ok=True)
    pin = pinning()
    server = start_reference(pin.server, 1, 1, extra=[
        "--file-size", args.size, "--bandwidth-per-connection", args.rate])
    url = f"{server.url}/get/{NAME}"
    (work / "one.txt").write_text(url + "\n")
    rows: dict[str, list[Row]] = {"split": [], "unverified": [], "single": [], "aria": [],
                                  "md5": [], "beside": [], "ceiling": []}
    checks: list[str] = []
    try:
        log(f"warming the server (it hashes the {args.size} body once) ...")
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=600) as answer:
            etag = answer.headers["ETag"].strip('"')
        bulkfetch = [*pin.client, *bulkfetch_command(), "get", "--from-file",
                     str(work / "one.txt"), "-w", "1", "--quiet", "--split-above", "1m"]

        def fetch(parts: int, *extra: str) -> None:
            dest = work / f"bulkfetch-{parts}"
            label = shlex.join(["bulkfetch", "--parts", str(parts), *extra])
            settle(dest, pause=1.0)
            log(f"{label} ...")
            warm_memory(size + WARM_SPARE)
            run = run_measured([*bulkfetch, str(dest), "--parts", str(parts), *extra])
            right = run.returncode == 0 and md5_of(dest / "get" / NAME) == etag  # (untimed)
            key = "unverified" if extra else "split" if parts > 1 else "single"
            rows[key].append(Row(label, size, run))
            checks.append(f"{label}: {'right' if right else 'WRONG'}")
            settle(dest, pause=1.0)

        def aria2c_command(dest: Path) -> list[str]:
            return ["aria2c", "-q", f"-x{args.parts}", f"-s{args.parts}",
                    "--file-allocation=none", "--allow-overwrite=true",
                    "--auto-file-renaming=false", "-d", str(dest), "-o", NAME, url]

        def aria2c() -> None:
            dest = work / "aria2c"
            settle(dest, pause=1.0)
            log(f"aria2c -x {args.parts} -s {args.parts} ...")
            warm_memory(size + WARM_SPARE)
            aria = run_measured([*pin.client, *aria2c_command(dest)])
            rows["aria"].append(Row(f"aria2c -x{args.parts} -s{args.parts}", size, aria))
            summed = run_measured([*pin.client, "md5sum", str(dest / NAME)])
            right = aria.returncode == 0 and summed.stdout.split()[:1] == [etag]
            checks.append(f"aria2c: {'right' if right else 'WRONG'}")
            rows["md5"].append(Row("md5sum FILE (after aria2c)", size, summed))
            settle(dest, pause=0.5)

        def aria2c_hashing() -> None:
            dest = work / "aria2c-md5"
            settle(dest, pause=1.0)
            log(f"aria2c -x {args.parts} -s {args.parts}, MD5 beside it ...")
            warm_memory(size + WARM_SPARE)
            hashing = [sys.executable, "-c", MD5_BESIDE, str(size),
                       str(parse_bytes(args.rate) * args.parts)]
            line = f"{shlex.join(aria2c_command(dest))} & {shlex.join(hashing)} & wait"
            both = run_measured([*pin.client, "sh", "-c", line])
            rows["beside"].append(Row(f"aria2c -x{args.parts} -s{args.parts}, MD5 beside it",
                                      size, both))
            right = both.returncode == 0 and md5_of(dest / NAME) == etag
            checks.append(f"aria2c, MD5 beside it: {'right' if right else 'WRONG'}")
            settle(dest, pause=0.5)

        for number in range(args.rounds):
            log(f"round {number + 1} of {args.rounds}")
            steps = [lambda: fetch(args.parts), aria2c, aria2c_hashing,
                     lambda: fetch(args.parts, "--no-verify")]
            for step in steps if number % 2 == 0 else steps[::-1]:
                step()
        fetch(1)
        log(f"{args.parts} x curl -r into /dev/null ...")
        ceiling = run_measured([*pin.client, "sh", "-c", curl_ranges(url, size, args.parts)])
        got = sum(int(n) for n in ceiling.stdout.split())
        rows["ceiling"].append(Row(f"{args.parts} x curl -r, into /dev/null", size, ceiling))
        checks.append(f"curl ranges: {'all bytes' if got == size else f'{got:,} bytes'}")
    finally:
        server.stop()
        if args.work is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
    report(args, size, pin.note, rows, checks)


def curl_ranges(url: str, size: int, parts: int) -> str:
    """A shell line that fetches `size` bytes of `url` as `parts` ranges at once, printing
    each range's byte count."""
    step = -(-size // parts)
    fetches = [f"curl -s -r {start}-{min(start + step, size) - 1} -o /dev/null "
               f"-w '%{{size_download}}\\n' {url} &" for start in range(0, size, step)]
    return " ".join(fetches) + " wait"


def report(args: argparse.Namespace, size: int, placement: str, rows: dict[str, list[Row]],
           checks: list[str]) -> None:
    def mb(key: str) -> float:
        return statistics.median(row.mb_per_s for row in rows[key])

    def cpu(key: str) -> float:
        return statistics.median(row.cpu_s_per_gib for row in rows[key])

    print(f"\n## One file of {size / MIB:,.0f} MiB, server paced to {args.rate}/s per "
          f"connection ({placement}); median of {args.rounds} rounds of the first rows\n")
    print("| row | MB/s | CPU s per GiB | peak RSS MB | MB/s by round |")
    print("|---|---:|---:|---:|---|")
    for key in ("split", "aria", "md5", "beside", "unverified", "single", "ceiling"):
        found = rows[key]
        print(f"| {found[0].label} | {mb(key):,.0f} | {cpu(key):.2f} | "
              f"{max(row.run.peak_rss for row in found) / MIB:.0f} | "
              f"{', '.join(f'{row.mb_per_s:,.0f}' for row in found)} |")
    wrong = [check for check in checks if "WRONG" in check
             or ("bytes" in check and "all bytes" not in check)]
    print()
    print(f"- checked against the ETag: {len(checks) - len(wrong)} of {len(checks)} runs right"
          + (f"; {'; '.join(wrong)}" if wrong else ""))
    ratio = mb("split") / mb("single")
    print(f"- [{'x' if ratio >= SPLIT_BAR else ' '}] --parts {args.parts} × one connection "
          f"{ratio:.2f} (>= {SPLIT_BAR})")
    print(f"- the server's ceiling: {args.parts} x curl -r × bulkfetch's one connection "
          f"{mb('ceiling') / mb('single'):.2f}; bulkfetch --parts {args.parts} × that "
          f"ceiling {mb('split') / mb('ceiling'):.3f}, aria2c × it "
          f"{mb('aria') / mb('ceiling'):.3f}")
    # Bars between bulkfetch and aria2c: the median of each round's ratio (the rows ran
    # next to each other)
    def per_round(top: str, bottom: str, unit: str) -> list[float]:
        return [getattr(a, unit) / getattr(b, unit)
                for a, b in zip(rows[top], rows[bottom], strict=True)]

    def bar(label: str, ratios: list[float], most: bool, note: str) -> None:
        ratio = statistics.median(ratios)
        met = ratio <= 1 if most else ratio >= 1
        print(f"- [{'x' if met else ' '}] {label} {ratio:.3f} ({'<=' if most else '>='} 1"
              f"{note}; by round {', '.join(f'{r:.3f}' for r in ratios)})")

    bar("bulkfetch MB/s × aria2c", per_round("split", "aria", "mb_per_s"), False, "")
    beside = per_round("beside", "aria", "mb_per_s")
    print(f"- aria2c with MD5 beside it on its core × aria2c alone {statistics.median(beside):.3f}"
          f" (by round {', '.join(f'{r:.3f}' for r in beside)}): what hashing while it "
          f"downloads costs aria2c on this core")
    bar("bulkfetch MB/s × (aria2c, MD5 beside it)", per_round("split", "beside", "mb_per_s"),
        False, ", the bar proposed: the same work on the same core")
    bar("bulkfetch --no-verify MB/s × aria2c", per_round("unverified", "aria", "mb_per_s"),
        False, ": the same work, neither hashes")
    bar("bulkfetch --no-verify CPU per byte × aria2c",
        per_round("unverified", "aria", "cpu_s_per_gib"), True, "")
    # (aria2c's seconds + md5sum's) / bulkfetch's: MB/s to a file known to be right
    bar("bulkfetch MB/s × (aria2c, then md5sum)",
        [(b.run.seconds + m.run.seconds) / a.run.seconds
         for a, b, m in zip(rows["split"], rows["aria"], rows["md5"], strict=True)],
        False, ", the bar proposed: the same verified file")
    bar("bulkfetch CPU per byte × aria2c", per_round("split", "aria", "cpu_s_per_gib"), True,
        "; aria2c checks no digest")
    bar("bulkfetch CPU per byte × (aria2c + md5sum)",
        [a.cpu_s_per_gib / (b.cpu_s_per_gib + m.cpu_s_per_gib)
         for a, b, m in zip(rows["split"], rows["aria"], rows["md5"], strict=True)],
        True, ", the bar proposed for a download that is verified")

if __name__ == "__main__":
    main()
