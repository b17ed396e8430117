"""Crawling a web server's directory tree (issue 48), bulkfetch against wget2 and rclone:
`bulkfetch get URL/ DEST` against `wget2 -r` and rclone's http backend on one nginx
autoindex tree, side by side in one run, and the crawl's memory on a 1,000,000-file tree
against a 100,000-file one:

    python benchmarks/tree.py [--rounds 3] [--files 20000] [--dirs 420] [--only ROW]
    python benchmarks/tree.py --only memory [--memory-small 100000] [--memory-large 1000000]

Speed rows: FILES small files (100 B-4 KiB, random bytes, sizes drawn with --seed) written
into a temp dir as a tree of DIRS directories that hold files (with 420: 20 top directories
of 20 subdirectories each; file i lives in directory i % DIRS), served by real nginx
(/usr/sbin/nginx -c CONF -g 'daemon off;', a config written beside the tree: worker_processes
1, `autoindex on; autoindex_exact_size on;`, sendfile on, keepalive at nginx's defaults
(keepalive_timeout 75s, keepalive_requests 1000), access_log off, listening on 127.0.0.1 on a
free port) at http://127.0.0.1:PORT/tree/. Each client goes into a fresh DEST; nothing is
pinned (the clients may use both cores, as a user's would):

- bulkfetch:      `bulkfetch get URL/tree/ DEST -q` (the defaults: directory sink, a worker
                  per core, -c auto, --list-concurrency 8);
- wget2:          `wget2 -r -np -nH --cut-dirs=1 --max-threads=16 -q --no-robots
                  --reject=index.html -P DEST URL/tree/` (without --reject wget2 stores
                  every listing as DIR/index.html; with --reject='index.html*' too);
- rclone:         `rclone copy --http-url URL/tree/ :http: DEST --transfers 16 --checkers 16`
                  (a HEAD request for every file, rclone's default for the http backend);
- rclone no-head: the same with --http-no-head;
- cp:             `cp -r TREE/. DEST`, no network: what creating the files costs. With
                  nginx's CPU it gives the floor under the bars: (cp's CPU + nginx's CPU
                  serving the tree) / cores, the least wall time any crawler can take here.
- curl_loop:      benchmarks/curl_loop.c (compiled against pycurl's libcurl) GETting the
                  tree's files at 64 in flight from a list of their URLs (none listed),
                  the bodies thrown away: the least an HTTP client spends a file;
- renamed:        `baselines.py create-renamed DEST FILES`: as many 100-byte files, each
                  under a temporary name renamed into place. With curl_loop's CPU and
                  nginx's serving it, over the cores: a client's floor, the least any
                  crawler that stores a file under its name only when whole can take,
                  before listing anything or starting up.

One unmeasured wget2 crawl first puts the tree in the page cache. Each measured run writes
its DEST on a new ext4 of its own where root may mount one (bulkfetch.bench.scratch: the
deletes of an earlier row would otherwise slow the next row's creates; without root, DEST is
a plain directory removed and synced after the run). Every row is checked after every round:
each of the tree's files is in DEST at its path with its size (and the bytes of a sample of
200 files compared), nothing else stored outside bulkfetch's .bulkfetch/ (a listing page
kept by wget2 would count as extra), exit 0. The table shows each row's median wall time,
FILES / that time (files/s), every round's time and the median CPU seconds of the client's
process tree and of nginx. Rounds alternate their order (ABBA). Bars: bulkfetch's files/s at
least 3x rclone --http-no-head's and 3x wget2's, each the median over rounds of the ratio
within a round (the issue's own measurement: wget2 1,870 files/s, rclone --http-no-head
3,400, rclone 2,130).

Memory row (in the default run: about 1 min 45 s here, 2026-11-29; alone with `--only
memory`): `bulkfetch serve --shape index --files N` (a separate process, not measured; the
listings computed on the fly, 50 entries a directory) for N = 100,000 and 1,000,000, and
`bulkfetch get URL/archive/ DEST --sink null -q --report R` (the defaults otherwise: a
worker per core). Sampled every 50 ms: the RSS of the client's main process, of each of its
descendants (the workers), and their sum. Bar: the peak of the summed RSS (the main process
and its workers sampled together, as benchmarks/memory.py measures) of the 1,000,000-file
run at most 1.1x the 100,000-file run's; the main process's and the largest worker's own
peaks are shown with their ratios too. Checked by the report: every file ok, exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.bench.verify import verify_counted
from harness import (
    HERE,
    FreshFilesystems,
    Server,
    build_curl_loop,
    bulkfetch_command,
    free_port,
    log,
    run_measured,
    settle,
    start_nginx,
    start_reference,
    tree_cpu_seconds,
    tree_pids,
)

SPEED_ROWS = ("bulkfetch", "wget2", "rclone", "rclone-no-head", "cp", "curl_loop", "renamed")
FLOOR_ROWS = ("curl_loop", "renamed")  # checked by the counts they print, not by DEST
ROWS = (*SPEED_ROWS, "memory")
BAR = 3.0  # bulkfetch's files/s at least this many times each barred peer's
BARRED = ("rclone-no-head", "wget2")
MEMORY_BAR = 1.1
RCLONE = "/root/.pyenv/shims/rclone"


@dataclass
class Row:
    name: str
    command: list[str]
    dest: Path
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the client's process tree
    server_cpu: list[float] = field(default_factory=list)  # nginx's master and worker
    notes: list[str] = field(default_factory=list)  # each round's check, "" when right

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def ok(self) -> bool:
        return bool(self.seconds) and not any(self.notes)


# -- the tree on disk and nginx -----------------------------------------------------------
def directories(count: int) -> list[str]:
    """`count` directories that hold files: TOP top directories (about the square root of
    `count`) and the rest as their subdirectories, dealt round-robin (420: 20 x 20 + 20)."""
    top = max(1, round(count**0.5))
    tops = [f"t{i:03d}" for i in range(top)]
    subs = [f"{tops[i % top]}/s{i // top:03d}" for i in range(count - top)]
    return tops + subs


def generate(root: Path, files: int, dirs: int, seed: int) -> dict[str, int]:
    """The tree under `root`; returns relative path -> size."""
    rng = random.Random(seed)
    places = directories(dirs)
    for place in places:
        (root / place).mkdir(parents=True, exist_ok=True)
    expected = {}
    for i in range(files):
        path = f"{places[i % len(places)]}/f{i:06d}.bin"
        size = rng.randint(100, 4096)
        (root / path).write_bytes(rng.randbytes(size))
        expected[path] = size
    return expected


def nginx_config(work: Path, www: Path, port: int) -> Path:
    run = work / "nginx-run"
    run.mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""  # mkdtemp's dirs are mode 0700
    temp = "".join(f"    {kind}_temp_path {run / kind};\n"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    config = work / "nginx.conf"
    config.write_text(f"""\
{user}worker_processes 1;
pid {run / "nginx.pid"};
error_log {run / "error.log"} warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
    sendfile on;
{temp}    types {{}}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        location / {{
            autoindex on;
            autoindex_exact_size on;
        }}
    }}
}}
""")
    return config


def check(dest: Path, root: Path, expected: dict[str, int], sample: list[str]) -> str:
    """'' when DEST holds exactly the tree's files at their sizes (a sample byte for byte);
    else what is wrong."""
    found: dict[str, int] = {}
    for top, dirnames, filenames in os.walk(dest):
        if top == str(dest) and ".bulkfetch" in dirnames:
            dirnames.remove(".bulkfetch")
        base = os.path.relpath(top, dest)
        for name in filenames:
            path = name if base == "." else f"{base}/{name}"
            found[path] = os.stat(os.path.join(top, name)).st_size
    present = sum(1 for path, size in expected.items() if found.get(path) == size)
    extra = sorted(set(found) - set(expected))
    wrong = sum(1 for path in sample if path in found
                and (dest / path).read_bytes() != (root / path).read_bytes())
    if present == len(expected) and not extra and not wrong:
        return ""
    note = f"{present:,} of {len(expected):,} files right"
    if extra:
        note += f", {len(extra):,} extra (e.g. {', '.join(extra[:3])})"
    if wrong:
        note += f", {wrong} of {len(sample)} sampled differ"
    return note


def speed(args: argparse.Namespace, only: set[str], work: Path,
          ) -> tuple[list[Row], str]:
    www = work / "www"
    log(f"writing {args.files:,} files in {args.dirs} directories ...")
    started = time.monotonic()
    expected = generate(www / "tree", args.files, args.dirs, args.seed)
    sample = random.Random(args.seed).sample(sorted(expected), min(200, len(expected)))
    log(f"  {sum(expected.values()) / 2**20:.1f} MiB in {time.monotonic() - started:.1f} s")
    nginx = start_nginx([], str(nginx_config(work, www, free_port())))
    url = f"{nginx.url}/tree/"
    filesystems = FreshFilesystems(work)
    log(filesystems.note)
    rows = []
    for name in SPEED_ROWS:
        if name not in only:
            continue
        dest = work / f"fs-{name}" / "dest"
        if name == "curl_loop":
            try:
                curl_loop, _ = build_curl_loop(work, "pycurl")
            except SystemExit as exc:  # no compiler or headers: the other rows still run
                log(f"no curl_loop row, so no client's floor: {exc}")
                continue
            urls = work / "urls.txt"
            urls.write_text("".join(f"{url}{path}\n" for path in expected))
            command = [str(curl_loop), "64", str(urls)]
        elif name == "renamed":
            command = [sys.executable, str(HERE / "baselines.py"), "create-renamed",
                       str(dest), str(args.files)]
        elif name == "cp":
            command = ["cp", "-r", f"{www / 'tree'}/.", str(dest)]
        else:
            command = client_command(name, url, dest)
        rows.append(Row(name, command, dest))
    try:
        warm(url, work)
        for number in range(args.rounds):
            order = rows if number % 2 == 0 else rows[::-1]
            for row in order:
                with filesystems.row(row.dest.parent, args.files + args.dirs,
                                     file_bytes=4096):
                    server_before = tree_cpu_seconds(nginx.pid)
                    run = run_measured(row.command, timeout=1800, cwd=work)
                    row.server_cpu.append(tree_cpu_seconds(nginx.pid) - server_before)
                    if row.name in FLOOR_ROWS:
                        counts = verify_counted(run.stdout, args.files)
                        note = "" if counts.ok else counts.detail
                    else:
                        note = check(row.dest, www / "tree", expected, sample)
                if run.returncode != 0:
                    note = f"exit {run.returncode}: {run.stderr.strip()[-300:]}; {note}"
                row.seconds.append(run.seconds)
                row.cpu.append(run.cpu_seconds)
                row.notes.append(note)
                log(f"  round {number + 1}: {row.name}: {run.seconds:.2f} s, "
                    f"{args.files / run.seconds:,.0f} files/s{'; ' + note if note else ''}")
    finally:
        nginx.stop()
    return rows, filesystems.note


def client_command(name: str, url: str, dest: Path) -> list[str]:
    if name == "bulkfetch":
        return [*bulkfetch_command(), "get", url, str(dest), "-q"]
    if name == "wget2":
        # wget2's boolean options take no separate value ("--robots off" would be a URL),
        # and --reject='index.html*' keeps the listings: the plain suffix drops them
        return [shutil.which("wget2") or "wget2", "-r", "-np", "-nH", "--cut-dirs=1",
                "--max-threads=16", "-q", "--no-robots", "--reject=index.html",
                f"--directory-prefix={dest}", url]
    rclone = shutil.which("rclone") or RCLONE
    command = [rclone, "copy", "--http-url", url, ":http:", str(dest), "--transfers", "16",
               "--checkers", "16", "--config", "/dev/null"]
    return [*command, "--http-no-head"] if name == "rclone-no-head" else command


def warm(url: str, work: Path) -> None:
    """One unmeasured pass of wget2 (or bulkfetch) so every row finds the tree in the page
    cache and nginx started."""
    dest = work / "warm"
    command = (client_command("wget2", url, dest) if shutil.which("wget2")
               else client_command("bulkfetch", url, dest))
    log("warming: one unmeasured crawl ...")
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=1800, check=False)
    settle(dest, pause=1.0)


# -- memory -------------------------------------------------------------------------------
@dataclass
class Peaks:
    files: int
    seconds: float = 0.0
    returncode: int = 0
    files_ok: int = 0
    total: int = 0  # peak of the summed RSS of the whole tree, sampled together
    main: int = 0
    workers: dict[int, int] = field(default_factory=dict)  # pid -> its peak
    stderr: str = ""

    @property
    def worker_max(self) -> int:
        return max(self.workers.values(), default=0)


PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def run_peaks(command: list[str], peaks: Peaks, interval: float = 0.05) -> None:
    """Run `command`; its main process's, each descendant's and the summed peak RSS into
    `peaks`."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            sizes = {pid: rss(pid) for pid in tree_pids(process.pid)}
            peaks.total = max(peaks.total, sum(sizes.values()))
            peaks.main = max(peaks.main, sizes.pop(process.pid, 0))
            for pid, size in sizes.items():
                peaks.workers[pid] = max(peaks.workers.get(pid, 0), size)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, peaks.stderr = process.communicate(timeout=3600)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    finally:
        done.set()
        sampler.join()
    peaks.seconds = time.monotonic() - started
    peaks.returncode = process.returncode


