"""Speed of `bulkfetch hash` beside md5sum, sha256sum and single-thread BLAKE3, in one run:

    python benchmarks/hash.py [--quick] [--dir DIR] [--files 2000] [--min-size 1m]
        [--max-size 10m] [--huge-size 4g] [--rounds 3] [--sweep-workers] [--out DIR]

Two data sets, generated once into --dir and reused while their parameters match: many
files (--files of --min-size to --max-size bytes, sizes uniform at random under a fixed seed)
and one huge file (--huge-size). Rows, each a whole command measured from outside (wall time;
CPU = user + sys of its process tree from RUSAGE_CHILDREN):

- many files: md5sum over every file (one process), `bulkfetch hash --workers 1` and
  `--workers 2` over the same list; sha256sum and `bulkfetch hash --algo sha256 --workers 2`.
- one huge file: md5sum and `bulkfetch hash`; BLAKE3 in one thread as b3sum does it (the
  blake3 package, max_threads=1, the file mapped) and with 128 KiB reads, and
  `bulkfetch hash --algo blake3` (all cores).

Everything is read from the page cache: the data must fit in RAM, and each row runs once
untimed first so that every row compares warm. Rounds run the rows of a group next to each
other, every other round in reverse order (ABBA); a bar is the median over rounds of the
ratio within a round, with a distribution-free interval when there are rounds enough. Every
bulkfetch output is compared with the reference tool's, byte for byte. --sweep-workers runs
`bulkfetch hash --workers 1..2N` on the many files and plots MB/s against workers (the
parallel-storage question: how many processes pay off). The table goes to stdout and, with
the plot, into --out (default benchmarks/results/<date>-<machine>-hash[-quick]).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.bench.machine import cpu_model, describe, memory_gb, slug
from bulkfetch.util.sizes import parse_bytes
from harness import Measured, bulkfetch_command, log, run_measured, verdict

HERE = Path(__file__).resolve().parent
SEED = 18
B3_SINGLE_MAPPED = ("import sys\nfrom blake3 import blake3\n"
                    "h = blake3(max_threads=1)\nh.update_mmap(sys.argv[1])\n"
                    "print(f'{h.hexdigest()}  {sys.argv[1]}')\n")
B3_SINGLE_READ = ("import os, sys\nfrom blake3 import blake3\n"
                  "h = blake3(max_threads=1)\nbuf = bytearray(1 << 17)\n"
                  "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                  "while n := os.readv(fd, [buf]):\n"
                  "    h.update(memoryview(buf)[:n])\n"
                  "print(f'{h.hexdigest()}  {sys.argv[1]}')\n")


@dataclass
class Row:
    name: str
    command: list[str]
    nbytes: int
    base: str | None = None  # the row its ratio is taken against
    same_as: str | None = None  # the row whose output must be identical
    runs: list[Measured] = field(default_factory=list)

    def median(self, value: str) -> float:
        return statistics.median(getattr(run, value) for run in self.runs)

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.median("seconds") / 1e6

    @property
    def cpu_per_gb(self) -> float:
        return self.median("cpu_seconds") / (self.nbytes / 1e9)


# -- data -------------------------------------------------------------------------------------

def many_files(directory: Path, files: int, low: int, high: int) -> list[str]:
    """Generate (or reuse) `files` files of random sizes in [low, high]; their names."""
    rng = random.Random(SEED)
    sizes = [rng.randint(low, high) for _ in range(files)]
    names = [f"f{i:06d}" for i in range(files)]
    manifest = directory / "manifest.json"
    wanted = {"files": files, "low": low, "high": high, "seed": SEED}
    if _reusable(manifest, wanted, [(directory / n, s) for n, s in zip(names, sizes, strict=True)]):
        log(f"reusing {files:,} files in {directory}")
        return names
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    block = rng.randbytes(high)
    log(f"writing {files:,} files, {sum(sizes) / 1e9:.1f} GB, into {directory}")
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        with open(directory / name, "wb") as out:  # a distinct head, a shared random body
            out.write(i.to_bytes(16, "little") + block[16:size])
    manifest.write_text(json.dumps(wanted))
    return names


def huge_file(path: Path, size: int) -> None:
    manifest = path.with_suffix(".json")
    wanted = {"size": size, "seed": SEED}
    if _reusable(manifest, wanted, [(path, size)]):
        log(f"reusing {path}")
        return
    log(f"writing {path}, {size / 2**30:.1f} GiB")
    block = random.Random(SEED).randbytes(64 << 20)
    with open(path, "wb") as out:
        for number, at in enumerate(range(0, size, len(block))):
            out.write(number.to_bytes(8, "little") + block[8:min(len(block), size - at)])
    manifest.write_text(json.dumps(wanted))


def _reusable(manifest: Path, wanted: dict[str, int], files: list[tuple[Path, int]]) -> bool:
    try:
        if json.loads(manifest.read_text()) != wanted:
            return False
        return all(path.stat().st_size == size for path, size in files)
    except (OSError, ValueError):
        return False


def check_room(directory: Path, needed: int) -> None:
    """Stop before generating data that the disk cannot hold; warn when the page cache
    cannot hold it (the rows would then measure the disk, differently each time)."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed + (1 << 30):
        sys.exit(f"{directory}: {free / 1e9:.1f} GB free, the data needs {needed / 1e9:.1f} GB "
                 "(+1 GB): choose another --dir or smaller sizes")
    available = _mem_available()
    if available is not None and needed > 0.8 * available:
        log(f"WARNING: the data ({needed / 1e9:.1f} GB) is more than 80% of the available "
            f"memory ({available / 1e9:.1f} GB): rows may read from disk, not the page cache")


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# -- running ----------------------------------------------------------------------------------

