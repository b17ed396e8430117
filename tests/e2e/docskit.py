"""Runs the examples of a Markdown page as written: the docs' examples are tests.

The convention (docs/index.md states it for writers and readers, under "Examples are
tests"):

- A ```bash block whose first line is a comment starting `# in another terminal` is a
  server: it is started in the background, in its own process group, once the port it uses
  is free (`--port N` in the block, else the command's default: 8000 for `bulkfetch serve`,
  5000 for `python -m bulkfetch.testing.registry`); the runner waits until that port answers
  and the server has printed its first line. A later server block on the same port replaces
  it (the reader pressed Ctrl-C). All are stopped when the page ends.
- Every other ```bash block runs, in page order, in ONE bash process per page run
  (`set -euo pipefail`), so `cd`, variables and `export`s carry over from block to block.
- A ```python block runs as `python3 -c BLOCK` in the page's working directory.
- A ```text block right after a run block (only blank lines between) is what that block
  prints: each of its lines must appear, in that order, among the lines the block wrote to
  stdout or stderr (leading and trailing spaces ignored); `...` in a line stands for any
  text, and a line of only `...` for lines left out. After a server block, it is checked
  against what the server printed.
- Blocks in any other language (```toml, ```text, ```console ...) are not run.

A page is run twice in the same working directory: the second run must pass as well (a
rerun resumes, a DEST is reused), and its outputs must still match.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.util.ports import port_is_free

BACKGROUND = "# in another terminal"
DEFAULT_PORTS = {"bulkfetch serve": 8000, "bulkfetch.testing.registry": 5000}
RUN = ("bash", "python")
BLOCK_TIMEOUT = 240.0  # seconds for one block; a page's examples are meant to take seconds
_FENCE = re.compile(r"^( *)```([\w+-]*)\s*$")
_MARK = "@@docs-runner-block-done@@"


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, from 1
    expect: str | None = None  # the ```text block right after it

    @property
    def background(self) -> bool:
        return self.lang == "bash" and self.code.lstrip().startswith(BACKGROUND)

    def where(self, page: Path) -> str:
        return f"{page.name}:{self.line}"


def parse(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order; a ```text block right after a
    ```bash or ```python block becomes that block's `expect` instead of a block."""
    lines = text.splitlines()
    found: list[tuple[str, str, int, int]] = []  # lang, code, first line, closing line
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, lang = len(opening[1]), opening[2]
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"line {index + 1}: a ``` block that is never closed")
        body = [line[indent:] if line[:indent].strip() == "" else line
                for line in lines[index + 1:end]]
        found.append((lang, "\n".join(body) + "\n", index + 1, end + 1))
        index = end + 1
    blocks: list[Block] = []
    for position, (lang, code, first, _) in enumerate(found):
        previous = found[position - 1] if position else None
        if (lang == "text" and previous is not None and previous[0] in RUN
                and all(not line.strip() for line in lines[previous[3]:first - 1])):
            blocks[-1] = Block(blocks[-1].lang, blocks[-1].code, blocks[-1].line, code)
            continue
        blocks.append(Block(lang, code, first))
    return blocks


def mismatch(expected: str, output: str) -> str | None:
    """None when every line of `expected` appears in `output` in order (see the module's
    docstring), else the first expected line that does not."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for wanted in (line.strip() for line in expected.splitlines()):
        if not wanted or wanted == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in wanted.split("...")))
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return wanted
        at += 1
    return None


def port_of(code: str) -> int:
    """The port a server block listens on: its --port, else its command's default."""
    words = shlex.split(code, comments=True)
    for flag, value in itertools.pairwise(words):
        if flag == "--port":
            return int(value)
    for command, port in DEFAULT_PORTS.items():
        if command in code:
            return port
    raise ValueError("a server block must say its port (--port N)")


def answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


class Failure(AssertionError):
    pass


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)  # as Ctrl-C in its terminal
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        deadline = time.monotonic() + 10  # its children (the server's processes) too
        while answers(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)


class Shell:
    """One bash process fed block after block; a block's output is what it printed up to the
    marker the runner prints after it."""

    def __init__(self, cwd: Path, env: Mapping[str, str], scratch: Path) -> None:
        self.scratch = scratch
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=cwd, env=dict(env), start_new_session=True)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self._send("set -euo pipefail\n")
        self.count = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def run(self, code: str, timeout: float = BLOCK_TIMEOUT) -> tuple[int, str]:
        """(0, output) when the block ran to its end; (bash's exit status, output) when a
        command in it failed (set -e ended the shell)."""
        self.count += 1
        script = self.scratch / f"block-{self.count}.sh"
        script.write_text(code)
        try:
            self._send(f"source {shlex.quote(str(script))}\nprintf '\\n{_MARK}\\n'\n")
        except BrokenPipeError:
            return self.process.wait(), "(the shell had exited)"
        output: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise Failure(f"timed out after {timeout:g} s; it printed:\n"
                              + "".join(output)) from None
            if line is None:
                return self.process.wait(), "".join(output)
            text = line.decode(errors="replace")
            if text.rstrip("\n") == _MARK:
                if output and output[-1] == "\n":  # the newline printed before the marker
                    output.pop()
                return 0, "".join(output)
            output.append(text)

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # anything a block left running
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


