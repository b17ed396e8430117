"""`--runner ray` against `--runner local`, and the ceiling of one driver (issue 23):

    python benchmarks/ray_runner.py [--files 200000] [--rounds 3] [--ceiling-files 2000000]
                                    [--page-size 1000] [--skip-overhead] [--skip-ceiling]

1. Overhead. nginx serves a static export of the data set (the standard server of
   docs/guide/benchmarks.md);
   a one-node Ray cluster of 2 CPUs is started with `ray start --head`. Each round runs
   `bulkfetch get URL DEST --sink null -w 2` once with `--runner local` and once with
   `--runner ray --ray-address ...`, every other round in reverse order. files/s is the
   report's (the run itself: the Ray connection and the actors' start are before it; the
   wall time, start-up included, is shown beside it). Bar: ray at least 0.85x local (the
   median of the per-round ratios).

2. Driver ceiling. The coordinator of a real run (lister, journal, dispatch, display
   updates; runners/local.py) with a pool of fake workers that answer each page at once as
   stored: what one driver sustains when workers are never the bottleneck. The listing comes
   from `bulkfetch serve` on the other core. Printed: pages/s, files/s, the driver's CPU per
   page, and the listing's own latency per page (one client, sequential tokens), from which
   docs/scale.md projects a billion files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bulkfetch.models import PageReport, Tick
from bulkfetch.runners.pool import Message
from harness import bulkfetch_command, cached_export, log, start_nginx, start_reference

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
BAR = 0.85


# -- 1. overhead ---------------------------------------------------------------------------
def start_ray(port: int) -> None:
    subprocess.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--object-store-memory=200000000", "--include-dashboard=false",
                    "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                   check=True, capture_output=True, env=os.environ | RAY_ENV)


def stop_ray() -> None:
    subprocess.run(["ray", "stop", "--force"], capture_output=True, env=os.environ | RAY_ENV)


def machine_cpu_s() -> float:
    """User + system seconds of every CPU of the machine (/proc/stat): nginx, the driver, the
    workers and Ray's own processes alike."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system = (int(value) for value in fields[:3])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def one_run(url: str, work: Path, runner: list[str]) -> tuple[float, float, float]:
    dest, report = work / "dest", work / "report.json"
    shutil.rmtree(dest, ignore_errors=True)
    report.unlink(missing_ok=True)
    started, cpu = time.monotonic(), machine_cpu_s()
    done = subprocess.run([*bulkfetch_command(), "get", url, str(dest), "--sink", "null",
                           "-w", "2", "-q", "--report", str(report), *runner],
                          capture_output=True, text=True, env=os.environ | RAY_ENV)
    wall, cpu = time.monotonic() - started, machine_cpu_s() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{runner or 'local'} failed: {done.stderr[-2000:]}")
    data = json.loads(report.read_text())
    return float(data["files_per_s"]), wall, cpu / int(data["files_ok"]) * 1e6


def overhead(files: int, rounds: int, work: Path) -> bool:
    config, note = cached_export(files, Path(tempfile.gettempdir()) / f"bf-export-{files}")
    if config is None:
        raise SystemExit(f"no nginx export: {note}")
    nginx = start_nginx([], config)
    port = 6391
    start_ray(port)
    rows: dict[str, list[tuple[float, float, float]]] = {"local": [], "ray": []}
    try:
        runners = {"local": [], "ray": ["--runner", "ray", "--ray-address", f"127.0.0.1:{port}"]}
        one_run(nginx.url, work, [])  # warm nginx's file cache
        for round_ in range(rounds):
            order = ["local", "ray"] if round_ % 2 == 0 else ["ray", "local"]
            for name in order:
                rows[name].append(one_run(nginx.url, work, runners[name]))
                log(f"round {round_ + 1} {name}: {rows[name][-1][0]:,.0f} files/s")
    finally:
        stop_ray()
        nginx.stop()
    ratios = [ray[0] / local[0] for ray, local in zip(rows["ray"], rows["local"], strict=True)]
    print(f"\n1. overhead: {files:,} files of 100 B from nginx, --sink null -w 2, {rounds} "
          "rounds (ABBA)")
    print(f"{'runner':<8} {'files/s (median)':>17} {'wall s (median)':>16} "
          f"{'machine CPU us/file':>20}  rounds (files/s)")
    for name, measured in rows.items():
        print(f"{name:<8} {statistics.median(m[0] for m in measured):>17,.0f} "
              f"{statistics.median(m[1] for m in measured):>16.2f} "
              f"{statistics.median(m[2] for m in measured):>20.1f}  "
              + " ".join(f"{m[0]:,.0f}" for m in measured))
    cpu_ratios = [ray[2] / local[2] for ray, local in zip(rows["ray"], rows["local"],
                                                            strict=True)]
    print("ray / local machine CPU per file (start-up included): median "
          f"{statistics.median(cpu_ratios):.3f}")
    ratio = statistics.median(ratios)
    print(f"ray / local files/s: median {ratio:.3f} (rounds: "
          + ", ".join(f"{r:.3f}" for r in ratios) + f"); bar >= {BAR}: "
          + ("met" if ratio >= BAR else "NOT met"))
    return ratio >= BAR


