"""Issue 25's acceptance over the real CLI and `bulkfetch serve --shape`, one table:

    python benchmarks/apis.py [--files 100000] [--workers 2]

For each shape (gcs, link with the github-releases preset, drf, hf-tree): the server with
`--fail-rate 0.02 --reset-rate 0.01 --lie-md5 NAME` and an access log; `bulkfetch get --api
PRESET` killed with SIGKILL once a third of the pages are done, then run again to its end.
Every file is checked against the data set's bytes; the only failure must be NAME, with the
listing's digest as the reason; the rerun must not list again a page that was done before
the kill (the log's list answers after the kill against the pages not done then).

Then, with drf: a server that requires a bearer token and redirects every file GET to a
second server: without the token, exit 2 and the message; with --header-file, complete, no
Authorization at the second server (its log), the token nowhere in stdout, stderr, journal,
report or status.json. And a user's own TOML (--api-file) reproducing the drf preset's run.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import bulkfetch_command, log, pages_done

try:
    import bulkfetch  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

SEED, PAGE = 0, 1000
TOKEN = "tok-3f9a1c-never-shown"
# (label, server shape, the preset that reads it, flags over the preset, listing path):
# every pagination style: a token (gcs), the Link header (link, hf-tree), a next URL (drf),
# an offset and a page number (drf's LimitOffset and PageNumber pagination)
ROWS = [("gcs", "gcs", "gcs", (), "/storage/v1/b/bulkfetch/o"),
        ("link", "link", "github-releases", (), "/files"),
        ("drf", "drf", "drf", (), "/api/files/"),
        ("drf, offset", "drf", "drf", ("--paginate", "offset", "--page-param", "offset",
                                       "--limit-param", "limit", "--page-size", "1000"),
         "/api/files/"),
        ("drf, page", "drf", "drf", ("--paginate", "page", "--page-param", "page",
                                     "--page-size", "1000"), "/api/files/"),
        ("hf-tree", "hf-tree", "hf-tree", (), "/api/models/bulkfetch/synthetic/tree/main")]
USER_DRF = """\
# my own description of a Django REST framework listing
items = "results"
name = "name"
size = "size"
md5 = "md5"
url = "url"
total = "count"
paginate = "url"
next = "next"
get_template = "/{name}"
"""


def wrong_files(dest: Path, files: int, skip: str) -> int:
    data = SyntheticDataSet(files, PAGE, SEED, parse_size_spec("100"))
    wrong = 0
    for index in range(files):
        name = data.name(index)
        if name == skip:
            continue
        path = dest / name
        wrong += not path.is_file() or \
            hashlib.md5(path.read_bytes()).digest() != hashlib.md5(data.body(index)).digest()
    return wrong


def get(url: str, dest: Path, *extra: str, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*bulkfetch_command(), "get", url, str(dest), "-q", *extra],
                          capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **(env or {})})


def list_answers(server: ReferenceServer, path: str, since: int) -> int:
    """List pages answered 200 since request `since`, each page once (a page whose answer
    the server then cut, --reset-rate, is logged 200 and asked for again)."""
    return len({request.target for request in server.requests()[since:]
                if request.target.startswith(path) and request.status == 200})


def shape_row(label: str, shape: str, preset: str, flags: tuple[str, ...], path: str,
              files: int, workers: int, work: Path) -> list[str]:
    liar = SyntheticDataSet(files, PAGE, SEED, parse_size_spec("100")).name(files // 3)
    dest, report = work / label, work / f"{label}.json"
    pages = -(-files // PAGE)
    with ReferenceServer("--shape", shape, "--files", str(files),
                         "--page-size", str(PAGE), "--fail-rate", "0.02", "--reset-rate",
                         "0.01", "--lie-md5", liar, access_log=True) as server:
        url = server.url + path
        run = subprocess.Popen([*bulkfetch_command(), "get", url, str(dest), "-q", "--api",
                                preset, *flags, "-w", str(workers)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while pages_done(dest) < pages // 3 and run.poll() is None:
            time.sleep(0.01)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        done_at_kill = pages_done(dest)
        seen = len(server.requests())
        proc = get(url, dest, "--api", preset, *flags, "-w", str(workers), "--report",
                   str(report))
        relisted = list_answers(server, path, seen)
    result = json.loads(report.read_text()) if report.exists() else {}
    failures = result.get("failures", [])
    lie_caught = [f["name"] for f in failures] == [liar] and \
        "changed since it was listed" in failures[0]["reason"]
    wrong = wrong_files(dest, files, liar)
    log(f"  {label}: exit {proc.returncode}, {result.get('files_ok', 0):,} ok")
    shown = preset + (" " + " ".join(flags[:2]) if flags else "")
    return [label, shown, f"{result.get('files_ok', 0):,}", str(wrong),
            "yes" if lie_caught else f"NO: {failures[:2]}",
            f"{done_at_kill} of {pages}", f"{relisted} (pages not done: {pages - done_at_kill})",
            str(result.get("retries", "?"))]


def credentials_rows(files: int, workers: int, work: Path) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    header_file = work / "headers.txt"
    header_file.write_text(f"Authorization: Bearer {TOKEN}\n")
    # the second origin serves the same paths (/media/NAME), with no token asked
    with ReferenceServer("--shape", "drf", "--files", str(files), "--page-size", str(PAGE),
                         access_log=True) as files_host:
        with ReferenceServer("--shape", "drf", "--files", str(files), "--page-size", str(PAGE),
                             "--redirect-files-to", files_host.url, "--require-bearer", TOKEN,
                             access_log=True) as api:
            url = api.url + "/api/files/"
            without = get(url, work / "none", "--api", "drf")
            said = " ".join(without.stderr.split())
            said = said[said.find("page 0"):]
            rows.append(("without credentials: exit, message", f"{without.returncode}: {said}"))
            dest, report = work / "token", work / "token.json"
            proc = get(url, dest, "--api", "drf", "-w", str(workers), "--header-file",
                       str(header_file), "--report", str(report))
            rows.append(("with --header-file: exit, files ok",
                         f"{proc.returncode}, {json.loads(report.read_text())['files_ok']:,}"))
            wrong = wrong_files(dest, files, "")
            rows.append(("files with wrong bytes", str(wrong)))
            api_auth = sum(1 for r in api.requests() if r.auth)
        second = files_host.requests()
        rows.append(("file GETs at the second host; with Authorization",
                     f"{sum(1 for r in second if r.target.startswith('/media/')):,}; "
                     f"{sum(1 for r in second if r.auth)}"))
        rows.append(("requests to the API host with Authorization", f"{api_auth:,}"))
    leaks = [str(path) for path in [*dest.rglob("*"), report] if path.is_file()
             and TOKEN.encode() in path.read_bytes()]
    leaks += ["stdout/stderr"] if TOKEN in proc.stdout + proc.stderr + without.stderr else []
    rows.append(("token found in output, journal, report, status.json", str(leaks or "none")))
    return rows


def api_file_rows(files: int, workers: int, work: Path) -> list[tuple[str, str]]:
    mine = work / "mine.toml"
    mine.write_text(USER_DRF)
    with ReferenceServer("--shape", "drf", "--files", str(files), "--page-size",
                         str(PAGE)) as server:
        url = server.url + "/api/files/"
        preset = get(url, work / "preset", "--api", "drf", "-w", str(workers), "--report",
                     str(work / "preset.json"))
        own = get(url, work / "own", "--api-file", str(mine), "-w", str(workers),
                  "--report", str(work / "own.json"))
    a, b = (json.loads((work / f"{n}.json").read_text()) for n in ("preset", "own"))
    same = all(a[k] == b[k] for k in ("files_ok", "files_failed", "bytes", "pages"))

    def digests(dest: Path) -> dict[str, str]:
        return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in dest.iterdir()
                if p.is_file()}

    equal = digests(work / "preset") == digests(work / "own")
    return [("--api-file (own TOML) against --api drf: exits, counts, files",
             f"{preset.returncode}/{own.returncode}, {'same' if same else 'DIFFER'}, "
             f"{'byte-identical' if equal else 'DIFFER'}")]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-apis-"))
    try:
        rows = [shape_row(*row, args.files, args.workers, work) for row in ROWS]
        small = max(1000, args.files // 20)
        checks = credentials_rows(small, args.workers, work) + \
            api_file_rows(small, args.workers, work)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"bulkfetch serve --shape S --files {args.files:,} --page-size {PAGE} --fail-rate "
          f"0.02 --reset-rate 0.01 --lie-md5 NAME; bulkfetch get --api PRESET -w "
          f"{args.workers}, SIGKILL after a third of the pages, then rerun\n")
    print("| shape | preset | files ok | wrong bytes | lie caught (only failure) | "
          "pages done at kill | pages listed by the rerun | retries |")
    print("|---|---|---:|---:|---|---:|---|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\ndrf with --require-bearer and --redirect-files-to a second server "
          f"({small:,} files)\n\n| check | found |\n|---|---|")
    for label, found in checks:
        print(f"| {label} | {found} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