def memory(args: argparse.Namespace, work: Path) -> list[Peaks]:
    found = []
    for files in (args.memory_small, args.memory_large):
        server: Server = start_reference([], files, processes=1,
                                         extra=["--shape", "index"])
        dest, report = work / f"mem-{files}", work / f"mem-{files}.json"
        peaks = Peaks(files)
        try:
            log(f"memory: {files:,} files ...")
            run_peaks([*bulkfetch_command(), "get", f"{server.url}/archive/", str(dest),
                       "--sink", "null", "-q", "--report", str(report)], peaks)
        finally:
            server.stop()
        if report.exists():
            peaks.files_ok = json.loads(report.read_text()).get("files_ok", 0)
        log(f"  {peaks.seconds:.1f} s, {files / peaks.seconds:,.0f} files/s, peak "
            f"{peaks.total / 2**20:.1f} MB")
        settle(dest, report, pause=0)
        found.append(peaks)
    return found


# -- output -------------------------------------------------------------------------------
def speed_table(rows: list[Row], files: int) -> str:
    lines = ["| row | wall s (median) | files/s | rounds s | client CPU s | nginx CPU s | "
             "verified |", "|---|---:|---:|---|---:|---:|---|"]
    for row in rows:
        rounds = ", ".join(f"{s:.2f}" for s in row.seconds)
        notes = "; ".join(sorted({n for n in row.notes if n}))
        lines.append(f"| {row.name} | {row.median:.2f} | {files / row.median:,.0f} | {rounds} "
                     f"| {statistics.median(row.cpu):.1f} | "
                     f"{statistics.median(row.server_cpu):.1f} | "
                     f"{'yes' if row.ok else 'NO: ' + notes} |")
    return "\n".join(lines)


