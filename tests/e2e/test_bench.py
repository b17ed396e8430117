"""`bulkfetch bench` end to end at a small size: a smoke test of the outputs, never of speed.

One session (2,000 files, --quick, both sweeps) is run for the module; each expected row is a
test of its own, skipped only when the session skipped it because its tool or library is
missing here."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.nginx

PNG = b"\x89PNG\r\n\x1a\n"
REQUIRED = ("name", "files_per_s", "cpu_us_per_file", "peak_rss_mb", "verified")
CORES = os.cpu_count() or 1
WORKERS = sorted({1, CORES})
EXPECTED = ["wrk", "sync", "threads-10", "threads-100", "processes", "asyncio", "combo",
            *(f"bulkfetch-{sink}-{w}w" for sink in ("dir", "tar", "null") for w in WORKERS),
            "rclone", "aria2c", "wget2", "curl"]


@dataclass
class Session:
    out: Path
    stdout: str
    stderr: str
    returncode: int
    rows: list[dict]

    @property
    def results(self) -> Path:
        """The results directory the session said it wrote (no --out was given)."""
        said = re.findall(r"^results: (/.*) \(", self.stderr, re.MULTILINE)
        assert len(said) == 1, self.stderr[-2000:]
        return Path(said[0])


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    if (shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")) is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is missing: .ci/run must install nginx-light")
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    out = tmp_path_factory.mktemp("bench")
    (out / "cwd").mkdir()
    done = subprocess.run(  # no --out: the results go under XDG_CACHE_HOME
        [sys.executable, "-m", "bulkfetch", "bench", "--files", "2000", "--quick",
         "--json", str(out / "x.json"), "--sweep-workers", "--sweep-concurrency"],
        capture_output=True, text=True, timeout=240, cwd=out / "cwd",
        env={**os.environ, "XDG_CACHE_HOME": str(out / "xdg")})
    rows = json.loads((out / "x.json").read_text()) if (out / "x.json").exists() else []
    return Session(out, done.stdout, done.stderr, done.returncode, rows)


def test_the_session_succeeds(session: Session) -> None:
    assert session.returncode == 0, session.stderr[-3000:]


def test_results_go_under_the_cache_and_never_into_the_working_directory(
        session: Session) -> None:
    assert session.results.parent == session.out / "xdg" / "bulkfetch" / "bench"
    assert session.results.name.endswith("-quick")
    assert (session.results / "table.md").is_file()
    assert list((session.out / "cwd").iterdir()) == []


def test_json_rows_have_the_required_keys(session: Session) -> None:
    assert isinstance(session.rows, list) and session.rows, session.stderr[-3000:]
    for row in session.rows:
        missing = [key for key in REQUIRED if key not in row]
        assert not missing, (row["name"], missing)
    measured = [r for r in session.rows if "skipped" not in r]
    assert all(r["verified"] is True for r in measured), [
        (r["name"], r["check"]) for r in measured if not r["verified"]]
    results = json.loads((session.results / "results.json").read_text())
    assert [r["name"] for r in results] == [r["name"] for r in session.rows]


@pytest.mark.parametrize("name", EXPECTED)
def test_row(session: Session, name: str) -> None:
    found = [r for r in session.rows if r["name"] == name]
    assert len(found) == 1, f"{name}: not in the JSON ({session.stderr[-2000:]})"
    row = found[0]
    if "skipped" in row:
        pytest.skip(f"{name}: {row['skipped']}")
    assert row["verified"] is True, row["check"]
    assert row["files_per_s"] > 0 and row["cpu_us_per_file"] > 0 and row["peak_rss_mb"] > 0
    assert f"| {name} |" in session.stdout


def test_sweep_points_are_verified(session: Session) -> None:
    workers = [r for r in session.rows if r.get("sweep") == "workers"]
    concurrency = [r for r in session.rows if r.get("sweep") == "concurrency"]
    assert [r["workers"] for r in workers] == list(range(1, 2 * CORES + 1))
    assert [r["concurrency"] for r in concurrency] == [1, 4, 16, 64, 256]
    assert all(r["verified"] is True for r in workers + concurrency)


def test_table_and_projection_are_printed(session: Session) -> None:
    lines = session.stdout.strip().splitlines()
    assert any(line.startswith("| row | files | files/s | files/s per core |") for line in lines)
    assert "Sweep of workers" in session.stdout and "Sweep of concurrency" in session.stdout
    assert lines[-1].startswith("One billion files at bulkfetch-")
    assert "16-core client" in lines[-1]
    table = (session.results / "table.md").read_text()
    assert table.strip() == session.stdout.strip()


def test_charts_and_machine_description(session: Session) -> None:
    results = session.results
    machine = (results / "machine.txt").read_text()
    assert "cpu: " in machine and "nginx: " in machine
    if importlib.util.find_spec("matplotlib") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("matplotlib is missing: .ci/run must install .[bench]")
        pytest.skip("matplotlib is not installed (pip install -e .[bench]): no charts")
    for name in ("chart.png", "sweep-workers.png", "sweep-concurrency.png"):
        path = results / name
        assert path.is_file(), f"{name} missing: {session.stdout[-1500:]}"
        assert path.read_bytes()[:8] == PNG


def test_cached_export_is_made_once_per_size_and_replaced_for_another(tmp_path: Path) -> None:
    from bulkfetch.bench.harness import cached_export

    directory = tmp_path / "export"
    config, note = cached_export(20, directory)
    assert config == str(directory / "nginx.conf") and "exported 20 files" in note
    assert len(list((directory / "files").iterdir())) == 20
    written = (directory / "nginx.conf").stat().st_mtime_ns
    assert cached_export(20, directory) == (config, "")  # reused, not exported again
    assert (directory / "nginx.conf").stat().st_mtime_ns == written
    config, note = cached_export(30, directory)  # another size replaces it whole
    assert "exported 30 files" in note
    assert len(list((directory / "files").iterdir())) == 30
    assert not (directory / ".complete-20").exists()


def run_get_script(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/get.py over 1,500 files exported into tmp_path."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "get.py"
    return subprocess.run(
        [sys.executable, str(script), "--files", "1500", *flags,
         "--export-dir", str(tmp_path / "export")],
        capture_output=True, text=True, timeout=300)


def test_get_benchmark_script_cleans_up_when_terminated(tmp_path: Path) -> None:
    """A TERM in the middle of a row stops nginx and removes the work directory (and the
    row's filesystem, if it had one) as Ctrl-C does."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "get.py"
    work = tmp_path / "tmp"
    work.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(script), "--files", "1500", "--repeat", "50", "--no-asyncio",
         "--export-dir", str(tmp_path / "export")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(work)})
    assert process.stderr is not None
    for line in process.stderr:  # into the measured rounds: nginx is up, work holds files
        if line.startswith("round 2 of"):
            break
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert list(work.iterdir()) == []
    deadline = time.monotonic() + 10
    while any(str(tmp_path) in cmdline for cmdline in command_lines()):
        assert time.monotonic() < deadline, "nginx still runs"
        time.sleep(0.1)
    assert not mounted_under(tmp_path)