# -- 2. driver ceiling -----------------------------------------------------------------------
class InstantPool:
    """Workers that store every page the moment it is sent (the driver's ceiling)."""

    def __init__(self, workers: int) -> None:
        self.size = workers
        self.answers: list[Message] = []
        self.finished = False
        self.files = 0

    def start(self) -> None:
        pass

    def send(self, page: Any) -> None:
        count = len(page.names)
        self.files += count
        self.answers.append(("pages", 1, [PageReport(page.seq, count, 100 * count)]))

    def receive(self, timeout: float) -> list[Message]:
        answers, self.answers = self.answers, []
        if not answers:
            if self.finished:
                answers = [("exit", worker) for worker in range(self.size)]
            else:
                time.sleep(min(timeout, 0.001))
        answers.append(("tick", Tick(0, files_ok=self.files, bytes=100 * self.files)))
        return answers

    def dead(self) -> str | None:
        return None

    def all_gone(self) -> bool:
        return self.finished

    def finish(self, stop_now: bool) -> None:
        self.finished = True

    def join(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def where(self, worker: int) -> str:
        return "nowhere"

    def close(self) -> None:
        pass


def list_latency(url: str, pages: int) -> float:
    """Seconds per listing page, one client following the tokens."""
    token, started = None, time.monotonic()
    for _ in range(pages):
        query = "" if token is None else f"?next-marker={token}"
        with urllib.request.urlopen(f"{url}/list{query}", timeout=30) as answer:
            token = json.loads(answer.read()).get("NextMarker")
        if not token:
            break
    return (time.monotonic() - started) / pages


def journal_rate(work: Path, pages: int = 5000) -> float:
    """Pages per second the journal takes alone: each journaled as listed, then done (two
    commits per page, as in a run)."""
    from bulkfetch.dest.journal import Journal

    dest = work / "journal-only"
    shutil.rmtree(dest, ignore_errors=True)
    journal = Journal.open(dest, {"source": "benchmark"})
    started = time.monotonic()
    for seq in range(pages):
        journal.add_page(seq, None if seq == 0 else f"t{seq}", f"t{seq + 1}", 1000)
        journal.page_done(PageReport(seq, 1000, 100_000))
    elapsed = time.monotonic() - started
    journal.close()
    return pages / elapsed


def ceiling(files: int, page_size: int, work: Path) -> None:
    from bulkfetch.api import build_options
    from bulkfetch.runners.local import _run
    from bulkfetch.sources import make_source

    server = start_reference(["taskset", "-c", "0"] if shutil.which("taskset") else [],
                             files, 1, ["--page-size", str(page_size)])
    try:
        latency = list_latency(server.url, 50)
        journaled = journal_rate(work)
        dest = work / "ceiling"
        shutil.rmtree(dest, ignore_errors=True)
        options = build_options(server.url, dest, workers=8, sink="null")
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        report = _run(options, make_source(options), InstantPool(8), None)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        server.stop()
    if report.error or report.files_ok != files:
        raise SystemExit(f"the ceiling run did not finish: {report.error}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    pages = report.pages
    print(f"\n2. driver ceiling: {files:,} files in pages of {page_size:,} from bulkfetch "
          "serve (core 0), workers that store each page at once")
    print(f"{'pages':>8} {'wall s':>8} {'pages/s':>9} {'files/s':>11} {'driver CPU/page':>16} "
          f"{'list latency/page':>18} {'journal pages/s':>16}")
    print(f"{pages:>8,} {wall:>8.2f} {pages / wall:>9,.0f} {files / wall:>11,.0f} "
          f"{cpu / pages * 1e3:>13.2f} ms {latency * 1e3:>15.2f} ms {journaled:>16,.0f}")
    billion = 1e9 / page_size
    print(f"a billion files at these rates: driver {billion / (pages / wall) / 3600:.2f} h "
          f"(pages/s as measured), listing {billion * latency / 3600:.2f} h (sequential "
          "tokens, this latency)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ceiling-files", type=int, default=2_000_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-ceiling", action="store_true")
    args = parser.parse_args()
    met = True
    with tempfile.TemporaryDirectory(prefix="bf-ray-bench-") as work:
        if not args.skip_overhead:
            met = overhead(args.files, args.rounds, Path(work))
        if not args.skip_ceiling:
            with contextlib.suppress(KeyboardInterrupt):
                ceiling(args.ceiling_files, args.page_size, Path(work))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
