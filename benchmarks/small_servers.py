"""The default concurrency against fixed settings and peers on the small servers new users
try first (issue 47), side by side in one run:

    python benchmarks/small_servers.py [--rounds 3] [--files 3000] [--api-files 5000]

- http.server: `python -m http.server` (a thread per connection, HTTP/1.0, listen backlog
  5) serving FILES files of 100 B, fetched from a URL list: bulkfetch's default, -c 1, 4,
  16 and 64, wget2 (16 threads) and aria2c (-j 16). Bars: the default within 1.3x of the
  best fixed -c and 1.2x of wget2 (wall time).
- json-api: a ThreadingHTTPServer answering a JSON listing with next-URL pages
  ({"items": [...], "next": URL}) and the files: the default and -c 1, 4, 16 and 64. Bar:
  the default within 1.5x of the best fixed -c.
- silent: `bulkfetch serve --stall-rate 0.01` (one first request in a hundred is never
  answered: the connection stays open, silent) against the same server without it, both
  with the default. Bar: every file arrives, exit 0, close to the run without silent
  requests and far below --idle-timeout (30 s).

Every row goes into a new DEST with one worker per core (the CLI's default), on a new ext4
of its own where root may mount one (bulkfetch.bench.scratch: creates soon after an earlier
row's deletes would cost several times as much), and is checked by the files it holds
(every file there, exit 0). Rounds alternate their order; the table shows each row's median
wall time over the rounds and every round's.
"""

from __future__ import annotations

import argparse
import http.server
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import FreshFilesystems, bulkfetch_command, log, run_measured, start_reference

FIXED = ("1", "4", "16", "64")
SETUPS = ("http.server", "json-api", "silent")
BODY = b"x" * 100


@dataclass
class Row:
    setup: str
    name: str
    seconds: list[float] = field(default_factory=list)
    ok: bool = True
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class ApiHandler(http.server.BaseHTTPRequestHandler):
    """GET /list?page=N -> {"items": [names], "next": URL or null}; GET /files/NAME -> 100 B.
    HTTP/1.1 keep-alive, a thread per connection (ThreadingHTTPServer)."""

    protocol_version = "HTTP/1.1"
    files = 0
    page_size = 100

    def do_GET(self) -> None:  # http.server's name
        path, _, query = self.path.partition("?")
        if path == "/list":
            page = int(query.partition("=")[2] or 0)
            start = page * self.page_size
            names = [f"f{i:06d}" for i in range(start, min(start + self.page_size, self.files))]
            more = start + self.page_size < self.files
            port = self.server.server_address[1]
            body = json.dumps({"items": names, "next": f"http://127.0.0.1:{port}/list?page="
                               f"{page + 1}" if more else None}).encode()
            kind = "application/json"
        elif path.startswith("/files/f"):
            body, kind = BODY, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class ApiServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that closed its connection (a dropped hedge, the end of a run) is no
        news; anything else is printed as http.server does."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def measure(row: Row, command: list[str], dest: Path, count: int, cwd: Path,
            filesystems: FreshFilesystems) -> None:
    """One run into `dest`, on a new filesystem mounted at its parent: on this machine's
    disk, creates soon after an earlier row's deletes cost several times as much
    (bulkfetch.bench.scratch), which made the silent rows' 20,000-file runs 1.3 s in a
    first round and 4.7-5.8 s in the next two (2026-11-29)."""
    with filesystems.row(dest.parent, count):
        got = run_measured(command, timeout=600, cwd=cwd)
        stored = sum(1 for path in dest.rglob("*") if path.is_file()
                     and ".bulkfetch" not in path.parts) if dest.exists() else 0
    if got.returncode != 0 or stored != count:
        row.ok = False
        row.note = f"exit {got.returncode}, {stored} of {count} files; {got.stderr[-300:]}"
    row.seconds.append(got.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--api-files", type=int, default=5000)
    parser.add_argument("--silent-files", type=int, default=20000)
    parser.add_argument("--only", action="append", choices=SETUPS,
                        help="run this setup only (repeat for more); default: all")
    args = parser.parse_args(argv)
    only = set(args.only or SETUPS)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-small-"))
    bulkfetch = bulkfetch_command()
    rows: list[Row] = []
    try:
        filesystems = FreshFilesystems(work)
        if "http.server" in only:
            rows += http_server(args.files, args.rounds, bulkfetch, work, filesystems)
        if "json-api" in only:
            rows += json_api(args.api_files, args.rounds, bulkfetch, work, filesystems)
        if "silent" in only:
            rows += silent(args.silent_files, args.rounds, bulkfetch, work, filesystems)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"DEST: {filesystems.note}")
    print()
    print(table(rows))
    print()
    print(verdicts(rows))
    return 0


