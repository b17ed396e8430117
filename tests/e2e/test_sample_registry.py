"""`python -m bulkfetch.testing.registry`: a registry on loopback holding sample images,
for the containers guide. It prints what to pull, answers on its port only once the images
are there, and leaves nothing behind on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bulkfetch.util.ports import free_port

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("docker-registry", "skopeo")),
    reason="needs docker-registry and skopeo (bash .ci/run installs them)")


@dataclass
class Started:
    process: subprocess.Popen[str]
    port: int
    lines: list[str]

    def work_dir(self) -> Path:
        found = re.search(r"data in (\S+), removed on exit", self.lines[0])
        assert found, self.lines[0]
        return Path(found[1])


def start(*args: str, port: int | None = None) -> Started:
    port = port or free_port()
    process = subprocess.Popen([sys.executable, "-m", "bulkfetch.testing.registry",
                                "--port", str(port), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "Stop with Ctrl-C.":
        line = process.stdout.readline()
        assert line, f"the registry stopped: {process.stderr.read() if process.stderr else ''}"
        lines.append(line.rstrip("\n"))
    return Started(process, port, lines)


@pytest.fixture
def registries() -> Iterator[list[Started]]:
    started: list[Started] = []
    yield started
    for each in started:
        if each.process.poll() is None:
            # SIGTERM, as a user's Ctrl-C: docker-registry runs in a session of its own,
            # which only the module's own clean-up stops (a SIGKILL would leave it running)
            each.process.send_signal(signal.SIGTERM)
            try:
                each.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(each.process.pid, signal.SIGKILL)
                each.process.wait()


def pull(tmp: Path, command: str) -> subprocess.CompletedProcess[str]:
    """Run a `bulkfetch pull` command line as printed (through bash: it may hold a pipe),
    with this tree's bulkfetch."""
    shim = tmp / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "bulkfetch").write_text(f'#!/bin/sh\nexec {sys.executable} -m bulkfetch "$@"\n')
    (shim / "bulkfetch").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp / "cache"), "DOCKER_CONFIG": str(tmp / "docker")}
    return subprocess.run(["bash", "-c", command + " --quiet"], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


def test_it_prints_what_to_pull_and_that_pulls(tmp_path: Path,
                                               registries: list[Started]) -> None:
    registry = start()
    registries.append(registry)
    here = f"127.0.0.1:{registry.port}"
    assert registry.lines[0].startswith(f"serving {here} (docker-registry, plain HTTP, no auth")
    assert registry.lines[1:4] == [
        f"image {here}/sample/app:v1 (3 layers, 26.3 MB)",
        f"image {here}/sample/app:v2 (3 layers, 25.6 MB; 2 of them as in v1)",
        f"image {here}/sample/multi:v1 (an index: linux/amd64, linux/arm64)"]
    command = registry.lines[4].removeprefix("pull one: ")
    assert command == f"bulkfetch pull {here}/sample/app:v1 ./layout"
    done = pull(tmp_path, command)
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"]
            for m in index["manifests"]] == ["v1"]
    for ref in ("sample/app:v2", "sample/multi:v1"):
        done = pull(tmp_path, f"bulkfetch pull {here}/{ref} ./{ref.replace('/', '-')}")
        assert done.returncode == 0, (ref, done.stderr)

    work = registry.work_dir()
    assert work.is_dir()
    registry.process.send_signal(signal.SIGTERM)
    assert registry.process.wait(20) == 0
    assert not work.exists()  # its data went with it
    with pytest.raises(OSError):  # and so did docker-registry
        socket.create_connection(("127.0.0.1", registry.port), 1).close()


def test_with_a_user_the_printed_pull_logs_in(tmp_path: Path,
                                              registries: list[Started]) -> None:
    registry = start("--user", "alice:won der")
    registries.append(registry)
    here = f"127.0.0.1:{registry.port}"
    assert "Basic auth, user alice" in registry.lines[0]
    command = registry.lines[-2].removeprefix("pull one: ")
    assert command == (f"echo 'won der' | bulkfetch pull --username alice --password-stdin "
                       f"{here}/sample/app:v1 ./layout")
    done = pull(tmp_path, command)
    assert done.returncode == 0, done.stderr
    refused = pull(tmp_path, f"bulkfetch pull {here}/sample/app:v1 ./anonymous")
    assert refused.returncode == 2, refused.stderr


def test_a_port_in_use_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "bulkfetch.testing.registry", "--port",
                               str(taken.getsockname()[1])],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "is in use" in done.stderr and "--port" in done.stderr
    assert time.monotonic() - began < 10
