"""A Client with its memory cache against the usual cached design, one Zipf workload (issue 24):

    python benchmarks/cache.py [--reads 1000000] [--keys 100000] [--zipf 1.1] [--threads 32]

nginx serves the standard static export of --keys files (docs/guide/benchmarks.md),
pinned to core 0;
each row runs pinned to core 1 in its own process and reads the same sequence of --reads
URLs, drawn with a fixed seed from a Zipf(--zipf) law over the keys (a few keys read very
often, most rarely), every body into memory:

- Client: `bulkfetch.Client(cache_bytes=256 MiB, cache_ttl=600).get_many(sequence)`;
- the usual design: `ThreadPoolExecutor(--threads)` mapping a read that looks in a shared
  `cachetools.TTLCache` (under a lock) and on a miss does `session.get(url).content`, one
  requests.Session a thread.

Each row prints its reads/s, CPU per read, its hit ratio (reads answered without a request
of their own: from the cache, or, in the Client, by a request for the same URL already on
its way) and the requests it made. Bar:
the Client reaches at least 5x the thread pool's reads/s. Both rows check every body's size
against the export.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import cached_export, fit_open_file_cache, log, pinning, run_measured, start_nginx

BAR = 5.0


def sequence(keys: int, reads: int, exponent: float, seed: int = 1) -> list[int]:
    cumulative = list(itertools.accumulate(1.0 / (rank ** exponent)
                                           for rank in range(1, keys + 1)))
    rng = random.Random(seed)
    total = cumulative[-1]
    order = list(range(keys))
    rng.shuffle(order)  # which key is popular does not follow its name
    return [order[min(bisect.bisect_left(cumulative, rng.random() * total), keys - 1)]
            for _ in range(reads)]


def urls(base: str, args: argparse.Namespace) -> list[str]:
    return [f"{base}/get/f{key:010d}" for key in sequence(args.keys, args.reads, args.zipf)]


def row_client(base: str, args: argparse.Namespace) -> dict[str, float]:
    from bulkfetch import Client

    reads = urls(base, args)
    size = count = 0
    with Client(cache_bytes=256 << 20, cache_ttl=600) as client:
        for _, body in client.get_many(reads):
            size += len(body)  # type: ignore[arg-type]
            count += 1
        requests = client.requested
    return {"reads": count, "bytes": size, "hits": count - requests, "requests": requests}


def row_threads(base: str, args: argparse.Namespace) -> dict[str, float]:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import cachetools
    import requests

    reads = urls(base, args)
    cache: cachetools.TTLCache[str, bytes] = cachetools.TTLCache(maxsize=args.keys, ttl=600)
    lock = threading.Lock()
    local = threading.local()
    counts = {"hits": 0, "requests": 0}

    def read(url: str) -> int:
        with lock:
            body = cache.get(url)
            if body is not None:
                counts["hits"] += 1
                return len(body)
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        answer = session.get(url, timeout=30)
        answer.raise_for_status()
        body = answer.content
        with lock:
            cache[url] = body
            counts["requests"] += 1
        return len(body)

    with ThreadPoolExecutor(args.threads) as pool:
        sizes = list(pool.map(read, reads, chunksize=64))
    return {"reads": len(sizes), "bytes": sum(sizes), **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--row", nargs=2, metavar=("KIND", "BASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        kind, base = args.row
        print(json.dumps(row_client(base, args) if kind == "client" else row_threads(base, args)))
        return 0
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-cache-"))
    config, note = cached_export(args.keys, work / "export")
    if config is None:
        raise SystemExit(note)
    conf, _ = fit_open_file_cache(config, work, 64)
    nginx = start_nginx(place.server, conf)
    me = [*place.client, sys.executable, str(Path(__file__).resolve()), "--reads",
          str(args.reads), "--keys", str(args.keys), "--zipf", str(args.zipf), "--threads",
          str(args.threads)]
    rows = {"Client(cache_bytes=256 MiB, cache_ttl=600)": [*me, "--row", "client", nginx.url],
            f"ThreadPoolExecutor({args.threads}) + requests + cachetools.TTLCache":
                [*me, "--row", "threads", nginx.url]}
    expected = 100  # every file of the export is 100 bytes
    found: dict[str, list[tuple[float, float, dict[str, float]]]] = {label: [] for label in rows}
    try:
        for number in range(args.rounds):
            for label in rows if number % 2 == 0 else list(rows)[::-1]:
                run = run_measured(rows[label], timeout=3600)
                counts = json.loads(run.stdout.strip().splitlines()[-1]) \
                    if run.returncode == 0 else {"reads": 0, "bytes": 0, "hits": 0,
                                                 "requests": 0}
                if run.returncode:
                    log(run.stderr[-800:])
                found[label].append((run.seconds, run.cpu_seconds, counts))
                log(f"  {label}: {args.reads / run.seconds:,.0f} reads/s")
    finally:
        nginx.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"{args.reads:,} reads of {args.keys:,} keys (100-byte files from nginx, static "
          f"export), Zipf({args.zipf:g}), the same sequence for both rows; {place.note}; "
          f"median of {args.rounds} round(s)\n")
    print("| row | reads/s | CPU µs/read | hit ratio | requests | verified |\n"
          "|---|---:|---:|---:|---:|---|")
    rate: dict[str, float] = {}
    for label, runs in found.items():
        seconds = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs) / args.reads * 1e6
        counts = runs[-1][2]
        ok = all(r[2]["reads"] == args.reads and r[2]["bytes"] == args.reads * expected
                 for r in runs)
        rate[label] = args.reads / seconds
        print(f"| {label} | {rate[label]:,.0f} | {cpu:.1f} | "
              f"{counts['hits'] / max(counts['reads'], 1):.1%} | {counts['requests']:,.0f} | "
              f"{'yes' if ok else 'NO'}: {counts['reads']:,} reads, {counts['bytes']:,} bytes |")
    client, pool = list(rows)
    ratio = rate[client] / rate[pool]
    print(f"\n- [{'x' if ratio >= BAR else ' '}] Client reads/s × the thread pool's: {ratio:.1f} "
          f"(>= {BAR:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
