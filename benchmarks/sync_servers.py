"""`bulkfetch get --sync` against web servers whose ETag is not the body's MD5 (issue 49), the
servers' access logs as witness:

    python benchmarks/sync_servers.py [--files 20000] [--changed 0.01]

Three servers on one tree of small files (0-3,000 bytes) named by a URL list: stock nginx
(its own "mtime-size" ETags and Last-Modified), nginx that ignores conditional requests
(`etag off; if_modified_since off;`: every answer a 200) and `python -m http.server`
(Last-Modified, no ETag). For each: a first `get`, a `--sync` with nothing changed, then
--changed of the files rewritten on the server and a `--sync` again, and a fresh `get` into
another directory for comparison. The table: requests, 200s, 304s and body bytes in the log
for each pass, how the report judged the files unchanged, and each pass's time and CPU.

Bars: an unchanged pass moves no body (stock nginx, http.server: only 304s) or, from the
server that ignores conditional requests, each body is compared with DEST's copy; no pass
rewrites a file that did not change (inode and mtime) and the pass after the change rewrites
exactly the changed files; DEST then equals the server's tree byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from harness import bulkfetch_command, log, run_measured, start_nginx

try:
    import bulkfetch  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.testing.static_nginx import ACCESS_LINE, static_site_config
from bulkfetch.util.ports import free_port

HTTP_SERVER_LOG = re.compile(r'"GET (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3}) '
                             r'(?P<bytes>\d+|-)')


@dataclass
class Pass:
    label: str
    requests: int
    ok: int  # 200s
    not_modified: int  # 304s
    body_bytes: int  # from the log (http.server logs none: "-")
    seconds: float
    cpu: float
    unchanged_by: dict[str, int]


def build_tree(root: Path, files: int) -> list[str]:
    rng = random.Random(49)
    names = []
    for index in range(files):
        name = f"d{index % 100:02d}/file-{index:06d}.bin"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(0, 3000)))
        names.append(name)
    old = time.time() - 3600
    for name in names:
        os.utime(root / name, (old, old))
    return names


def read_log(path: Path, pattern: re.Pattern[str]) -> list[tuple[int, int, str]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = pattern.search(line)
        if match:
            size = match["bytes"]
            found.append((int(match["status"]), int(size) if size.isdigit() else 0,
                          match["target"]))
    return found


def measure(server: str, root: Path, names: list[str], url: str, log_path: Path,
            pattern: re.Pattern[str], work: Path, changed_share: float
            ) -> tuple[list[Pass], bool, int]:
    urls = work / f"{server}.txt"
    urls.write_text("".join(f"{url}/{quote(name)}\n" for name in names))
    dest, report = work / f"{server}-dest", work / "report.json"

    def get(label: str, target: Path, *extra: str) -> Pass:
        seen = len(read_log(log_path, pattern))
        run = run_measured([*bulkfetch_command(), "get", "--from-file", str(urls), str(target),
                            "-w", "1", "-q", "--report", str(report), *extra])
        if run.returncode != 0:
            raise SystemExit(f"{server}: get {' '.join(extra)} failed: {run.stderr[-800:]}")
        time.sleep(0.2)  # (the server writes its last log lines)
        answers = read_log(log_path, pattern)[seen:]
        found = json.loads(report.read_text())
        return Pass(label, len(answers), sum(1 for a in answers if a[0] == 200),
                    sum(1 for a in answers if a[0] == 304), sum(a[1] for a in answers),
                    run.seconds, run.cpu_seconds, found.get("unchanged_by", {}))

    def stamps() -> dict[str, tuple[int, int]]:
        return {name: (found.st_ino, found.st_mtime_ns)
                for name in names for found in [os.stat(dest / name)]}

    passes = [get("get", dest)]
    before = stamps()
    passes.append(get("sync, nothing changed", dest, "--sync"))
    untouched = stamps() == before
    rng = random.Random(7)
    changed = set(rng.sample(names, max(1, int(len(names) * changed_share))))
    now = time.time()
    for name in changed:
        (root / name).write_bytes(rng.randbytes(rng.randint(1, 3000)))
        os.utime(root / name, (now, now))
    before = stamps()
    passes.append(get(f"sync, {len(changed):,} changed", dest, "--sync"))
    after = stamps()
    rewritten = {name for name in names if after[name] != before[name]}
    passes.append(get("fresh get", work / f"{server}-fresh"))
    equal = all((dest / name).read_bytes() == (root / name).read_bytes() for name in names)
    return passes, untouched and equal and rewritten == changed, len(changed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--changed", type=float, default=0.01,
                        help="share of the files rewritten on the server between passes")
    args = parser.parse_args(argv)
    if shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin") is None:
        raise SystemExit("needs nginx (apt-get install nginx-light)")
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-sync-servers-"))
    ok = True
    tables = []
    setups = [("stock nginx", ""),
              ("nginx ignoring conditional requests",
               "        etag off;\n        if_modified_since off;\n"),
              ("python -m http.server", None)]
    try:
        for number, (server, settings) in enumerate(setups):
            root = work / f"site{number}"
            log(f"{server}: writing {args.files:,} files")
            names = build_tree(root, args.files)
            port = free_port()
            if settings is not None:
                home = work / f"nginx{number}"
                running = start_nginx([], str(static_site_config(home, root, port, settings)))
                log_path, pattern, stop = home / "run" / "access.log", ACCESS_LINE, running.stop
            else:
                log_path = work / "http-server.log"
                with log_path.open("wb") as out:
                    process = subprocess.Popen(
                        [sys.executable, "-u", "-m", "http.server", str(port), "--bind",
                         "127.0.0.1", "--directory", str(root)],
                        stdout=subprocess.DEVNULL, stderr=out, start_new_session=True)
                for _ in range(100):
                    try:
                        socket.create_connection(("127.0.0.1", port), 0.2).close()
                        break
                    except OSError:
                        time.sleep(0.05)
                pattern, stop = HTTP_SERVER_LOG, process.terminate
            try:
                passes, right, changed = measure(
                    f"s{number}", root, names, f"http://127.0.0.1:{port}", log_path, pattern,
                    work, args.changed)
            finally:
                stop()
            unchanged = passes[1]
            moved_nothing = unchanged.ok == 0 if settings is None or "off" not in settings \
                else unchanged.unchanged_by.get("same_body") == args.files
            ok &= right and moved_nothing
            lines = [f"{server}, {args.files:,} files of 0-3,000 bytes from a URL list, -w 1",
                     "", "| pass | requests | 200 | 304 | body bytes | unchanged by "
                     "(listing, 304, same body) | s | CPU s |",
                     "|---|---:|---:|---:|---:|---|---:|---:|"]
            for row in passes:
                by = row.unchanged_by
                how = (f"{by.get('listing', 0):,}, {by.get('not_modified', 0):,}, "
                       f"{by.get('same_body', 0):,}" if by else "-")
                lines.append(f"| {row.label} | {row.requests:,} | {row.ok:,} | "
                             f"{row.not_modified:,} | {row.body_bytes:,} | {how} | "
                             f"{row.seconds:.2f} | {row.cpu:.2f} |")
            lines.append("")
            what = "rewrote no file" if settings and "off" in settings else "moved no body"
            lines.append(f"- [{'x' if moved_nothing else ' '}] the unchanged pass {what}")
            lines.append(f"- [{'x' if right else ' '}] no file rewritten by the unchanged "
                         f"pass, exactly the {changed:,} changed ones by the next, and DEST "
                         "equals the tree")
            tables.append("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n\n".join(tables))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
