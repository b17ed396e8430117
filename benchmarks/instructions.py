"""Instructions per file, counted by callgrind: the noise-free companion of get.py.

    python benchmarks/instructions.py [--small 10000] [--large 30000] [--export-root DIR]

Why: on a shared VM the CPU time of one row swings by ±20% from run to run (other guests
evict the caches), so get.py's ratios move by more than most changes do. Instructions do
not. Each row (the bare pycurl multi loop, bulkfetch null and tar with one worker) runs
under `valgrind --tool=callgrind --trace-children=yes` against nginx serving a static
export, at two sizes; the difference of the whole tree's instructions divided by the
difference in files is the marginal cost of one file, with start-up and exit cancelled
out. Counts are user-space instructions only: the kernel's share (send, recv, write) and
cache misses are not in them, which is why get.py stays the measure of the issues' bars.
Needs valgrind (apt-get install valgrind); a row takes a minute or two.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bulkfetch.sinks.ustar import PACKER_NOTE
from harness import (
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    pinning,
    start_nginx,
)

HERE = Path(__file__).resolve().parent
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def tree_instructions(command: list[str], work: Path) -> int:
    """Instructions of `command` and every process it starts (callgrind, user space)."""
    out = work / "callgrind"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    done = subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes",
                           f"--callgrind-out-file={out}/cg.%p", *command],
                          capture_output=True, timeout=3600)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"{command[0]} ... exited {done.returncode} under valgrind: "
                         + " | ".join(tail))
    total = 0
    for file in out.iterdir():
        match = _TOTAL.search(file.read_bytes())
        if match is not None:
            total += int(match.group(1))
    return total


def export(files: int, root: Path) -> str:
    config, note = cached_export(files, root / f"export-{files}")
    if config is None:
        raise SystemExit(note)
    if note:
        log(note)
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=30_000)
    parser.add_argument("--export-root", type=Path, default=None,
                        help="keep (and reuse) the two nginx exports here")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if not 0 < args.small < args.large:
        raise SystemExit("--small must be positive and below --large")
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-instr-"))
    root = args.export_root or work
    rows = {
        "bare pycurl loop (memory)": lambda url, n, dest: [
            sys.executable, str(HERE / "baselines.py"), "pycurl", url, str(n)],
        "bulkfetch null, 1 worker": lambda url, n, dest: [
            *bulkfetch_command(), "get", url, str(dest), "--workers", "1", "--sink", "null",
            "-q"],
        "bulkfetch tar, 1 worker": lambda url, n, dest: [
            *bulkfetch_command(), "get", url, str(dest), "--workers", "1", "--sink", "tar",
            "-q"],
    }
    counts: dict[str, dict[int, int]] = {name: {} for name in rows}
    try:
        for files in (args.small, args.large):
            conf, note = fit_open_file_cache(export(files, root), work, 64)
            if note:
                log(note)
            nginx = start_nginx(place.server, conf)
            try:
                for name, command in rows.items():
                    log(f"  {name}, {files:,} files ...")
                    dest = work / "dest"
                    shutil.rmtree(dest, ignore_errors=True)
                    counts[name][files] = tree_instructions(
                        [*place.client, *command(nginx.url, files, dest)], work)
            finally:
                nginx.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(counts, args.small, args.large, f"{place.note}; tar packer: {PACKER_NOTE}"))
    return 0


def table(counts: dict[str, dict[int, int]], small: int, large: int, placement: str) -> str:
    per_file = {name: (c[large] - c[small]) / (large - small) for name, c in counts.items()}
    bare = per_file["bare pycurl loop (memory)"]
    null = per_file["bulkfetch null, 1 worker"]
    lines = [
        f"Marginal instructions per file (callgrind, whole process tree, {small:,} vs "
        f"{large:,} files of 100 bytes from nginx); {placement}",
        "",
        "| row | instructions/file | × bare pycurl | × bulkfetch null |",
        "|---|---:|---:|---:|",
    ]
    for name, value in per_file.items():
        lines.append(f"| {name} | {value:,.0f} | {value / bare:.3f} | {value / null:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