@dataclass
class PageRun:
    """One run of a page's blocks in `cwd`, servers and all."""

    page: Path
    cwd: Path
    env: Mapping[str, str]
    scratch: Path
    servers: dict[int, Server] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)  # "page:line lang seconds", for the log

    def run(self, blocks: list[Block]) -> None:
        shell = Shell(self.cwd, self.env, self.scratch)
        try:
            for block in blocks:
                began = time.monotonic()
                if block.background:
                    self._start_server(block)
                elif block.lang == "bash":
                    status, output = shell.run(block.code)
                    self._check(block, status, output)
                elif block.lang == "python":
                    done = subprocess.run([sys.executable, "-c", block.code], cwd=self.cwd,
                                          env=dict(self.env), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
                    self._check(block, done.returncode, done.stdout.decode(errors="replace"))
                else:
                    continue
                self.ran.append(f"{block.where(self.page)} {block.lang} "
                                f"{time.monotonic() - began:.1f} s")
        finally:
            shell.close()
            for server in self.servers.values():
                server.stop()

    def _fail(self, block: Block, why: str, output: str) -> Failure:
        return Failure(f"{block.where(self.page)} ({block.lang}) {why}\n--- block:\n"
                       f"{block.code}--- output:\n{output[-6000:]}")

    def _check(self, block: Block, status: int, output: str) -> None:
        if status != 0:
            raise self._fail(block, f"exited with status {status}", output)
        if block.expect is not None:
            missing = mismatch(block.expect, output)
            if missing is not None:
                raise self._fail(block, f"did not print the line {missing!r} of the text "
                                        "block after it (in order)", output)

    def _start_server(self, block: Block) -> None:
        port = port_of(block.code)
        if port in self.servers:  # the reader stops the earlier one first
            self.servers.pop(port).stop()
        deadline = time.monotonic() + 60
        while not port_is_free(port):
            if time.monotonic() > deadline:
                raise self._fail(block, f"cannot start: port {port} stays in use by another "
                                        "process", "")
            time.sleep(0.5)
        log = self.scratch / f"server-{port}-{block.line}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(["bash", "-c", block.code], cwd=self.cwd,
                                       env=dict(self.env), stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        server = Server(process, port, log)
        self.servers[port] = server
        deadline = time.monotonic() + 90
        while not (answers(port) and server.output().strip()):
            if process.poll() is not None:
                raise self._fail(block, f"stopped with status {process.returncode} before "
                                        f"port {port} answered", server.output())
            if time.monotonic() > deadline:
                raise self._fail(block, f"port {port} did not answer within 90 s",
                                 server.output())
            time.sleep(0.1)
        if block.expect is not None:
            deadline = time.monotonic() + 10
            while (missing := mismatch(block.expect, server.output())) is not None:
                if time.monotonic() > deadline:
                    raise self._fail(block, f"did not print the line {missing!r} of the text "
                                            "block after it", server.output())
                time.sleep(0.1)


def shims(directory: Path) -> Path:
    """bulkfetch, python3 and python for the blocks: this interpreter and, by PYTHONPATH,
    this tree; whatever `bulkfetch` script is installed elsewhere is never run."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, command in (("bulkfetch", f"{sys.executable} -m bulkfetch"),
                          ("python3", sys.executable), ("python", sys.executable)):
        path = directory / name
        path.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        path.chmod(0o755)
    return directory


def environment(root: Path, src: Path) -> dict[str, str]:
    """What the blocks run with: this tree first, a home, cache and Docker config of their
    own under `root`, none of the machine's AWS, Ray, proxy or bulkfetch settings."""
    dropped = ("AWS_", "RAY_", "BULKFETCH_", "DOCKER_")
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith(dropped) and not name.lower().endswith("_proxy")}
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    python_path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    return kept | {"PATH": f"{shims(root / 'bin')}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONPATH": python_path, "HOME": str(home),
                   "XDG_CACHE_HOME": str(root / "cache"), "COLUMNS": "80",
                   "PYTHONUNBUFFERED": "1"}


def run_twice(page: Path, blocks: list[Block], root: Path, src: Path) -> Iterator[PageRun]:
    """Run the page's blocks twice in root/work; yields each finished run."""
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    env = environment(root, src)
    for number in (1, 2):
        scratch = root / f"run-{number}"
        scratch.mkdir()
        run = PageRun(page, work, env, scratch)
        try:
            run.run(blocks)
        except Failure as failure:
            raise Failure(f"run {number} of {page.name}: {failure}") from None
        yield run
