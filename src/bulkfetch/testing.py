"""Helpers for tests that need a real server: start `bulkfetch serve` on a free port, stop it.

    with ReferenceServer("--files", "1000") as server:
        urllib.request.urlopen(server.url + "/list")

Used by bulkfetch's own test suite and usable by anyone testing against the seed API.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


@dataclass(frozen=True)
class LoggedRequest:
    time: float
    pid: int
    method: str
    target: str
    status: int
    length: int
    fault: str


class ReferenceServer:
    """`bulkfetch serve ARGS --port 0` in a subprocess; `url` once started."""

    def __init__(self, *args: str, processes: int = 1, access_log: bool = False,
                 start_timeout: float = 20.0) -> None:
        self.args = list(args)
        self.processes = processes
        self.start_timeout = start_timeout
        self.log_path: Path | None = None
        if access_log:
            handle, name = tempfile.mkstemp(prefix="bulkfetch-access-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.banner = ""

    def start(self) -> ReferenceServer:
        command = [sys.executable, "-m", "bulkfetch", "serve", "--port", "0",
                   "--processes", str(self.processes), *self.args]
        if self.log_path is not None:
            command += ["--access-log", str(self.log_path)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + self.start_timeout
        line = b""
        while not line.endswith(b"\n"):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                error = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"bulkfetch serve did not start: {error.strip()}")
            if selector.select(timeout=0.1):
                chunk = os.read(self.process.stdout.fileno(), 1)
                if not chunk:
                    continue
                line += chunk
        selector.close()
        self.banner = line.decode().strip()
        if not self.banner.startswith("serving http://"):
            self.stop()
            raise RuntimeError(f"unexpected first line from bulkfetch serve: {self.banner!r}")
        self.url = self.banner.split()[1]
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def requests(self) -> list[LoggedRequest]:
        """Every request the server has logged so far (needs access_log=True)."""
        if self.log_path is None:
            raise RuntimeError("start the ReferenceServer with access_log=True")
        rows = []
        for line in self.log_path.read_text().splitlines():
            stamp, pid, method, target, status, length, fault = line.split(" ")
            rows.append(LoggedRequest(float(stamp), int(pid), method, target, int(status),
                                      int(length), fault))
        return rows

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode

    def __enter__(self) -> ReferenceServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