def http_server(files: int, rounds: int, bulkfetch: list[str], work: Path,
                filesystems: FreshFilesystems) -> list[Row]:
    """`python -m http.server` serving `files` files of 100 B, fetched from a URL list."""
    served = work / "served"
    served.mkdir()
    for i in range(files):
        (served / f"f{i:06d}").write_bytes(BODY)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(served)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    urls = work / "urls.txt"
    urls.write_text("".join(f"http://127.0.0.1:{port}/f{i:06d}\n" for i in range(files)))
    plan = settings("http.server", work / "hs",
                    lambda dest: [*bulkfetch, "get", "--from-file", str(urls), str(dest), "-q"])
    if shutil.which("wget2"):
        plan.append((Row("http.server", "wget2 --max-threads 16"),
                     ["wget2", "-q", "--max-threads", "16", "-i", str(urls), "-P",
                      str(work / "hs-wget2" / "dest")], work / "hs-wget2" / "dest"))
    if shutil.which("aria2c"):
        plan.append((Row("http.server", "aria2c -j 16"),
                     ["aria2c", "-q", "-j", "16", "-i", str(urls), "-d",
                      str(work / "hs-aria2c" / "dest")], work / "hs-aria2c" / "dest"))
    try:
        run_rounds(plan, rounds, files, work, filesystems)
    finally:
        server.terminate()
        server.wait()
    return [row for row, _, _ in plan]


def json_api(files: int, rounds: int, bulkfetch: list[str], work: Path,
             filesystems: FreshFilesystems) -> list[Row]:
    """A ThreadingHTTPServer answering a JSON listing with next-URL pages, and the files."""
    ApiHandler.files = files
    api = ApiServer(("127.0.0.1", 0), ApiHandler)
    thread = threading.Thread(target=api.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{api.server_address[1]}"
    plan = settings("json-api", work / "api",
                    lambda dest: [*bulkfetch, "get", f"{base}/list", str(dest), "-q", "--items",
                                  "items", "--next", "next", "--paginate", "url",
                                  "--get-template", "{origin}/files/{name}"])
    try:
        run_rounds(plan, rounds, files, work, filesystems)
    finally:
        api.shutdown()
    return [row for row, _, _ in plan]


def silent(files: int, rounds: int, bulkfetch: list[str], work: Path,
           filesystems: FreshFilesystems) -> list[Row]:
    """The reference server leaving 1% of first requests silent, and the same without."""
    servers = [start_reference([], files, 1, ["--stall-rate", stall]) for stall in ("0", "0.01")]
    try:
        plan = []
        for server, name in zip(servers, ("no silent requests", "1% of first requests silent"),
                                strict=True):
            dest = work / f"silent-{len(plan)}" / "dest"
            plan.append((Row("silent", name), [*bulkfetch, "get", server.url, str(dest), "-q"],
                         dest))
        run_rounds(plan, rounds, files, work, filesystems)  # the two in turn, A B B A ...
        return [row for row, _, _ in plan]
    finally:
        for server in servers:
            server.stop()


def settings(setup: str, prefix: Path,
             command: Callable[[Path], list[str]]) -> list[tuple[Row, list[str], Path]]:
    """The default and each FIXED -c, as rows of `setup`, each into a DEST of its own."""
    plan = []
    for setting in ("auto", *FIXED):
        dest = prefix.with_name(f"{prefix.name}-{setting}") / "dest"
        if setting == "auto":
            plan.append((Row(setup, "bulkfetch default"), command(dest), dest))
        else:
            plan.append((Row(setup, f"bulkfetch -c {setting}"),
                         [*command(dest), "-c", setting], dest))
    return plan


def run_rounds(plan: list[tuple[Row, list[str], Path]], rounds: int, count: int,
               cwd: Path, filesystems: FreshFilesystems) -> None:
    for number in range(rounds):
        order = plan if number % 2 == 0 else list(reversed(plan))
        for row, command, dest in order:
            log(f"round {number + 1}: {row.setup}: {row.name} ...")
            measure(row, command, dest, count, cwd, filesystems)


def table(rows: list[Row]) -> str:
    lines = ["| setup | row | wall s (median) | rounds | verified |", "|---|---|---:|---|---|"]
    for row in rows:
        rounds = ", ".join(f"{s:.2f}" for s in row.seconds)
        lines.append(f"| {row.setup} | {row.name} | {row.median:.2f} | {rounds} | "
                     f"{'yes' if row.ok else 'NO: ' + row.note} |")
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> str:
    def of(setup: str, name: str) -> Row | None:
        return next((r for r in rows if r.setup == setup and r.name == name), None)

    out = []
    for setup, bar in (("http.server", 1.3), ("json-api", 1.5)):
        default = of(setup, "bulkfetch default")
        fixed = [r for r in rows if r.setup == setup and r.name.startswith("bulkfetch -c")]
        if default is None or not fixed:
            continue
        best = min(fixed, key=lambda r: r.median)
        ratio = default.median / best.median
        out.append(f"- [{'x' if ratio <= bar else ' '}] {setup}: default x best fixed "
                   f"({best.name}) {ratio:.2f} (<= {bar})")
    wget2, default = of("http.server", "wget2 --max-threads 16"), of("http.server",
                                                                    "bulkfetch default")
    if wget2 is not None and default is not None:
        ratio = default.median / wget2.median
        out.append(f"- [{'x' if ratio <= 1.2 else ' '}] http.server: default x wget2 "
                   f"{ratio:.2f} (<= 1.2)")
    calm, silent = of("silent", "no silent requests"), of("silent", "1% of first requests silent")
    if calm is not None and silent is not None:
        out.append(f"- [{'x' if silent.ok and silent.median < 2 * calm.median + 2 else ' '}] "
                   f"silent: {silent.median:.2f} s with 1% silent against {calm.median:.2f} s "
                   "without (all files, exit 0; --idle-timeout is 30 s)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
