"""Big files through `bulkfetch get`, side by side with curl and md5sum, in one run:

    python benchmarks/bigfiles.py [--files 8] [--size 1g] [--rounds 3] [--work DIR]

nginx serves a static export of FILES synthetic files of SIZE each (MD5 ETags from the
export's map), pinned to core 0; every client row runs pinned to core 1.

Speed (issue 18, "one big file over one connection"): rounds of `curl -o FILE` then
`md5sum FILE` (what a user does to fetch and check a file) beside `bulkfetch get` of the
same one URL into a directory with --parts 1 (one connection; it hashes while it writes),
in ABBA order. Each round's
ratios: bulkfetch MB/s over curl's; over curl's and md5sum's one after the other (the time
to a verified file); bulkfetch CPU over curl's + md5sum's. On one client core a download
that hashes is bound by CPU, so the first ratio is about curl's CPU over curl's + MD5's.

Memory (issue 18, "8 files of 1 GiB with --concurrency 64"): `bulkfetch get` of all FILES
with -c 64 and two workers into the dir sink, then the tar sink: the peak RSS of the whole
client tree, sampled every 50 ms, and every file's MD5 against the export's ETag (dir: each
file hashed; tar: each member read back with tarfile and hashed).

CPU is user + sys of each row's whole process tree; MB/s compares only within this run.
The files are served from the page cache after the export (they fit in memory here).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.bench.stats import verdict
from bulkfetch.util.sizes import parse_bytes
from harness import (
    Measured,
    bulkfetch_command,
    free_port,
    log,
    pinning,
    run_measured,
    settle,
    start_nginx,
)

MIB = 1 << 20
RSS_BAR_MB = 200  # issue 18: peak RSS of the client tree, 8 files of 1 GiB, -c 64
SPEED_BAR = 0.9  # bulkfetch MB/s >= 0.9 x curl -o
CPU_BAR = 1.2  # bulkfetch CPU <= 1.2 x (curl -o + md5sum)


@dataclass(frozen=True)
class Row:
    label: str
    bytes: int
    run: Measured

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MIB / self.run.seconds

    @property
    def cpu_s_per_gib(self) -> float:
        return self.run.cpu_seconds / (self.bytes / (1 << 30))


def export(files: int, size: str, directory: Path) -> tuple[str, dict[str, str]]:
    """(nginx.conf, name -> MD5) of an export of `files` files of `size`, reused when one
    of the same shape is there already."""
    marker = directory / f".complete-{files}-{size}"
    if not marker.exists():
        shutil.rmtree(directory, ignore_errors=True)
        log(f"exporting {files} files of {size} into {directory} ...")
        subprocess.run([*bulkfetch_command(), "serve", "--files", str(files), "--file-size",
                        size, "--port", str(free_port()), "--export-static", str(directory)],
                       check=True, capture_output=True)
        marker.touch()
    etags = dict(re.findall(r"/get/(\S+) '\"([0-9a-f]{32})\"'",
                            (directory / "etags.map").read_text()))
    return str(directory / "nginx.conf"), etags


def md5_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "md5").hexdigest()


def check_dir(dest: Path, etags: dict[str, str]) -> str:
    wrong = sum(md5_of(dest / name) != md5 for name, md5 in etags.items()
                if (dest / name).is_file())
    missing = sum(not (dest / name).is_file() for name in etags)
    return f"{len(etags) - missing - wrong} of {len(etags)} right, {missing} missing"


def check_tar(dest: Path, etags: dict[str, str]) -> str:
    seen: dict[str, str] = {}
    for shard in sorted(dest.glob("*.tar")):
        with tarfile.open(shard) as archive:
            for member in archive:
                reader = archive.extractfile(member)
                if reader is not None:
                    seen[member.name] = hashlib.file_digest(reader, "md5").hexdigest()
    right = sum(seen.get(name) == md5 for name, md5 in etags.items())
    return f"{right} of {len(etags)} right, {len(seen)} members"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size", default="1g", help="bytes of each file (k/m/g)")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds (ABBA order)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the export and downloads go [default: a new temp dir]")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory rows")
    parser.add_argument("--client-cores", choices=["one", "all"], default="one",
                        help="one: every client row pinned to core 1 (the standard setup); "
                             "all: the client rows may use every core (bulkfetch hashes on a "
                             "thread of its own beside the transfer, curl and md5sum do not)")
    args = parser.parse_args()
    size = parse_bytes(args.size)
    work = args.work or Path(tempfile.mkdtemp(prefix="bulkfetch-bigfiles-"))
    work.mkdir(parents=True, exist_ok=True)
    pin = pinning()
    config, etags = export(args.files, args.size, work / "export")
    nginx = start_nginx(pin.server, config)
    client = [*pin.client] if args.client_cores == "one" else []
    bulkfetch = [*client, *bulkfetch_command()]
    first = sorted(etags)[0]
    url = f"{nginx.url}/get/{first}"
    (work / "one.txt").write_text(url + "\n")
    rows: dict[str, list[Row]] = {"curl": [], "md5sum": [], "bulkfetch": []}
    memory: list[tuple[str, Measured, str]] = []
    try:
        run_measured([*client, "curl", "-s", "-o", "/dev/null", url])  # warm, unmeasured
        for number in range(args.rounds):
            order = ["pair", "bulkfetch"] if number % 2 == 0 else ["bulkfetch", "pair"]
            for which in order:
                target = work / "one"
                settle(target, pause=1.0)
                if which == "pair":
                    target.mkdir()
                    got = run_measured([*client, "curl", "-s", "-f", "-o",
                                        str(target / first), url])
                    rows["curl"].append(Row("curl -o FILE", size, got))
                    summed = run_measured([*client, "md5sum", str(target / first)])
                    rows["md5sum"].append(Row("md5sum FILE", size, summed))
                    ok = summed.stdout.split()[0] == etags[first]
                else:
                    got = run_measured([*bulkfetch, "get", "--from-file", str(work / "one.txt"),
                                        str(target), "-w", "1", "--quiet", "--parts", "1"])
                    rows["bulkfetch"].append(Row("bulkfetch get --parts 1 (dir)", size, got))
                    ok = got.returncode == 0 and md5_of(target / "get" / first) == etags[first]
                log(f"round {number + 1} {which}: {'verified' if ok else 'WRONG'}")
                if not ok:
                    raise SystemExit(f"round {number + 1}: {which} did not fetch {first} right")
        if not args.no_memory:
            for sink in ("dir", "tar"):
                dest = work / f"all-{sink}"
                settle(dest, work / "one", pause=1.0)
                got = run_measured([*bulkfetch, "get", nginx.url, str(dest), "--sink", sink,
                                    "-c", "64", "-w", "2", "--quiet"])
                checked = (check_dir if sink == "dir" else check_tar)(dest, etags)
                memory.append((sink, got, f"exit {got.returncode}; {checked}"))
                settle(dest, pause=0.5)
    finally:
        nginx.stop()
        if args.work is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
    report(args, size, pin.note, rows, memory)


def report(args: argparse.Namespace, size: int, placement: str, rows: dict[str, list[Row]],
           memory: list[tuple[str, Measured, str]]) -> None:
    if args.client_cores == "all":
        placement = placement.split(",")[0] + ", client on every core"
    print(f"\n## One file of {size / MIB:,.0f} MiB over one connection "
          f"(nginx, {placement}; median of {args.rounds} rounds)\n")
    print("| row | MB/s | CPU s per GiB | peak RSS MB |")
    print("|---|---:|---:|---:|")
    for group in rows.values():
        print(f"| {group[0].label} | {statistics.median(r.mb_per_s for r in group):,.0f} | "
              f"{statistics.median(r.cpu_s_per_gib for r in group):.2f} | "
              f"{max(r.run.peak_rss for r in group) / MIB:.0f} |")
    speed = [b.mb_per_s / c.mb_per_s for b, c in zip(rows["bulkfetch"], rows["curl"],
                                                       strict=True)]
    # A verified file: curl then md5sum, one after the other, against bulkfetch's one pass.
    verified = [c.run.seconds + m.run.seconds for c, m in zip(rows["curl"], rows["md5sum"],
                                                               strict=True)]
    to_verified = [t / b.run.seconds for b, t in zip(rows["bulkfetch"], verified, strict=True)]
    cpu = [b.run.cpu_seconds / (c.run.cpu_seconds + m.run.cpu_seconds)
           for b, c, m in zip(rows["bulkfetch"], rows["curl"], rows["md5sum"], strict=True)]
    # What bounds the first ratio from above. On one core, a client that checks MD5 as it
    # writes does curl's work and md5sum's on it: at best curl's CPU over the two. On more
    # cores MD5 is still sequential: at best md5sum's own rate over curl's.
    ceiling = ([c.run.cpu_seconds / (c.run.cpu_seconds + m.run.cpu_seconds)
                for c, m in zip(rows["curl"], rows["md5sum"], strict=True)]
               if args.client_cores == "one" else
               [m.mb_per_s / c.mb_per_s for c, m in zip(rows["curl"], rows["md5sum"],
                                                         strict=True)])
    if memory:
        print(f"\n## {args.files} files of {size / MIB:,.0f} MiB, -c 64, 2 workers\n")
        print("| sink | seconds | MB/s | peak RSS MB (client tree) | verified |")
        print("|---|---:|---:|---:|---|")
        for sink, run, checked in memory:
            print(f"| {sink} | {run.seconds:.1f} | "
                  f"{args.files * size / MIB / run.seconds:,.0f} | {run.peak_rss / MIB:.0f} | "
                  f"{checked} |")
    print()
    rounds = ", ".join(f"{value:.3f}" for value in speed)
    print(f"- [{'x' if statistics.median(speed) >= SPEED_BAR else ' '}] bulkfetch MB/s × curl -o "
          f"{statistics.median(speed):.3f} (>= {SPEED_BAR}; rounds {rounds}; "
          f"{verdict(speed, SPEED_BAR, at_most=False)})")
    rounds = ", ".join(f"{value:.3f}" for value in ceiling)
    how = ("curl's CPU × (curl's + md5sum's CPU): one core does both" if args.client_cores
           == "one" else "md5sum MB/s × curl -o MB/s: MD5 is sequential")
    at_most = statistics.median(ceiling)
    print(f"- its ceiling for a client that checks MD5 as it writes: {at_most:.3f} ({how}; "
          f"rounds {rounds})" + (f": under {SPEED_BAR}, no such client can meet that bar here"
                                 if at_most < SPEED_BAR else ""))
    rounds = ", ".join(f"{value:.3f}" for value in to_verified)
    print(f"- [{'x' if statistics.median(to_verified) >= SPEED_BAR else ' '}] bulkfetch MB/s × "
          f"(curl -o, then md5sum) {statistics.median(to_verified):.3f} (>= {SPEED_BAR}, the bar "
          f"proposed for a client on one core; rounds {rounds}; "
          f"{verdict(to_verified, SPEED_BAR, at_most=False)})")
    rounds = ", ".join(f"{value:.3f}" for value in cpu)
    print(f"- [{'x' if statistics.median(cpu) <= CPU_BAR else ' '}] bulkfetch CPU × (curl -o + "
          f"md5sum) {statistics.median(cpu):.3f} (<= {CPU_BAR}; rounds {rounds}; "
          f"{verdict(cpu, CPU_BAR, at_most=True)})")
    for sink, run, checked in memory:
        good = run.returncode == 0 and f"; {args.files} of {args.files} right" in checked
        print(f"- [{'x' if good and run.peak_rss < RSS_BAR_MB * MIB else ' '}] {sink}: peak RSS "
              f"{run.peak_rss / MIB:.0f} MB (< {RSS_BAR_MB}), {checked}")


if __name__ == "__main__":
    main()
