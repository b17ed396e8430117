"""What the benchmarks share (`bulkfetch bench` and the scripts in benchmarks/): core pinning,
starting and stopping servers (the reference server and nginx on a static export), CPU and
memory of a process tree, and letting the filesystem settle between rows."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.util.ports import free_port

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- CPU of a process tree, from /proc --------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may contain spaces
    return text[text.rindex(")") + 2 :].split()


def tree_cpu_seconds(root: int) -> float:
    """user + sys seconds of `root` and all its living descendants (and of the children
    they have reaped)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        # after the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / CLOCK_TICKS
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(child for child, parent in parents.items() if parent == pid)
    return total


# -- placement ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pinning:
    server: list[str]  # command prefix placing the server (empty: not pinned)
    client: list[str]  # ... and the client
    note: str
    client_cores: int = 0  # cores the client may use; 0: all of the machine's
    server_core: int | None = None  # the core the server is pinned to, if any

    @property
    def cores(self) -> int:
        """Cores the client may use (at least 1)."""
        return self.client_cores or len(os.sched_getaffinity(0)) or 1


def pinning() -> Pinning:
    taskset = shutil.which("taskset")
    cores = sorted(os.sched_getaffinity(0))
    if taskset is None:
        return Pinning([], [], "not pinned: taskset is missing")
    if len(cores) < 2:
        return Pinning([], [], f"not pinned: only core {cores} is available")
    return Pinning([taskset, "-c", str(cores[0])], [taskset, "-c", str(cores[1])],
                   f"server on core {cores[0]}, client on core {cores[1]}", client_cores=1,
                   server_core=cores[0])


# -- servers --------------------------------------------------------------------------------
class Server:
    """A started server process (own session, so its whole group can be stopped)."""

    def __init__(self, command: list[str], label: str) -> None:
        self.command = command
        self.label = label
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def bulkfetch_command() -> list[str]:
    """This interpreter, directly: a console-script shim (pyenv's is a bash script) would add
    its own start-up to every measured row. The package's bytecode is compiled first, as
    `pip install` does: from an editable checkout under PYTHONDONTWRITEBYTECODE every
    measured run would otherwise compile every module again."""
    _compile_package()
    return [sys.executable, "-m", "bulkfetch"]


@functools.cache
def _compile_package() -> None:
    import compileall
    import importlib.util

    found = importlib.util.find_spec("bulkfetch")  # where it is, without importing it
    if found is not None and found.submodule_search_locations:
        compileall.compile_dir(next(iter(found.submodule_search_locations)), quiet=1)


def start_reference(prefix: list[str], files: int, processes: int,
                    extra: Sequence[str] = ()) -> Server:
    """`bulkfetch serve` of `files` files (and the flags in `extra`) on a free port."""
    command = [*prefix, *bulkfetch_command(), "serve", "--port", "0", "--files", str(files),
               "--processes", str(processes), *extra]
    server = Server(command, "bulkfetch serve")
    server.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True)
    line = _first_line(server.process, timeout=60)
    if not line.startswith("serving http://"):
        server.stop()
        error = server.process.stderr.read().decode() if server.process.stderr else ""
        raise RuntimeError(f"bulkfetch serve did not start: {line!r} {error.strip()}")
    server.url = line.split()[1]
    return server


def _first_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    os.set_blocking(process.stdout.fileno(), False)
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            chunk = os.read(process.stdout.fileno(), 4096)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if not chunk:
            break
        line += chunk
    return line.decode(errors="replace").split("\n", 1)[0].strip()


def export_for_nginx(files: int, directory: Path) -> tuple[str | None, str]:
    """(nginx.conf path, note); the path is None when the export is not available."""
    port = free_port()
    command = [*bulkfetch_command(), "serve", "--files", str(files), "--port", str(port),
               "--export-static", str(directory)]
    log(f"exporting {files:,} files for nginx into {directory} ...")
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"export failed: {exc}"
    config = directory / "nginx.conf"
    if done.returncode != 0 or not config.is_file():
        reason = (done.stderr.strip().splitlines() or ["no nginx.conf written"])[-1]
        return None, f"export failed (exit {done.returncode}): {reason}"
    return str(config), f"exported {files:,} files in {time.monotonic() - started:.0f} s"


def cached_export(files: int, directory: Path) -> tuple[str | None, str]:
    """export_for_nginx(), reusing `directory` when an earlier call completed an export of
    the same size there (a marker file says so); anything else there is replaced."""
    directory = Path(directory)
    config, marker = directory / "nginx.conf", directory / f".complete-{files}"
    if marker.exists() and config.is_file():
        return str(config), ""
    shutil.rmtree(directory, ignore_errors=True)
    path, note = export_for_nginx(files, directory)
    if path is not None:
        marker.touch()
    return path, note


