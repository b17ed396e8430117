"""Helpers for tests that need a real server: start `bulkfetch serve` on a free port, stop it.

    with ReferenceServer("--files", "1000") as server:
        urllib.request.urlopen(server.url + "/list")

Used by bulkfetch's own test suite and usable by anyone testing against the seed API; also
a tree of webdataset samples to serve with `--root`, and what webdataset reads back.
"""

from __future__ import annotations

import hashlib
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote


@dataclass(frozen=True)
class LoggedRequest:
    """One access-log line. `auth`: the request carried an Authorization header (its value is
    never logged); `host`: its Host header as sent, e.g. "127.0.0.1:8000" ("" when absent or
    empty)."""

    time: float
    pid: int
    method: str
    target: str
    status: int
    length: int
    fault: str
    auth: bool = False
    host: str = ""

    @classmethod
    def parse(cls, line: str) -> LoggedRequest:
        """TIME PID METHOD TARGET STATUS LENGTH FAULT [AUTH HOST]: AUTH is yes/no, HOST is
        percent-encoded, '-' when absent (lines of older servers have neither)."""
        fields = line.split(" ")
        stamp, pid, method, target, status, length, fault = fields[:7]
        auth, host = False, ""
        if len(fields) == 9:
            auth = fields[7] == "yes"
            host = "" if fields[8] == "-" else unquote(fields[8])
        elif len(fields) != 7:
            raise ValueError(f"not an access-log line: {line!r}")
        return cls(float(stamp), int(pid), method, target, int(status), int(length), fault,
                   auth, host)


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
                # its stderr first: stop() closes it
                late = self.process.poll() is None
                if late:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
                error = self.process.stderr.read().decode(errors="replace") \
                    if self.process.stderr else ""
                self.stop()
                when = f" within {self.start_timeout:g} s" if late else ""
                raise RuntimeError(f"bulkfetch serve did not start{when}: {error.strip()}")
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
        return [LoggedRequest.parse(line) for line in self.log_path.read_text().splitlines()]

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


def write_tar_destination(dest: Path, shards: Sequence[Sequence[tuple[str, bytes]]],
                          worker: int = 0) -> list[list[tuple[str, int, int, str]]]:
    """A tar destination as `--sink tar` leaves it, written by Python's tarfile (PAX): one
    shard per entry of `shards`, indexed. Returns each shard's rows (name, data offset, size,
    md5) as given to the index. For tests of the readers, independent of the tar sink."""
    import hashlib
    import io
    import tarfile

    from bulkfetch.dest import index

    dest.mkdir(parents=True, exist_ok=True)
    conn = index.connect(dest, create=True)
    rows: list[list[tuple[str, int, int, str]]] = []
    try:
        first = index.next_shard_number(dest, worker)
        for number, files in enumerate(shards, first):
            file = index.shard_file(worker, number)
            with tarfile.open(dest / file, "w", format=tarfile.PAX_FORMAT) as tar:
                for name, body in files:
                    info = tarfile.TarInfo(name)
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
            with tarfile.open(dest / file) as tar:
                stored = tar.getmembers()
            members = [(name, info.offset_data, len(body), hashlib.md5(body).hexdigest())
                       for (name, body), info in zip(files, stored, strict=True)]
            index.add_shard(conn, file, worker, (dest / file).stat().st_size, 0.0, [], members)
            rows.append(members)
    finally:
        conn.close()
    return rows


def write_dir_destination(dest: Path, files: Mapping[str, bytes]) -> None:
    """A directory destination as `--sink dir` leaves it: DEST/<name> for each file."""
    for name, body in files.items():
        path = dest.joinpath(*name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


# -- samples (issue 19): a tree of webdataset-style samples, and what webdataset reads back --
SAMPLE_SHAPES = (("jpg",), ("jpg", "txt"), ("jpg", "json", "txt"), ("seg.png", "cls"),
                 ("tar.gz",))


def write_sample_tree(root: Path, samples: int, seed: int = 0) -> dict[str, dict[str, str]]:
    """`samples` samples of 1-3 members (nested directories, multi-dot extensions) under
    `root`; returns key -> {extension: MD5 of the member}."""
    rng = random.Random(seed)
    expected: dict[str, dict[str, str]] = {}
    for i in range(samples):
        folder = root / f"part{i % 7}" / f"sub{(i // 7) % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        key = f"part{i % 7}/sub{(i // 7) % 3}/{i:06d}"
        for extension in rng.choice(SAMPLE_SHAPES):
            body = rng.randbytes(rng.randint(1, 3000))
            (folder / f"{i:06d}.{extension}").write_bytes(body)
            expected.setdefault(key, {})[extension] = hashlib.md5(body).hexdigest()
    return expected


def read_samples(dest: Path) -> tuple[int, dict[str, dict[str, str]]]:
    """(samples the webdataset package reads from DEST's shards, key -> {extension: MD5})
    of the last sample read under each key."""
    import webdataset  # the test extra: the real reader users have

    shards = sorted(str(p) for p in Path(dest).glob("shard-*.tar"))
    count, found = 0, {}
    for sample in webdataset.WebDataset(shards, shardshuffle=False, empty_check=False):
        count += 1
        found[sample["__key__"]] = {extension: hashlib.md5(body).hexdigest()
                                    for extension, body in sample.items()
                                    if not extension.startswith("__")}
    return count, found
