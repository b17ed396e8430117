"""Requests/s of the reference server (`bulkfetch serve`) per process, measured with wrk.

    python benchmarks/server.py [--seconds 5] [--files 1000000]

Following docs/guide/benchmarks.md on a 2-core machine: the server runs pinned to core 0 and wrk
(-t1 -c64) to core 1 (no pinning when taskset or a second core is missing). Rows:

  (a) one URL repeated              /get/<one name>
  (b) distinct files                /get/<name i>, i = 0, 1, 2, ... (a wrk Lua script)
  (c) list pages                    /list?next-marker=<token> over the first --pages pages
  (d) --processes 2, unpinned       as (b), total requests/s of both processes
  (e) nginx on a static export      as (a), (b), (c); optional, skipped with a note when
                                    `bulkfetch serve --export-static` is missing or fails

Server CPU per request is user+sys of the server's whole process tree, read from /proc before
and after each row. Files/s is only comparable within one run; CPU per request is the steadier
figure. Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness import (
    Pinning,
    Server,
    export_for_nginx,
    fit_open_file_cache,
    log,
    pinning,
    start_nginx,
    start_reference,
    tree_cpu_seconds,
)


# -- what is requested --------------------------------------------------------------------
def name(index: int, files: int) -> str:
    return f"f{index:0{max(10, len(str(max(files - 1, 0))))}d}"


def list_paths(base: str, pages: int) -> list[str]:
    """/list and the following pages' paths, walking the listing with urllib."""
    paths, target = ["/list"], "/list"
    while len(paths) < pages:
        with urllib.request.urlopen(base + target, timeout=30) as response:
            page = json.load(response)
        token = page.get("NextMarker")
        if token is None:
            break
        target = "/list?next-marker=" + urllib.parse.quote(token, safe="")
        paths.append(target)
    return paths