def fit_open_file_cache(config: str, work: Path, connections: int) -> tuple[str, str]:
    """nginx keeps up to `open_file_cache max=N` descriptors open; more than the descriptor
    limit allows makes it answer 500 once the cache fills. Returns the config to run (a
    patched copy in `work` when needed) and a note."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by nginx
        soft = hard
    text = Path(config).read_text()
    match = re.search(r"open_file_cache\s+max=(\d+)", text)
    room = max(64, soft - 4 * connections - 256)
    if match is None or int(match.group(1)) <= room:
        return config, ""
    patched = work / "nginx.conf"
    patched.write_text(text.replace(match.group(0), f"open_file_cache max={room}", 1))
    return str(patched), (f"the export's open_file_cache max={match.group(1)} exceeds the "
                          f"descriptor limit {soft}; ran a copy with max={room}")


def start_nginx(prefix: list[str], config: str) -> Server:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    text = Path(config).read_text()
    match = re.search(r"^\s*listen\s+([^\s;]+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no listen directive in {config}")
    host, _, port = match.group(1).rpartition(":")
    command = [*prefix, nginx, "-c", config, "-g", "daemon off;"]
    server = Server(command, "nginx")
    server.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            error = server.process.stderr.read().decode() if server.process.stderr else ""
            raise RuntimeError(f"nginx exited: {error.strip()}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.2):
            server.url = f"http://{host}:{port}"
            return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError("nginx did not start listening within 20 s")


def _parent(pid: str) -> int | None:
    """The parent pid of /proc/<pid>, or None when it is gone (cheap: sampled often)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 512)
    except OSError:
        return None
    finally:
        os.close(fd)
    # the command name (field 2) is in parentheses and may contain spaces; then state, ppid
    return int(data[data.rindex(b")") + 2:].split(None, 2)[1])


def tree_pids(root: int) -> list[int]:
    """`root` and its living descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (from /proc/<pid>/statm), 0 when it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError:
        return 0
    try:
        return int(os.read(fd, 256).split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0
    finally:
        os.close(fd)


class TreeMemory:
    """Samples the summed RSS of a process tree every `interval` seconds; `peak` in bytes."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self.root = root
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = sum(_rss_bytes(pid) for pid in tree_pids(self.root))
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Measured:
    seconds: float
    cpu_seconds: float  # user + sys of the whole process tree (waited-for descendants)
    peak_rss: int  # bytes, summed over the tree, sampled
    returncode: int
    stdout: str
    stderr: str


def run_measured(command: list[str], timeout: float = 3600,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Measured:
    """Run `command` to its end; its tree's CPU comes from RUSAGE_CHILDREN deltas, which count
    every descendant as long as each parent waits for its children (ours all do). `env`
    entries are added to this process's environment."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                               env=None if env is None else {**os.environ, **env}, cwd=cwd)
    with TreeMemory(process.pid) as memory:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        except BaseException:  # Ctrl-C: its own session would not see the signal
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(seconds, cpu, memory.peak, process.returncode, out, err)


def settle(*paths: Path, pause: float = 2.0) -> None:
    """Remove the last row's files and let the filesystem finish with them: deleting 200,000
    files leaves ext4 work behind that would slow the next row's file creation tenfold."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    os.sync()
    time.sleep(pause)


def alternating_rounds(rows: dict[str, list[str]], rounds: int, files: int,
                       verify: Callable[[str, Measured], str],
                       env: dict[str, str] | None = None, timeout: float = 1800,
                       ) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """Run every row `rounds` times, every other round in reverse order (a machine's speed
    drifts: each row sees early and late turns). Returns (label -> [(seconds, CPU
    seconds)] by round, label -> what `verify(label, run)` said of its last run)."""
    measured: dict[str, list[tuple[float, float]]] = {label: [] for label in rows}
    verified: dict[str, str] = {}
    for number in range(rounds):
        order = list(rows) if number % 2 == 0 else list(rows)[::-1]
        for label in order:
            run = run_measured(rows[label], timeout=timeout, env=env)
            verified[label] = verify(label, run)
            measured[label].append((run.seconds, run.cpu_seconds))
            log(f"  round {number + 1}: {label}: {files / run.seconds:,.0f} files/s")
    return measured, verified


def report_verified(report: Path, files: int, run: Measured, dest: Path) -> str:
    """A `bulkfetch get --report` row's check: every file ok by its report; its DEST goes."""
    found = json.loads(report.read_text())
    shutil.rmtree(dest, ignore_errors=True)
    ok = found["files_ok"] == files and run.returncode == 0
    return f"{'yes' if ok else 'NO'}: report says {found['files_ok']:,} ok"


def per_file(measured: dict[str, list[tuple[float, float]]], files: int,
             ) -> dict[str, tuple[float, float]]:
    """label -> (files/s, CPU µs a file), each the median over its rounds."""
    import statistics

    return {label: (files / statistics.median(s for s, _ in runs),
                    statistics.median(c for _, c in runs) / files * 1e6)
            for label, runs in measured.items()}