def floors(by: dict[str, Row]) -> list[tuple[float, str]]:
    """The least wall time a crawler can take here, (seconds, how it is made), from the
    rows that were run: the files created as cp -r creates them (no network) and nginx
    serving the tree; and an HTTP client's own least cost too, each file fetched over
    keep-alive with nothing else done (no listing, no check, no start-up) and stored under
    its name only when whole, nginx serving those requests alone. Each over the cores."""
    cores = os.cpu_count() or 1
    found = []
    local, ours = by.get("cp"), by.get("bulkfetch")
    if local is not None and ours is not None:
        creating, serving = statistics.median(local.cpu), statistics.median(ours.server_cpu)
        found.append(((creating + serving) / cores,
                      f"(cp -r's {creating:.2f} CPU s to create the files + nginx's "
                      f"{serving:.2f} CPU s to serve them) / {cores} cores"))
    fetching, storing = by.get("curl_loop"), by.get("renamed")
    if fetching is not None and storing is not None:
        fetch, store = statistics.median(fetching.cpu), statistics.median(storing.cpu)
        serving = statistics.median(fetching.server_cpu)
        found.append(((fetch + store + serving) / cores,
                      f"a client's: (curl_loop's {fetch:.2f} CPU s to fetch the files + "
                      f"renamed's {store:.2f} CPU s to store each under its name when whole + "
                      f"nginx's {serving:.2f} CPU s to serve them) / {cores} cores; no "
                      "listing, no start-up"))
    return found