def run_group(rows: list[Row], rounds: int, cwd: Path) -> None:
    """Each row once untimed (warm), then `rounds` rounds, every other one reversed."""
    for row in rows:
        log(f"  warm: {row.name}")
        _checked(row, run_measured(row.command, cwd=cwd))
    for number in range(rounds):
        for row in rows if number % 2 == 0 else reversed(rows):
            measured = _checked(row, run_measured(row.command, cwd=cwd))
            row.runs.append(measured)
            log(f"  round {number + 1}: {row.name}: {measured.seconds:.2f} s, "
                f"{row.nbytes / measured.seconds / 1e6:,.0f} MB/s")


def _checked(row: Row, measured: Measured) -> Measured:
    if measured.returncode != 0:
        sys.exit(f"{row.name} failed (exit {measured.returncode}): {measured.stderr[-500:]}")
    return measured


def same_output(rows: dict[str, Row]) -> dict[str, str]:
    """Per row with a reference: whether every run's stdout equals the reference's."""
    verdicts = {}
    for row in rows.values():
        if row.same_as is None:
            continue
        reference = rows[row.same_as].runs[0].stdout
        lines = reference.count("\n")
        ok = lines > 0 and all(run.stdout == reference for run in row.runs)
        verdicts[row.name] = (f"identical to {row.same_as} ({lines:,} lines)" if ok
                              else f"DIFFERS from {row.same_as}")
    return verdicts


def paired(row: Row, base: Row) -> list[float]:
    """Speed of `row` over `base` in each round (same bytes: the inverse ratio of times)."""
    return [b.seconds / r.seconds * (row.nbytes / base.nbytes)
            for r, b in zip(row.runs, base.runs, strict=True)]


# -- output -----------------------------------------------------------------------------------

def table(groups: list[tuple[str, list[Row]]], identity: dict[str, str], note: str) -> str:
    lines = [note, "", "| row | data | MB/s | CPU s/GB | × base | output |",
             "|---|---:|---:|---:|---:|---|"]
    for title, rows in groups:
        lines.append(f"| **{title}** | | | | | |")
        by_name = {row.name: row for row in rows}
        for row in rows:
            ratio = "1.00 (base)" if row.base is None else (
                f"{statistics.median(paired(row, by_name[row.base])):.2f}")
            lines.append(f"| {row.name} | {row.nbytes / 1e9:.2f} GB | {row.mb_per_s:,.0f} | "
                         f"{row.cpu_per_gb:.2f} | {ratio} | {identity.get(row.name, '')} |")
    return "\n".join(lines)


