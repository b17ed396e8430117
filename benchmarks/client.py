"""`bulkfetch.Client.get_many` against the usual Python design, in one run (issue 24):

    python benchmarks/client.py [--files 100000] [--rounds 3] [--threads 32]

nginx serves the standard static export (docs/guide/benchmarks.md), pinned to core 0; every row runs
pinned to core 1 as its own process, and reads every body into memory:

- Client.get_many: `with bulkfetch.Client() as c: for url, body in c.get_many(urls)`;
- the usual design: `ThreadPoolExecutor(--threads)` mapping `session.get(url).content`
  over the URLs, one requests.Session a thread;
- `bulkfetch get --sink null -w 1`: the engine's own cost per file, for the CPU bar.

Bars (issue 24): get_many reaches at least 10x the thread pool's files/s, at no more than
1.3x the CPU per file of the null sink with one worker. Every row counts its bodies and
their bytes; get_many's and the pool's are checked against the export's sizes.

Then (--s3-files, default 20,000; 0: none) the same comparison over S3: get_many of
s3://bulkfetch/NAME URLs against `ThreadPoolExecutor(--threads)` over one boto3 client's
get_object, both signing every request (SigV4), against `bulkfetch serve --s3` pinned to
core 0, which checks every signature. Bar: get_many at least 10x the boto3 pool's files/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import (
    Measured,
    alternating_rounds,
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    per_file,
    pinning,
    report_verified,
    start_nginx,
    start_reference,
)

SPEED_BAR = 10.0
CPU_BAR = 1.3


def names(files: int) -> list[str]:
    return [f"f{i:010d}" for i in range(files)]


def bodies_verified(run: Measured, expected: dict[str, int]) -> str:
    """What a row that printed its counts as JSON got, against what it should have."""
    found = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else \
        dict.fromkeys(expected, 0)
    if found != expected:
        log(run.stderr[-800:])
    return f"{'yes' if found == expected else 'NO'}: {found['files']:,} bodies, " \
           f"{found['bytes']:,} bytes"


def row_client(base: str, files: int) -> dict[str, int]:
    from bulkfetch import Client

    count = size = 0
    with Client() as client:
        for _, body in client.get_many(f"{base}/get/{name}" for name in names(files)):
            count += 1
            size += len(body)  # type: ignore[arg-type]
    return {"files": count, "bytes": size}


def row_threads(base: str, files: int, threads: int) -> dict[str, int]:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import requests

    local = threading.local()

    def fetch(url: str) -> int:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        answer = session.get(url, timeout=30)
        answer.raise_for_status()
        return len(answer.content)

    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(fetch, (f"{base}/get/{name}" for name in names(files))))
    return {"files": len(sizes), "bytes": sum(sizes)}


S3_KEY, S3_SECRET = "AKIDBENCHCLIENT", "bench/secret+key"


def s3_env() -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return found | {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "AWS_DEFAULT_REGION": "us-east-1"}


def row_client_s3(endpoint: str, files: int) -> dict[str, int]:
    from bulkfetch import Client

    count = size = 0
    with Client(endpoint_url=endpoint) as client:
        for _, body in client.get_many(f"s3://bulkfetch/{name}" for name in names(files)):
            count += 1
            size += len(body)  # type: ignore[arg-type]
    return {"files": count, "bytes": size}


def row_boto3(endpoint: str, files: int, threads: int) -> dict[str, int]:
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.config import Config

    # one client shared by the threads, as boto3's documentation allows, its pool as large
    # as the thread count
    s3 = boto3.client("s3", endpoint_url=endpoint,
                      config=Config(max_pool_connections=threads, s3={"addressing_style": "path"}))

    def fetch(name: str) -> int:
        return len(s3.get_object(Bucket="bulkfetch", Key=name)["Body"].read())

    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(fetch, names(files)))
    return {"files": len(sizes), "bytes": sum(sizes)}


def s3_rows(place, args, me) -> None:  # type: ignore[no-untyped-def]
    """Client.get_many over s3:// URLs against ThreadPoolExecutor + boto3, both signing
    every request, against `bulkfetch serve --s3` checking every signature."""
    server = start_reference(place.server, args.s3_files, processes=1,
                             extra=["--s3", "--s3-credentials", f"{S3_KEY}:{S3_SECRET}"])
    rows = {
        "Client.get_many, s3:// URLs (signed)": [
            *me, "--files", str(args.s3_files), "--row", "client-s3", server.url],
        f"ThreadPoolExecutor({args.threads}) + boto3 get_object (signed)": [
            *me, "--files", str(args.s3_files), "--threads", str(args.threads), "--row",
            "boto3", server.url],
    }
    try:
        measured, verified = alternating_rounds(
            rows, args.rounds, args.s3_files,
            lambda label, run: bodies_verified(run, {"files": args.s3_files,
                                                     "bytes": 100 * args.s3_files}),
            env=s3_env(), timeout=3600)
    finally:
        server.stop()
    medians = per_file(measured, args.s3_files)
    print(f"\n{args.s3_files:,} objects of 100 bytes from bulkfetch serve --s3 (every SigV4 "
          f"signature checked), {place.note}; median of {args.rounds} rounds\n")
    print("| row | files/s | CPU µs/file | verified |\n|---|---:|---:|---|")
    for label, (rate, cpu) in medians.items():
        print(f"| {label} | {rate:,.0f} | {cpu:.1f} | {verified[label]} |")
    client, pool = list(rows)
    speed = medians[client][0] / medians[pool][0]
    print(f"\n- [{'x' if speed >= SPEED_BAR else ' '}] get_many files/s × the boto3 pool's: "
          f"{speed:.1f} (>= {SPEED_BAR:g})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--s3-files", type=int, default=20_000,
                        help="objects for the s3:// rows against boto3 (0: none)")
    parser.add_argument("--row", nargs=2, metavar=("KIND", "BASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:  # one measured row, in its own process
        kind, base = args.row
        found = row_client(base, args.files) if kind == "client" else \
            row_client_s3(base, args.files) if kind == "client-s3" else \
            row_boto3(base, args.files, args.threads) if kind == "boto3" else \
            row_threads(base, args.files, args.threads)
        print(json.dumps(found))
        return 0
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-client-"))
    export = work / "export"
    config, note = cached_export(args.files, export)
    if config is None:
        raise SystemExit(note)
    conf, _ = fit_open_file_cache(config, work, 64)
    nginx = start_nginx(place.server, conf)
    me = [*place.client, sys.executable, str(Path(__file__).resolve())]
    rows = {
        "Client.get_many": [*me, "--files", str(args.files), "--row", "client", nginx.url],
        f"ThreadPoolExecutor({args.threads}) + requests": [
            *me, "--files", str(args.files), "--threads", str(args.threads), "--row",
            "threads", nginx.url],
        "bulkfetch get --sink null -w 1": [
            *place.client, *bulkfetch_command(), "get", nginx.url, str(work / "null"),
            "--sink", "null", "-w", "1", "-q", "--report", str(work / "null.json")],
    }
    expected_bytes = sum(p.stat().st_size for p in (export / "files").iterdir())

    def verify(label: str, run: Measured) -> str:
        if label.startswith("bulkfetch get"):
            return report_verified(work / "null.json", args.files, run, work / "null")
        return bodies_verified(run, {"files": args.files, "bytes": expected_bytes})

    try:
        subprocess.run(rows["Client.get_many"], capture_output=True, timeout=600)  # warm-up
        measured, verified = alternating_rounds(rows, args.rounds, args.files, verify)
    finally:
        nginx.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)

    medians = per_file(measured, args.files)

    def rate(label: str) -> float:
        return medians[label][0]

    def cpu_us(label: str) -> float:
        return medians[label][1]

    print(f"{args.files:,} files of 100 bytes from nginx (static export); {place.note}; "
          f"every body read into memory; median of {args.rounds} rounds, every other one "
          "in reverse order\n")
    print("| row | files/s | CPU µs/file | verified |\n|---|---:|---:|---|")
    for label in rows:
        print(f"| {label} | {rate(label):,.0f} | {cpu_us(label):.1f} | {verified[label]} |")
    client, pool, null = list(rows)
    speed, cpu = rate(client) / rate(pool), cpu_us(client) / cpu_us(null)
    print(f"\n- [{'x' if speed >= SPEED_BAR else ' '}] get_many files/s × the thread pool's: "
          f"{speed:.1f} (>= {SPEED_BAR:g})")
    print(f"- [{'x' if cpu <= CPU_BAR else ' '}] get_many CPU/file × null sink, 1 worker: "
          f"{cpu:.2f} (<= {CPU_BAR})")
    if args.s3_files:
        s3_rows(place, args, me)
    return 0


if __name__ == "__main__":
    sys.exit(main())