def speed_bars(rows: list[Row]) -> str:
    by = {row.name: row for row in rows}
    ours = by.get("bulkfetch")
    out = []
    least = floors(by)
    for name in BARRED:
        peer = by.get(name)
        if ours is None or peer is None:
            continue
        # files/s ratio within each round = the peer's time / bulkfetch's
        ratios = [theirs / mine for mine, theirs in zip(ours.seconds, peer.seconds,
                                                        strict=True)]
        ratio = statistics.median(ratios)
        met = ratio >= BAR and ours.ok and peer.ok
        asked = peer.median / BAR
        below = [f"{floor:.2f} s" for floor, _ in least if asked < floor]
        out.append(f"- {'✓' if met else '✗'} bulkfetch files/s x {name}'s: {ratio:.2f} "
                   f"(>= {BAR}; rounds {', '.join(f'{r:.2f}' for r in ratios)}; ratio of "
                   f"the medians {peer.median / ours.median:.2f})"
                   + ("" if ours.ok and peer.ok else "; a row failed its check")
                   + f"; the bar asks for {asked:.2f} s"
                   + (f", below the floor of {', '.join(below)}" if below else ""))
    out += [f"- this machine's floor: {floor:.2f} s, {how}" for floor, how in least]
    return "\n".join(out)