def check(base: str, paths: list[str]) -> None:
    """Fail early, not with a table of fast 404s."""
    for path in {paths[0], paths[len(paths) // 2], paths[-1]}:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{base}{path}: status {response.status}")


def lua_walk_names(files: int, distinct: int) -> str:
    width = max(10, len(str(max(files - 1, 0))))
    return f"""\
-- distinct files: /get/<name i> for i = 0 .. {distinct - 1}, then again from 0
local requests = {{}}
local count = {distinct}
local i = 0
init = function(args)
  for k = 0, count - 1 do
    requests[k + 1] = wrk.format("GET", string.format("/get/f%0{width}d", k))
  end
end
request = function()
  i = i + 1
  if i > count then i = 1 end
  return requests[i]
end
"""


def lua_paths(paths: list[str]) -> str:
    quoted = ",\n  ".join(json.dumps(path) for path in paths)  # JSON strings are Lua strings
    return f"""\
-- {len(paths)} fixed paths in turn
local paths = {{
  {quoted}
}}
local requests = {{}}
local i = 0
init = function(args)
  for k, path in ipairs(paths) do requests[k] = wrk.format("GET", path) end
end
request = function()
  i = i + 1
  if i > #requests then i = 1 end
  return requests[i]
end
"""


# -- wrk ------------------------------------------------------------------------------------
@dataclass
class WrkResult:
    requests: int
    seconds: float
    rate: float
    transfer_mb_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    client_share: float = 0.0  # wrk's CPU seconds per wall second


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_UNITS_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_wrk(text: str) -> WrkResult:
    def grab(pattern: str) -> re.Match[str]:
        match = re.search(pattern, text, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"wrk output without {pattern!r}:\n{text}")
        return match

    done = grab(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)")
    transfer = grab(r"^Transfer/sec:\s*([\d.]+)(B|KB|MB|GB|TB)")
    p50 = grab(r"^\s*50%\s+([\d.]+)(us|ms|s|m|h)")
    p99 = grab(r"^\s*99%\s+([\d.]+)(us|ms|s|m|h)")
    errors = 0
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if non_2xx:
        errors += int(non_2xx.group(1))
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if socket_errors:
        errors += sum(int(v) for v in socket_errors.groups())
    seconds = float(done.group(2)) * _UNITS_S[done.group(3)]
    requests = int(done.group(1))
    return WrkResult(
        requests=requests,
        seconds=seconds,
        rate=requests / seconds,
        transfer_mb_s=float(transfer.group(1)) * _UNITS_BYTES[transfer.group(2)] / 1e6,
        p50_ms=float(p50.group(1)) * _UNITS_MS[p50.group(2)],
        p99_ms=float(p99.group(1)) * _UNITS_MS[p99.group(2)],
        errors=errors,
    )


@dataclass
class Row:
    label: str
    processes: int
    result: WrkResult | None
    cpu_us: float | None
    cpu_share: float | None = None  # server CPU seconds per wall second
    note: str = ""


def run_wrk(prefix: list[str], url: str, seconds: float, connections: int,
            script: str | None) -> WrkResult:
    command = [*prefix, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
               "--latency", "--timeout", "10s"]
    if script is not None:
        command += ["-s", script]
    command.append(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()}")
    result = parse_wrk(done.stdout)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result.client_share = used / result.seconds
    return result


def measure(label: str, server: Server, processes: int, url: str, script: str | None,
            args: argparse.Namespace, place: Pinning) -> Row:
    log(f"{label}: {url} ...")
    if args.warmup > 0:
        run_wrk(place.client, url, args.warmup, args.connections, script)
    before = tree_cpu_seconds(server.pid)
    result = run_wrk(place.client, url, args.seconds, args.connections, script)
    cpu = tree_cpu_seconds(server.pid) - before
    row = Row(label, processes, result, cpu / result.requests * 1e6 if result.requests else None,
              cpu / result.seconds)
    log(f"  {result.rate:,.0f} requests/s, {row.cpu_us or 0:.1f} µs server CPU per request, "
        f"{result.errors} errors")
    return row


# -- the rows -------------------------------------------------------------------------------
def reference_rows(args: argparse.Namespace, place: Pinning, work: Path,
                   stack: contextlib.ExitStack) -> list[Row]:
    rows: list[Row] = []
    one = name(min(42, args.files - 1), args.files)
    distinct = min(args.distinct, args.files)
    walk_script = work / "distinct.lua"
    walk_script.write_text(lua_walk_names(args.files, distinct))

    server = start_reference(place.server, args.files, 1)
    stack.callback(server.stop)
    log(f"{server.label}: {server.url} ({' '.join(server.command[:3])} ...)")
    check(server.url, [f"/get/{one}", f"/get/{name(0, args.files)}",
                       f"/get/{name(distinct - 1, args.files)}"])
    rows.append(measure("(a) one URL", server, 1, f"{server.url}/get/{one}", None, args, place))
    rows.append(measure(f"(b) distinct files ({distinct:,} names)", server, 1, server.url,
                        str(walk_script), args, place))
    paths = list_paths(server.url, args.pages)
    list_script = work / "pages.lua"
    list_script.write_text(lua_paths(paths))
    rows.append(measure(f"(c) list pages ({len(paths)} pages of 1,000)", server, 1,
                        server.url, str(list_script), args, place))
    server.stop()

    both = start_reference([], args.files, 2)
    stack.callback(both.stop)
    log(f"{both.label}: {both.url} (2 processes, unpinned)")
    check(both.url, [f"/get/{one}"])
    rows.append(measure("(d) distinct files, 2 processes unpinned", both, 2, both.url,
                        str(walk_script), args, place))
    both.stop()
    return rows


def nginx_rows(args: argparse.Namespace, place: Pinning, work: Path,
               stack: contextlib.ExitStack) -> tuple[list[Row], str]:
    if shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"):
        return [], "nginx rows skipped: nginx is not installed"
    files = min(args.files, args.nginx_files)
    export_dir = Path(args.export_dir) if args.export_dir else work / "export"
    config, note = export_for_nginx(files, export_dir)
    if config is None:
        return [], f"nginx rows skipped: {note}"
    config, patch_note = fit_open_file_cache(config, work, args.connections)
    if patch_note:
        note += "; " + patch_note
    server = start_nginx(place.server, config)
    stack.callback(server.stop)
    log(f"nginx: {server.url}")
    one = name(min(42, files - 1), files)
    distinct = min(args.distinct, files)
    walk_script = work / "nginx-distinct.lua"
    walk_script.write_text(lua_walk_names(files, distinct))
    check(server.url, [f"/get/{one}", f"/get/{name(distinct - 1, files)}"])
    paths = list_paths(server.url, args.pages)
    list_script = work / "nginx-pages.lua"
    list_script.write_text(lua_paths(paths))
    rows = [
        measure("(e) nginx, one URL", server, 1, f"{server.url}/get/{one}", None, args, place),
        measure(f"(e) nginx, distinct files ({distinct:,} names)", server, 1, server.url,
                str(walk_script), args, place),
        measure(f"(e) nginx, list pages ({len(paths)} pages)", server, 1, server.url,
                str(list_script), args, place),
    ]
    server.stop()
    return rows, f"nginx: 1 worker, {note}"


def table(rows: list[Row]) -> str:
    lines = [
        "| row | processes | requests/s | requests/s per process | transfer MB/s "
        "| p50 ms | p99 ms | server CPU µs/request | server CPU % | wrk CPU % | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        if r is None:
            lines.append(f"| {row.label} | {row.processes} | — | — | — | — | — | — | — | — | "
                         f"{row.note} |")
            continue
        cpu = f"{row.cpu_us:.1f}" if row.cpu_us is not None else "—"
        share = f"{row.cpu_share:.0%}" if row.cpu_share is not None else "—"
        lines.append(
            f"| {row.label} | {row.processes} | {r.rate:,.0f} | {r.rate / row.processes:,.0f} "
            f"| {r.transfer_mb_s:.2f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {cpu} | {share} "
            f"| {r.client_share:.0%} | {r.errors} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk duration per row")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured wrk run first")
    parser.add_argument("--files", type=int, default=1_000_000, help="files in the data set")
    parser.add_argument("--distinct", type=int, default=200_000,
                        help="distinct names the (b)/(d) rows walk through")
    parser.add_argument("--pages", type=int, default=200, help="list pages for the (c) row")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c")
    parser.add_argument("--nginx-files", type=int, default=200_000,
                        help="files exported for nginx (each is a real file on disk)")
    parser.add_argument("--export-dir", default=None,
                        help="export nginx's data set here (default: a temporary directory)")
    parser.add_argument("--no-nginx", action="store_true", help="leave out the (e) rows")
    args = parser.parse_args(argv)
    if args.files < 1:
        parser.error("--files must be at least 1")
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (Debian package wrk)")

    # SIGTERM/SIGHUP end the run like Ctrl-C, so every server is stopped on the way out.
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)

    place = pinning()
    notes = [place.note]
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bulkfetch-bench-")))
        rows = reference_rows(args, place, work, stack)
        if args.no_nginx:
            notes.append("nginx rows left out (--no-nginx)")
        else:
            try:
                extra, note = nginx_rows(args, place, work, stack)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                extra, note = [], f"nginx rows skipped: {exc}"
            rows += extra
            notes.append(note)

    print(f"## bulkfetch serve, 100-byte files, {args.files:,} files, wrk -t1 "
          f"-c{args.connections}, {args.seconds:g} s per row\n")
    print(table(rows))
    print()
    for note in notes:
        print(f"- {note}")
    print("- server CPU: user+sys of the server's process tree from /proc, per request and as "
          "a share of one core over the row (100% per process = saturated; less means the "
          "client or other load on the machine held it back); wrk CPU %: the same for the "
          "client; transfer in 10^6 bytes/s; errors: non-2xx/3xx answers plus socket errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
