"""One benchmark session: export the data set, start nginx as in the standard setup, measure
the wrk ceiling, then every row in turn with a fresh DEST (on a new filesystem of its own for
the rows that create files, where root may make one: bulkfetch.bench.scratch says why),
letting the filesystem settle in between; each row is verified before the next starts."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.bench import ceiling, designs, peers
from bulkfetch.bench.harness import (
    Measured,
    Pinning,
    Server,
    bulkfetch_command,
    export_for_nginx,
    fit_open_file_cache,
    free_port,
    log,
    pinning,
    run_measured,
    settle,
    start_nginx,
)
from bulkfetch.bench.machine import cores as machine_cores
from bulkfetch.bench.machine import cpu_model
from bulkfetch.bench.rows import Row, Skipped
from bulkfetch.bench.scratch import FreshFilesystems
from bulkfetch.bench.verify import (
    Check,
    combine,
    export_names,
    verify_counted,
    verify_dir,
    verify_report,
    verify_tar,
)

# Slow designs run on 1/share of the files (the first ones listed); the others on all.
# (sync at ~200-500 files/s here would take 7-17 minutes over 200,000 files)
DESIGN_SHARE = {"sync": 40, "threads-10": 40, "threads-100": 40, "processes": 80,
                "asyncio": 10, "combo": 4}
SINKS = ("dir", "tar", "null")
SWEEP_CONCURRENCY = (1, 4, 16, 64, 256)
SWEEP_FILES = 20_000  # sweep points run on at most this many files (a URL list) ...
SWEEP_FILES_QUICK = 5_000  # ... or this many with --quick
MIN_SUBSET = 100


class BenchError(Exception):
    """The session cannot run here (no nginx, the export failed, ...)."""


@dataclass(frozen=True)
class Settings:
    files: int
    quick: bool = False
    sweep_workers: bool = False
    sweep_concurrency: bool = False
    export_dir: Path | None = None
    only: tuple[str, ...] = ()  # run only rows whose names start with one of these
    wrk_seconds: float = 5.0
    pause: float = 2.0  # seconds to let the filesystem settle between rows


@dataclass
class Outcome:
    rows: list[Row] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    title: str = ""
    placement: str = ""


def subset_size(total: int, share: int) -> int:
    """The files a row with `share` runs on: total // share, but at least MIN_SUBSET."""
    if share <= 1:
        return total
    return max(min(total, MIN_SUBSET), total // share)


def row_timeout(files: int) -> float:
    """Generous: a row slower than 100 files/s has something wrong."""
    return 120 + files / 100


def have_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def nginx_binary() -> str | None:
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


class Session:
    def __init__(self, settings: Settings, place: Pinning, work: Path, export: Path,
                 base: str, outcome: Outcome, filesystems: FreshFilesystems) -> None:
        self.settings = settings
        self.filesystems = filesystems
        self.place = place
        self.work = work
        self.export = export
        self.base = base
        self.outcome = outcome
        self.count = 0

    @property
    def files(self) -> int:
        return self.settings.files

    def wanted(self, name: str) -> bool:
        return not self.settings.only or name.startswith(self.settings.only)

    def skip(self, name: str, reason: str) -> None:
        if self.wanted(name):
            log(f"  {name}: skipped, {reason}")
            self.outcome.skipped.append(Skipped(name, reason))

    def fresh(self, label: str) -> Path:
        """DEST for a row: not made yet, in a directory of its own that measure() turns into
        the row's filesystem when the row creates files."""
        self.count += 1
        return self.work / f"{self.count:02d}-{label}" / "dest"

    def measure(self, name: str, kind: str, command: list[str], files: int, dest: Path | None,
                check: Callable[[Measured], Check], creates_files: bool = True,
                make_dest: bool = False, **meta: object) -> Row | None:
        if not self.wanted(name):
            return None
        log(f"  {name} ({files:,} files) ...")
        place = (self.filesystems.row(dest.parent, files)
                 if dest is not None and creates_files else contextlib.nullcontext())
        with place:
            if dest is not None:
                dest.parent.mkdir(exist_ok=True)
                if make_dest:
                    dest.mkdir()
            measured = run_measured([*self.place.client, *command], timeout=row_timeout(files))
            try:
                verdict = check(measured)
            except Exception as exc:  # a checker tripping over a broken DEST: a failed check
                verdict = Check(False, f"verification failed: {exc}")
        if measured.returncode != 0 and verdict.ok:
            verdict = Check(False, f"exit {measured.returncode}; {verdict.detail}")
        if not verdict.ok and measured.stderr.strip():
            last = measured.stderr.strip().splitlines()[-1][:200]
            verdict = Check(False, f"{verdict.detail}; stderr: {last}")
        row = Row(name=name, kind=kind, files=files, total=self.files,
                  seconds=measured.seconds, cpu_seconds=measured.cpu_seconds,
                  peak_rss=measured.peak_rss, cores=self.place.cores, check=verdict,
                  command=command, **meta)  # type: ignore[arg-type]
        log(f"    {row.files_per_s:,.0f} files/s, {row.cpu_us_per_file:,.1f} µs CPU/file, "
            f"{row.peak_rss_mb:,.0f} MB, {verdict}")
        self.outcome.rows.append(row)
        if dest is not None and not creates_files:  # row() removed the files of the others
            started = time.monotonic()
            settle(dest.parent, pause=self.settings.pause)
            log(f"    settled in {time.monotonic() - started:.1f} s")
        return row

    # -- the rows ------------------------------------------------------------------------
    def ceiling(self) -> None:
        if not self.wanted("wrk"):
            return
        if shutil.which("wrk") is None:
            self.skip("wrk", "wrk is not installed (apt-get install wrk): no ceiling ratio")
            return
        first = next(export_names(self.export, 1))
        url = peers.file_url(self.base, first)
        seconds = self.settings.wrk_seconds
        log(f"  wrk ceiling ({seconds:.0f} s on {url}) ...")
        measured = run_measured([*self.place.client, *ceiling.command(url, seconds)],
                                timeout=seconds + 60)
        try:
            result = ceiling.parse(measured.stdout)
        except ValueError as exc:
            self.outcome.rows.append(Row("wrk", "ceiling", 0, self.files, seconds, 0.0, 0,
                                         self.place.cores, Check(False, str(exc))))
            return
        check = Check(result.errors == 0 and result.requests > 0,
                      f"{result.errors} errors; one URL, {result.seconds:.0f} s")
        row = Row("wrk", "ceiling", result.requests, self.files, result.seconds,
                  measured.cpu_seconds, measured.peak_rss, self.place.cores, check,
                  note=f"wrk -t1 -c{ceiling.CONNECTIONS}, one URL", concurrency=64,
                  command=ceiling.command(url, seconds))
        log(f"    {row.files_per_s:,.0f} requests/s, {check}")
        self.outcome.rows.append(row)

    def designs(self) -> None:
        for name in designs.NAMES:
            need = designs.requirement(name)
            if not have_module(need):
                self.skip(name, f"needs {need}: pip install -e .[bench]")
                continue
            files = subset_size(self.files, DESIGN_SHARE[name])
            dest = self.fresh(name)
            command = [sys.executable, "-m", "bulkfetch.bench.designs", name, self.base,
                       str(files), str(dest), "--workers", str(machine_cores())]

            def check(measured: Measured, dest: Path = dest, files: int = files) -> Check:
                return combine(verify_counted(measured.stdout, files),
                               verify_dir(dest, self.export, files))

            workers = machine_cores() if name in ("processes", "combo") else 1
            threads = int(name.split("-")[1]) if name.startswith("threads-") else None
            concurrency = designs.CONCURRENCY if name in ("asyncio", "combo") else threads or 1
            self.measure(name, "design", command, files, dest, check, workers=workers,
                         concurrency=concurrency)

    def bulkfetch(self) -> None:
        counts = sorted({1, machine_cores()})
        for sink in SINKS:
            for workers in counts:
                name = f"bulkfetch-{sink}-{workers}w"
                dest = self.fresh(name)
                report = self.work / f"{dest.parent.name}.json"
                command = [*bulkfetch_command(), "get", self.base, str(dest), "--workers",
                           str(workers), "--sink", sink, "-q", "--report", str(report)]

                def check(_: Measured, sink: str = sink, dest: Path = dest,
                          report: Path = report) -> Check:
                    done = verify_report(report, self.files)
                    if sink == "dir":
                        return combine(done, verify_dir(dest, self.export, self.files))
                    if sink == "tar":
                        return combine(done, verify_tar(dest, self.export, self.files))
                    return done

                self.measure(name, "bulkfetch", command, self.files, dest, check,
                             creates_files=sink != "null", workers=workers, concurrency=64,
                             note=f"{sink} sink")

    def peers(self) -> None:
        for peer in peers.PEERS:
            if not self.wanted(peer.name):
                continue
            reason = peers.missing(peer)
            if reason is not None:
                self.skip(peer.name, reason)
                continue
            files = subset_size(self.files, peer.subset)
            names = list(export_names(self.export, files))
            url_list = self.work / f"urls-{files}.txt"
            curl_config = self.work / f"curl-{files}.conf"
            names_file = self.work / f"names-{files}.txt" if files < self.files else None
            if peer.name in ("aria2c", "wget2") and not url_list.exists():
                peers.write_url_list(url_list, self.base, names)
            if peer.name == "curl" and not curl_config.exists():
                peers.write_curl_config(curl_config, self.base, names)
            if peer.name == "rclone" and names_file is not None:
                peers.write_names(names_file, names)
            dest = self.fresh(peer.name)
            command = peers.command(peer, self.base, dest, url_list, curl_config, names_file)

            def check(_: Measured, dest: Path = dest, files: int = files) -> Check:
                return verify_dir(dest, self.export, files)

            self.measure(peer.name, "peer", command, files, dest, check, make_dest=True,
                         concurrency=peers.PARALLEL)

    def sweeps(self) -> None:
        files = min(self.files, SWEEP_FILES_QUICK if self.settings.quick else SWEEP_FILES)
        url_list = self.work / f"urls-{files}.txt"
        if not url_list.exists():
            peers.write_url_list(url_list, self.base, export_names(self.export, files))
        points: list[tuple[str, int, int]] = []
        if self.settings.sweep_workers:
            points += [("workers", w, 64) for w in range(1, 2 * machine_cores() + 1)]
        if self.settings.sweep_concurrency:
            points += [("concurrency", 1, c) for c in SWEEP_CONCURRENCY]
        for sweep, workers, concurrency in points:
            name = f"bulkfetch-null-{workers}w-c{concurrency}"
            dest = self.fresh(f"sweep-{sweep}-{workers}-{concurrency}")
            report = self.work / f"{dest.parent.name}.json"
            command = [*bulkfetch_command(), "get", "--from-file", str(url_list), str(dest),
                       "--workers", str(workers), "--concurrency", str(concurrency),
                       "--sink", "null", "-q", "--report", str(report)]

            def check(_: Measured, report: Path = report) -> Check:
                return verify_report(report, files)

            self.measure(name, "sweep", command, files, dest, check, creates_files=False,
                         workers=workers, concurrency=concurrency, sweep=sweep,
                         note="URL list")


def prepare_export(settings: Settings, work: Path) -> tuple[Path, list[str]]:
    """The export directory (reused when --export-dir holds a complete one of this size)."""
    export = settings.export_dir or work / "export"
    marker = export / f".bench-complete-{settings.files}"
    if settings.export_dir is not None and marker.is_file():
        return export, [f"reused the export in {export}"]
    with contextlib.suppress(FileNotFoundError):
        for stale in export.glob(".bench-complete-*"):
            stale.unlink()
    config, note = export_for_nginx(settings.files, export)
    if config is None:
        raise BenchError(note)
    log(note)
    marker.touch()
    return export, []


def nginx_config(export: Path, work: Path) -> tuple[str, list[str]]:
    """A copy of the export's config on a port free now, with the autoindex rclone lists."""
    text = (export / "nginx.conf").read_text()
    text = re.sub(r"^(\s*listen\s+[^\s;]+:)\d+", lambda m: f"{m.group(1)}{free_port()}", text,
                  count=1, flags=re.MULTILINE)
    try:
        text = peers.with_autoindex(text, (export / "files").resolve())
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    config = work / "nginx-bench.conf"
    config.write_text(text)
    fitted, note = fit_open_file_cache(str(config), work, 512)
    return fitted, [note] if note else []


def check_server(base: str) -> None:
    """Fail early, not with a table of fast 404s."""
    try:
        with urllib.request.urlopen(base + "/list", timeout=30) as response:
            page = json.load(response)
    except (OSError, ValueError) as exc:
        raise BenchError(f"nginx does not answer {base}/list: {exc}") from None
    if not page.get("FileNames"):
        raise BenchError(f"{base}/list lists no files")


def title(settings: Settings, place: Pinning) -> str:
    day = datetime.date.today().isoformat()
    return (f"bulkfetch bench, {day}: {settings.files:,} files of 100 bytes from nginx "
            f"(static export, one nginx worker, keep-alive); {place.note}; {cpu_model()}, "
            f"{machine_cores()} cores; 64 transfers in flight unless the row says otherwise")


def run(settings: Settings) -> Outcome:
    """Run the whole session; the outcome holds the rows in the order they ran."""
    if nginx_binary() is None:
        raise BenchError("nginx is not installed (apt-get install nginx-light)")
    place = pinning()
    outcome = Outcome(title=title(settings, place), placement=place.note)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-bench-"))
    nginx: Server | None = None
    affinity = os.sched_getaffinity(0)
    try:
        if place.server_core is not None:
            # this process only waits and samples memory: keep it off the client's core
            os.sched_setaffinity(0, {place.server_core})
        export, notes = prepare_export(settings, work)
        outcome.notes += notes
        config, notes = nginx_config(export, work)
        outcome.notes += notes
        try:
            nginx = start_nginx(place.server, config)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None
        check_server(nginx.url)
        filesystems = FreshFilesystems(work)
        outcome.notes.append(f"Placement of files: {filesystems.note}.")
        session = Session(settings, place, work, export, nginx.url, outcome, filesystems)
        log(f"nginx at {nginx.url}; {place.note}")
        settle(pause=settings.pause)
        session.ceiling()
        session.designs()
        session.bulkfetch()
        session.peers()
        if settings.sweep_workers or settings.sweep_concurrency:
            session.sweeps()
    finally:
        if nginx is not None:
            nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
        os.sched_setaffinity(0, affinity)
    subsets = [r.name for r in outcome.rows if r.subset and r.sweep is None]
    if subsets:
        outcome.notes.append(f"Slow rows ran on a proportional subset (the first files "
                             f"listed, shown as 'subset 1/N'): {', '.join(subsets)}.")
    return outcome


def environment_note() -> str | None:
    """What `pip install -e .[bench]` or apt-get would add, or None when nothing is missing."""
    modules = [m for m in ("requests", "aiohttp", "matplotlib") if not have_module(m)]
    tools = [p.package for p in peers.PEERS if shutil.which(p.binary) is None]
    if shutil.which("wrk") is None:
        tools.append("wrk")
    parts = []
    if modules:
        parts.append(f"pip install -e .[bench] (missing: {', '.join(modules)})")
    if tools:
        parts.append(f"apt-get install {' '.join(tools)}")
    return "For every row and chart: " + " and ".join(parts) if parts else None