def mounted_under(prefix: Path) -> list[str]:
    """Mount points whose path starts with `prefix`."""
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(prefix))]


def command_lines() -> list[str]:
    """Every process's command line, from /proc."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # it ended meanwhile
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ")
                             .decode(errors="replace"))
    return lines


def test_get_benchmark_script_verifies_every_row_and_pairs_rounds(tmp_path: Path) -> None:
    """benchmarks/get.py at a small size: every row's download is verified, and each bar
    between rows of one group lists one ratio per round and the interval of their median
    (a smoke test, never of speed)."""
    done = run_get_script(tmp_path, "--repeat", "1", "--paired-rounds", "6", "--no-dir")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| bare pycurl loop (memory)", "| bulkfetch null, 1 worker", "| bulkfetch tar, 1 worker"]
    assert all("| yes: " in row for row in rows), rows
    assert "1,500 indexed, 1,500 in" in rows[2]
    bars = [line for line in done.stdout.splitlines() if line.startswith("- [")]
    assert len(bars) == 4, done.stdout
    assert "; median of 6 rounds, every other one in reverse order" in done.stdout
    for line in bars:
        ratios, interval = line.split("; rounds ")[1].rstrip(")").split("; ")
        ratios = [float(ratio) for ratio in ratios.split(", ")]
        assert len(ratios) == 6 and all(ratio > 0 for ratio in ratios), line
        # six rounds: the interval is their whole range
        assert interval.startswith(f"95% interval {min(ratios):.3f}–{max(ratios):.3f}: "), line
        assert interval.rsplit(": ", 1)[1] in ("met", "missed", "not decided by these rounds")


def test_get_benchmark_script_runs_the_file_rows_each_on_its_own_filesystem(
        tmp_path: Path) -> None:
    """The rows that create files are verified like the others, and the table says where
    they ran: on a new ext4 each when this machine lets root make one, else in a directory."""
    done = run_get_script(tmp_path, "--repeat", "1", "--no-asyncio")
    assert done.returncode == 0, done.stderr[-2000:]
    header = done.stdout.splitlines()[0]
    assert ("each on a new ext4" in header) != ("earlier rows' deletes" in header), header
    rows = {line.split(" | ")[0]: line for line in done.stdout.splitlines()
            if line.startswith("| ")}
    assert "| yes: 1,500 counted |" in rows["| bare create loop (files)"]
    assert "| yes: 1,500 files, " in rows["| bulkfetch dir, 1 worker"]
    assert rows["| bulkfetch dir, 1 worker"].count("0 wrong") == 1
    assert "| yes: 1,500 counted |" in rows["| bare pycurl loop (beside the file rows)"]
    assert "| yes: 1,500 counted |" in rows["| bare create loop, renamed into place (files)"]
    # the directory bar pairs the dir row with the bare and create loops of its own round
    bar = next(line for line in done.stdout.splitlines() if "dir CPU/file" in line)
    assert "× (bare + create)" in bar and "; rounds " in bar, bar
    assert "too few rounds for a 95% interval" in bar, bar
    # after it, not as bars: the rename's share, and dir against bare + the renaming loop
    references = [re.fullmatch(r"- for reference, (.+) (\d+\.\d{3}) \(rounds (\d+\.\d{3})\)",
                               line)
                  for line in done.stdout.splitlines() if line.startswith("- for reference")]
    assert [match and match[1] for match in references] == [
        "(bare + renamed create) × (bare + create)",
        "dir CPU/file × (bare + renamed create)"], done.stdout
    # one round: its ratio is the median
    assert all(match[2] == match[3] and float(match[2]) > 0 for match in references)
    assert not mounted_under(Path(tempfile.gettempdir()) / "bulkfetch-bench-")  # all unmounted