def bars(rows: dict[str, Row], identity: dict[str, str], startups: dict[str, float]) -> str:
    out = ["", "Bars of issue 18 (median over rounds of the ratio within a round):"]

    def bar(what: str, ratios: list[float], limit: float) -> None:
        median = statistics.median(ratios)
        each = ", ".join(f"{ratio:.3f}" for ratio in ratios)
        out.append(f"- [{'x' if median >= limit else ' '}] {what} {median:.3f} (>= {limit}; "
                   f"rounds {each}; {verdict(ratios, limit, at_most=False)})")

    bar("many files: bulkfetch --workers 2 × md5sum",
        paired(rows["bulkfetch hash -w 2"], rows["md5sum"]), 1.7)
    bar("one huge file: bulkfetch × md5sum",
        paired(rows["bulkfetch hash (huge)"], rows["md5sum (huge)"]), 0.95)
    if "bulkfetch hash --algo blake3" in rows:
        fast = rows["bulkfetch hash --algo blake3"]
        singles = [rows["blake3 1 thread, mapped (b3sum-style)"],
                   rows["blake3 1 thread, 128 KiB reads"]]
        best = [max(single.nbytes / run.seconds for single, run in
                    zip(singles, runs, strict=True))
                for runs in zip(*(single.runs for single in singles), strict=True)]
        bar("one huge file: bulkfetch BLAKE3 × the faster single-thread BLAKE3 row",
            [fast.nbytes / run.seconds / b for run, b in zip(fast.runs, best, strict=True)],
            1.6)
        net = _net_ratio(fast, singles, startups)
        if net is not None:
            out.append(f"- for reference, the same without each command's start-up (an empty "
                       f"run: bulkfetch {startups['bulkfetch']:.2f} s, python + blake3 "
                       f"{startups['python']:.2f} s): {net:.3f}")
    wrong = [f"{name}: {text}" for name, text in identity.items() if "DIFFERS" in text]
    out.append(f"- [{' ' if wrong else 'x'}] outputs identical to md5sum / sha256sum / the "
               f"blake3 package{': ' + '; '.join(wrong) if wrong else ''}")
    return "\n".join(out)


def _net_ratio(fast: Row, singles: list[Row], startups: dict[str, float]) -> float | None:
    """BLAKE3 speed-up with each command's fixed start-up taken out (medians)."""
    if not startups:
        return None
    single = min(row.median("seconds") for row in singles) - startups["python"]
    ours = fast.median("seconds") - startups["bulkfetch"]
    return single / ours if ours > 0 and single > 0 else None


def sweep(directory: Path, names: list[str], nbytes: int, top: int, out: Path) -> str:
    """bulkfetch hash --workers 1..top over the many files: MB/s and CPU per worker count."""
    lines = ["", f"Workers sweep (many files, {nbytes / 1e9:.2f} GB, warm cache, one run each):",
             "", "| workers | MB/s | CPU s/GB |", "|---:|---:|---:|"]
    points = []
    for workers in range(1, top + 1):
        command = [*bulkfetch_command(), "hash", "-q", "-w", str(workers), *names]
        measured = _checked(Row(f"-w {workers}", command, nbytes),
                            run_measured(command, cwd=directory))
        rate = nbytes / measured.seconds / 1e6
        points.append((workers, rate))
        lines.append(f"| {workers} | {rate:,.0f} | {measured.cpu_seconds / (nbytes / 1e9):.2f} |")
        log(f"  sweep: {workers} workers: {rate:,.0f} MB/s")
    lines.append("")
    lines.append(_plot(points, out / "sweep-workers.png"))
    return "\n".join(lines)


def _plot(points: list[tuple[int, float]], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no plot: matplotlib is not installed; pip install -e .[bench])"
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([w for w, _ in points], [r for _, r in points], marker="o")
    ax.set_xticks([w for w, _ in points])
    ax.set_xlabel("bulkfetch hash --workers")
    ax.set_ylabel("MB/s (page cache)")
    ax.set_title("bulkfetch hash: many files, MB/s against workers")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"Plot: {path}"


