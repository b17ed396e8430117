"""Speed of `bulkfetch get` in the standard setup of docs/guide/benchmarks.md, side by side with the
reference loops, in one run:

    python benchmarks/get.py [--files 200000] [--repeat 3] [--paired-rounds N] [--export-dir DIR]
                               [-c N|auto]

nginx serves a static export of the data set, pinned to core 0; every client row runs pinned
to core 1 with one bulkfetch worker. Rows: a bare pycurl multi loop (bodies in memory), a
bare loop creating 100-byte files (and one renaming each into place, the least a file that
must appear only whole costs), bulkfetch into the null, tar and directory sinks, and the case
study's asyncio + aiohttp downloader in memory and writing files. CPU per file is user + sys
of each row's whole process tree; files/s compares only within this run. An unmeasured pass
of the bare loop warms nginx first. The bare loop and the null and tar sinks run first, in
rounds of their own (--paired-rounds); then the other rows (--repeat), those that create files
each on a new filesystem where root may make one (bulkfetch.bench.scratch says why), and
the tar row on one of its own as well. Within
each group every other round runs in reverse order (ABBA, so a drift of the machine's speed
falls on both sides of a comparison); the table shows each row's median and every round's
CPU per file.

Checks at the end: the issues' bars. A bar between rows of one group (null against bare, tar
against null; dir against bare + create, with the bare loop run again among the file rows,
and against asyncio writing files) is the median over rounds of the ratio within each
round, whose rows ran next to each other; every round's ratio is printed with it, and a
distribution-free 95% interval for that median says whether the rounds decide the bar or
the machine's noise does (it takes six rounds or more; a round of the first group took
30-50 s at 200,000 files here). Only null against asyncio in memory compares the
medians of two groups. Two lines for reference follow the directory bar: what the rename
alone adds to bare + create, and the dir sink against bare + the renaming loop.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import signal
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.sinks.ustar import PACKER_NOTE
from harness import (
    FreshFilesystems,
    Measured,
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    pinning,
    run_measured,
    settle,
    start_nginx,
    verdict,
)

HERE = Path(__file__).resolve().parent
# The first group: the bare loop and the null and tar sinks.
PAIRED_ROWS = ("bare pycurl loop (memory)", "bulkfetch null, 1 worker",
               "bulkfetch tar, 1 worker")
# The bare loop again, in the other group: the directory bar's rounds then pair it with the
# create loop and the directory sink run next to it.
BARE_BESIDE = "bare pycurl loop (beside the file rows)"
# The create loop writing each file under a temporary name and renaming it into place: the
# least any downloader pays for the directory sink's promise that a file appears only whole.
RENAMED = "bare create loop, renamed into place (files)"
# The rows that create files, each with the directory a new filesystem is mounted on for it.
# The tar row too: its shards' writes cost more on a filesystem where many files were just
# deleted (ext4 with discard), by as much as 1.08 against 1.25-1.3x the null row's CPU a file
# on this machine within the hour, with either tree (benchmarks/results/2026-11-26-session21).
FILE_ROWS = {"bare create loop (files)": "fs-c", RENAMED: "fs-r",
             "bulkfetch dir, 1 worker": "fs-d", "asyncio+aiohttp (files)": "fs-a",
             "bulkfetch tar, 1 worker": "fs-t"}


@dataclass
class Row:
    name: str
    runs: list[Measured]
    files: int
    verified: str

    def median(self, value: str) -> float:
        return statistics.median(getattr(run, value) for run in self.runs)

    @property
    def cpu_us(self) -> float:
        return self.median("cpu_seconds") / self.files * 1e6

    @property
    def files_per_s(self) -> float:
        return self.files / self.median("seconds")

    @property
    def peak_mb(self) -> float:
        return max(run.peak_rss for run in self.runs) / 2**20


def verify_dir(dest: Path, export: Path, files: int, sample: int = 2000) -> str:
    names = [f"f{i:010d}" for i in range(0, files, max(1, files // sample))]
    present = sum(1 for p in dest.iterdir() if p.is_file()) if dest.is_dir() else 0
    wrong = sum(
        1 for n in names
        if not (dest / n).is_file() or hashlib.md5((dest / n).read_bytes()).digest()
        != hashlib.md5((export / "files" / n).read_bytes()).digest()
    )
    ok = present == files and wrong == 0
    return f"{'yes' if ok else 'NO'}: {present:,} files, {len(names)} sampled, {wrong} wrong"


def verify_tar(dest: Path, export: Path, files: int, sample: int = 2000) -> str:
    """The index holds every name once; sampled members read back by offset match the
    export; every shard opens with tarfile and holds as many members as indexed."""
    import sqlite3
    import tarfile

    conn = sqlite3.connect(dest / "index.sqlite")
    try:
        indexed = conn.execute("SELECT count(*), count(DISTINCT name) FROM members").fetchone()
        shards = dict(conn.execute("SELECT id, file FROM shards"))
        picks = conn.execute("SELECT name, shard, offset, size FROM members "
                             f"WHERE rowid % {max(1, files // sample)} = 0").fetchall()
    finally:
        conn.close()
    wrong = 0
    for name, shard, offset, size in picks:
        with open(dest / shards[shard], "rb") as fh:
            fh.seek(offset)
            wrong += fh.read(size) != (export / "files" / name).read_bytes()
    members = 0
    for file in shards.values():
        with tarfile.open(dest / file) as tar:
            members += sum(1 for _ in tar)
    ok = indexed == (files, files) and members == files and wrong == 0
    return (f"{'yes' if ok else 'NO'}: {indexed[1]:,} indexed, {members:,} in "
            f"{len(shards)} shard{'s' * (len(shards) != 1)}, {len(picks)} sampled, {wrong} wrong")


def verify_count(measured: Measured, files: int, key: str = "files") -> str:
    try:
        counted = int(json.loads(measured.stdout.strip().splitlines()[-1])[key])
    except (ValueError, IndexError, KeyError):
        return f"NO: exit {measured.returncode}: {measured.stderr.strip()[-200:]}"
    return f"{'yes' if counted == files else 'NO'}: {counted:,} counted"


def verify_report(report: Path, files: int) -> str:
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return "NO: no report"
    ok = data.get("files_ok") == files and data.get("exit_code") == 0
    return f"{'yes' if ok else 'NO'}: report says {data.get('files_ok'):,} ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every row")
    parser.add_argument("--paired-rounds", type=int, default=None, metavar="N",
                        help="rounds of the bare, null and tar rows (default: --repeat); "
                             "their bars need six or more for an interval")
    parser.add_argument("--export-dir", type=Path, default=None,
                        help="reuse (or create) the nginx export here")
    parser.add_argument("--no-asyncio", action="store_true", help="skip the aiohttp rows")
    parser.add_argument("--no-dir", action="store_true", help="skip the directory rows")
    parser.add_argument("--concurrency", "-c", default=None, metavar="N|auto",
                        help="passed to every bulkfetch row (default: the CLI's default)")
    args = parser.parse_args(argv)
    # A TERM (kill, a CI timeout) unwinds like Ctrl-C: nginx stopped, mounts and files removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.repeat < 1 or (args.paired_rounds is not None and args.paired_rounds < 1):
        parser.error("--repeat and --paired-rounds need at least one round")
    paired_rounds = args.paired_rounds or args.repeat
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-bench-"))
    export = args.export_dir or work / "export"
    config, note = cached_export(args.files, export)
    if config is None:
        raise SystemExit(note)
    if note:
        log(note)
    conf, note = fit_open_file_cache(config, work, 64)
    if note:
        log(note)
    nginx = start_nginx(place.server, conf)
    base, n = nginx.url, args.files
    client = place.client
    bulkfetch = [*client, *bulkfetch_command()]
    fixed = ["-c", args.concurrency] if args.concurrency else []
    baselines = [*client, sys.executable, str(HERE / "baselines.py")]
    plan = [
        ("bare pycurl loop (memory)", [*baselines, "pycurl", base, str(n)], "count"),
        ("bulkfetch null, 1 worker", [*bulkfetch, "get", base, str(work / "dn"), "--workers",
                                      "1", "--sink", "null", "-q", *fixed, "--report",
                                      str(work / "rn.json")], "report"),
        ("bulkfetch tar, 1 worker", [*bulkfetch, "get", base, str(work / "fs-t" / "dt"),
                                     "--workers",
                                     "1", "--sink", "tar", "-q", *fixed, "--report",
                                     str(work / "rt.json")], "tar"),
    ]
    if not args.no_dir:
        plan.insert(1, ("bare create loop (files)",
                        [*baselines, "create", str(work / "fs-c" / "c"), str(n)], "count"))
        plan.insert(2, (RENAMED, [*baselines, "create-renamed", str(work / "fs-r" / "r"),
                                  str(n)], "count"))
        plan.insert(3, (BARE_BESIDE, plan[0][1], "count"))
        plan.append(("bulkfetch dir, 1 worker", [*bulkfetch, "get", base,
                                                 str(work / "fs-d" / "dd"),
                                                 "--workers", "1", "-q", *fixed, "--report",
                                                 str(work / "rd.json")], "dir"))
    if not args.no_asyncio and not args.no_dir:
        plan += [
            ("asyncio+aiohttp (memory)", [*baselines, "asyncio", base, str(n)], "count"),
            ("asyncio+aiohttp (files)", [*baselines, "asyncio", base, str(n),
                                         str(work / "fs-a" / "da")], "count"),
        ]
    filesystems = FreshFilesystems(work)
    log(filesystems.note)
    # The rows that write files run after every round of the paired rows, so that file-system
    # work they leave behind (journal, discard, writeback) cannot fall on the rows the main
    # bars compare.
    phases = [[step for step in plan if step[0] in PAIRED_ROWS],
              [step for step in plan if step[0] not in PAIRED_ROWS]]
    rows: dict[str, Row] = {label: Row(label, [], n, "") for label, _, _ in plan}
    try:
        # nginx starts with its open-file cache empty: the first row would wait on it, and a
        # client that waits wakes more often per file. One unmeasured pass fills it.
        log("warm-up: one unmeasured pass of the bare pycurl loop")
        run_measured(plan[0][1])
        for phase, repeat in zip(phases, (paired_rounds, args.repeat), strict=True):
            for attempt in range(repeat):
                if phase:
                    log(f"round {attempt + 1} of {repeat}: {len(phase)} rows")
                for label, command, check in phase[::-1] if attempt % 2 else phase:
                    settle(work / "dn")
                    log(f"  {label} ...")
                    with (filesystems.row(work / FILE_ROWS[label], n)
                          if label in FILE_ROWS else contextlib.nullcontext()):
                        measured = run_measured(command)
                        if check == "count":
                            verified = verify_count(measured, n)
                        elif check == "report":
                            verified = verify_report(work / "rn.json", n)
                        elif check == "tar":
                            verified = verify_report(work / "rt.json", n)
                            if verified.startswith("yes"):
                                verified = verify_tar(work / "fs-t" / "dt", export, n)
                        else:
                            verified = verify_dir(work / "fs-d" / "dd", export, n)
                    row = rows[label]
                    row.runs.append(measured)
                    if not row.verified.startswith("NO"):
                        row.verified = verified
    finally:
        nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
    placement = f"{place.note}; {filesystems.note}"
    placement += f"; tar packer: {PACKER_NOTE}"
    print(table(list(rows.values()), n, placement, args.repeat, paired_rounds))
    print(checks(rows))
    return 0


def table(rows: list[Row], files: int, placement: str, repeat: int, paired: int) -> str:
    bare = next(r for r in rows if r.name.startswith("bare pycurl"))
    others = any(row.name not in PAIRED_ROWS for row in rows)
    rounds = (f"{paired} rounds of the bare, null and tar rows, {repeat} of the others"
              if others and paired != repeat else f"{paired} rounds")
    lines = [
        f"{files:,} files of 100 bytes from nginx (static export); {placement}; "
        f"median of {rounds}, every other one in reverse order",
        "",
        "| row | files/s | CPU µs/file | × bare pycurl CPU | × bare files/s | peak RSS MB "
        "| verified | CPU µs/file by round |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        by_round = ", ".join(f"{run.cpu_seconds / files * 1e6:.1f}" for run in row.runs)
        lines.append(
            f"| {row.name} | {row.files_per_s:,.0f} | {row.cpu_us:.1f} | "
            f"{row.cpu_us / bare.cpu_us:.2f} | {row.files_per_s / bare.files_per_s:.2f} | "
            f"{row.peak_mb:.0f} | {row.verified} | {by_round} |"
        )
    return "\n".join(lines)


def paired(row: Row, base: Row | list[Row], value: str) -> tuple[float, list[float]]:
    """Round by round ratio of `row` to `base` (to the sum of several), rows of one group
    run next to each other, and the median of those ratios."""
    return paired_sums([row], base if isinstance(base, list) else [base], value)


def paired_sums(rows: list[Row], bases: list[Row], value: str) -> tuple[float, list[float]]:
    """paired() of the sum of several rows."""
    ratios = [sum(getattr(run, value) for run in runs[:len(rows)])
              / sum(getattr(run, value) for run in runs[len(rows):])
              for runs in zip(*(r.runs for r in rows), *(b.runs for b in bases), strict=True)]
    return statistics.median(ratios), ratios


def checks(rows: dict[str, Row]) -> str:
    bare = rows["bare pycurl loop (memory)"]
    null = rows["bulkfetch null, 1 worker"]
    tar = rows["bulkfetch tar, 1 worker"]
    out = ["", "Bars of the issues (paired: median over rounds of the ratio within a round):"]

    def bar(text: str, ok: bool) -> None:
        out.append(f"- [{'x' if ok else ' '}] {text}")

    def rounds(ratios: list[float]) -> str:
        return "rounds " + ", ".join(f"{ratio:.3f}" for ratio in ratios)

    def paired_bar(what: str, ratios: tuple[float, list[float]], limit: float,
                   at_most: bool) -> None:
        median, each = ratios
        ok = median <= limit if at_most else median >= limit
        bar(f"{what} {median:.3f} ({'<=' if at_most else '>='} {limit}; {rounds(each)}; "
            f"{verdict(each, limit, at_most)})", ok)

    # CPU per file: a ratio of cpu_seconds (same file count); files/s: the inverse of seconds
    paired_bar("null CPU/file × bare", paired(null, bare, "cpu_seconds"), 1.3, at_most=True)
    paired_bar("null files/s × bare", paired(bare, null, "seconds"), 0.8, at_most=False)
    paired_bar("tar CPU/file × null (issue 4)", paired(tar, null, "cpu_seconds"), 1.15,
               at_most=True)
    paired_bar("tar files/s × null (issue 4)", paired(null, tar, "seconds"), 0.85,
               at_most=False)
    if "bulkfetch dir, 1 worker" not in rows:
        return "\n".join(out)
    create = rows["bare create loop (files)"]
    directory = rows["bulkfetch dir, 1 worker"]
    beside = rows[BARE_BESIDE]
    paired_bar("dir CPU/file × (bare + create)", paired(directory, [beside, create],
                                                       "cpu_seconds"), 1.2, at_most=True)
    # Not a bar: how much of the 1.2 an atomic publish alone takes, and what bulkfetch costs
    # over a bare download loop that publishes that way.
    renamed = rows[RENAMED]
    for what, ratios in (
            ("(bare + renamed create) × (bare + create)",
             paired_sums([beside, renamed], [beside, create], "cpu_seconds")),
            ("dir CPU/file × (bare + renamed create)",
             paired(directory, [beside, renamed], "cpu_seconds"))):
        median, each = ratios
        out.append(f"- for reference, {what} {median:.3f} ({rounds(each)})")
    if "asyncio+aiohttp (memory)" in rows:
        aio, aio_dir = rows["asyncio+aiohttp (memory)"], rows["asyncio+aiohttp (files)"]
        # null and asyncio ran in different groups: their medians are compared
        bar(f"null files/s {null.files_per_s / aio.files_per_s:.1f}× asyncio (>= 5×, medians "
            "of the two groups)", null.files_per_s >= 5 * aio.files_per_s)
        paired_bar("dir files/s × asyncio with files", paired(aio_dir, directory, "seconds"),
                   3, at_most=False)
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