def memory_table(found: list[Peaks]) -> str:
    mb = 2**20
    lines = ["| files | done | exit | wall s | files/s | peak RSS main+workers MB | "
             "main MB | largest worker MB | workers |", "|---:|---:|---:|---:|---:|---:|---:|"
             "---:|---:|"]
    for p in found:
        lines.append(f"| {p.files:,} | {p.files_ok:,} | {p.returncode} | {p.seconds:.1f} | "
                     f"{p.files / p.seconds:,.0f} | {p.total / mb:.1f} | {p.main / mb:.1f} | "
                     f"{p.worker_max / mb:.1f} | {len(p.workers)} |")
    if len(found) == 2:
        small, large = found
        ok = all(p.files_ok == p.files and p.returncode == 0 for p in found)
        ratio = large.total / small.total
        lines.append("")
        lines.append(f"- {'✓' if ratio <= MEMORY_BAR and ok else '✗'} peak RSS of the "
                     f"client (main + workers, summed) at {large.files:,} files x at "
                     f"{small.files:,}: {ratio:.3f} (<= {MEMORY_BAR})"
                     + ("" if ok else "; a run did not fetch every file"))
        lines.append(f"  (main process alone {large.main / small.main:.3f}x, largest worker "
                     f"{large.worker_max / max(1, small.worker_max):.3f}x)")
        if not ok:
            for p in found:
                if p.returncode != 0:
                    lines.append(f"  {p.files:,}: exit {p.returncode}: {p.stderr[-300:]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--dirs", type=int, default=420,
                        help="directories holding files (about sqrt of it at the top)")
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--memory-small", type=int, default=100_000)
    parser.add_argument("--memory-large", type=int, default=1_000_000)
    parser.add_argument("--only", action="append", choices=ROWS,
                        help="run this row only (repeat for more); default: all")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.files < 1 or not 1 <= args.dirs <= args.files:
        parser.error("--rounds and --files need at least 1, --dirs 1 to FILES")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    only = set(args.only or ROWS)
    missing = [name for name, tool in (("wget2", "wget2"), ("rclone", "rclone"),
                                       ("rclone-no-head", "rclone"))
               if name in only and shutil.which(tool) is None
               and not (tool == "rclone" and os.path.exists(RCLONE))]
    if missing:
        log(f"skipping {', '.join(missing)}: not installed")
        only -= set(missing)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-tree-"))
    rows: list[Row] = []
    where = ""
    peaks: list[Peaks] = []
    try:
        if only & set(SPEED_ROWS):
            rows, where = speed(args, only, work)
        if "memory" in only:
            peaks = memory(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print(f"{args.files:,} files in {args.dirs} directories on nginx (1 worker, autoindex) "
              f"over loopback, {args.rounds} round{'s' * (args.rounds != 1)}, not pinned; "
              f"{where}\n")
        print(speed_table(rows, args.files))
        print()
        print(speed_bars(rows))
    if peaks:
        if rows:
            print()
        print("bulkfetch get URL/archive/ --sink null against bulkfetch serve --shape index "
              "(1 process, fanout 50)\n")
        print(memory_table(peaks))
    ok = all(row.ok for row in rows) and all(p.files_ok == p.files and p.returncode == 0
                                             for p in peaks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