# -- main -------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bulkfetch-hash-bench"),
                        help="where the data is generated and kept between runs")
    parser.add_argument("--files", type=int, default=None, help="many files: how many "
                        "[default: 2000; --quick: 200]")
    parser.add_argument("--min-size", default="1m", help="many files: smallest [1m]")
    parser.add_argument("--max-size", default="10m", help="many files: largest [10m]")
    parser.add_argument("--huge-size", default=None,
                        help="the huge file [default: 4g; --quick: 1g]")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds per row [default: 3; --quick: 2]")
    parser.add_argument("--quick", action="store_true", help="200 files, a 1 GiB file, 2 rounds")
    parser.add_argument("--sweep-workers", action="store_true",
                        help="also run --workers 1..2N on the many files and plot MB/s")
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    files = args.files or (200 if args.quick else 2000)
    huge = parse_bytes(args.huge_size or ("1g" if args.quick else "4g"))
    rounds = args.rounds or (2 if args.quick else 3)
    low, high = parse_bytes(args.min_size), parse_bytes(args.max_size)
    out = args.out or HERE / "results" / f"{slug()}-hash{'-quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    check_room(args.dir, files * (low + high) // 2 + huge)

    many_dir, huge_path = args.dir / "many", args.dir / "huge.bin"
    names = many_files(many_dir, files, low, high)
    huge_file(huge_path, huge)
    many_bytes = sum((many_dir / name).stat().st_size for name in names)
    bf = [*bulkfetch_command(), "hash", "-q"]

    many = [Row("md5sum", ["md5sum", *names], many_bytes),
            Row("bulkfetch hash -w 1", [*bf, "-w", "1", *names], many_bytes, "md5sum",
                "md5sum"),
            Row("bulkfetch hash -w 2", [*bf, "-w", "2", *names], many_bytes, "md5sum",
                "md5sum"),
            Row("sha256sum", ["sha256sum", *names], many_bytes, "md5sum"),
            Row("bulkfetch hash --algo sha256 -w 2", [*bf, "--algo", "sha256", "-w", "2",
                                                      *names], many_bytes, "sha256sum",
                "sha256sum")]
    target = str(huge_path)
    big = [Row("md5sum (huge)", ["md5sum", target], huge),
           Row("bulkfetch hash (huge)", [*bf, target], huge, "md5sum (huge)", "md5sum (huge)")]
    b3: list[Row] = []
    startups: dict[str, float] = {}
    try:
        import blake3  # noqa: F401

        single = "blake3 1 thread, mapped (b3sum-style)"
        b3 = [Row(single, [sys.executable, "-c", B3_SINGLE_MAPPED, target], huge),
              Row("blake3 1 thread, 128 KiB reads", [sys.executable, "-c", B3_SINGLE_READ,
                                                     target], huge, single, single),
              Row("bulkfetch hash --algo blake3", [*bf, "--algo", "blake3", target], huge,
                  single, single)]
    except ImportError:
        log("no blake3 package: the BLAKE3 rows are left out (pip install -e .[hash])")

    log(f"many files: {files:,} files, {many_bytes / 1e9:.2f} GB")
    run_group(many, rounds, many_dir)
    log(f"one huge file: {huge / 2**30:.2f} GiB")
    run_group(big + b3, rounds, args.dir)
    if b3:
        empty = args.dir / "empty"
        empty.write_bytes(b"")
        startups = {name: statistics.median(
            run_measured(command, cwd=args.dir).seconds for _ in range(3))
            for name, command in (("bulkfetch", [*bf, str(empty)]),
                                  ("python", [sys.executable, "-c", "import blake3"]))}

    rows = {row.name: row for row in many + big + b3}
    identity = same_output(rows)
    (out / "machine.txt").write_text(describe("one run, all cores"), encoding="utf-8")
    memory = memory_gb()
    note = (f"`bulkfetch hash` beside md5sum, sha256sum and single-thread BLAKE3 on "
            f"{cpu_model()}, {cores} cores usable, "
            f"{'?' if memory is None else f'{memory:.0f}'} GiB RAM.\n\n"
            f"Warm page cache: every row reads its files from memory (the data, "
            f"{(many_bytes + huge) / 1e9:.1f} GB, fits in RAM, and each row ran once untimed "
            f"first), so this is hashing and copying from the cache, not the disk. "
            f"{rounds} rounds (ABBA); MB/s and CPU are medians; × base is the median of "
            f"the per-round ratios.")
    text = table([(f"many files: {files:,} of {args.min_size}-{args.max_size}", many),
                  (f"one huge file: {huge / 2**30:.2f} GiB", big + b3)], identity, note)
    text += "\n" + bars(rows, identity, startups)
    if args.sweep_workers:
        text += "\n" + sweep(many_dir, names, many_bytes, 2 * cores, out)
    print(text)
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    log(f"written: {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

