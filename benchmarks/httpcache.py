"""A Client's disk cache (`cache_dir=`, issue 24) in rounds, the server's access log as witness:

    python benchmarks/httpcache.py [--files 20000] [--ttl 30]

The reference server (`bulkfetch serve --access-log`, 100-byte files, an MD5 ETag and a
Last-Modified, no Cache-Control: the ttl override decides freshness) is read through
`Client(cache_dir=DIR, cache_dir_ttl=--ttl)`, each round a new process (so every round
after the first is a restart):

0. no cache_dir, for scale (and the bodies the other rows are checked against);
1. cold: an empty directory, every URL a 200, stored;
2. fresh: within the ttl, every URL from the directory, no request;
3. revalidation: after the ttl, every URL a conditional request, every answer a 304 with no
   body (the log's status and length), the entries renewed;
4. restart: within the renewed ttl, from the directory again;
5. two processes: two at once on a new directory, each reading every URL twice.

Each row checks every body against the MD5 row 0 got (which the fetcher checked against
the server's ETag). Bars: round 3's requests are all 304s with 0 body bytes,
rounds 2 and 4 make no request, and no row sees a wrong body.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

try:
    import bulkfetch  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.testing import ReferenceServer


def read_all(directory: str, urls: list[str], ttl: float, passes: int = 1) -> dict[str, object]:
    from bulkfetch import Client

    digests: dict[str, str] = {}
    started = time.perf_counter()
    cpu = time.process_time()
    with Client(cache_dir=directory or None, cache_dir_ttl=ttl) as client:
        for _ in range(passes):
            for url, body in client.get_many(urls):
                digests[url] = hashlib.md5(body).hexdigest()  # type: ignore[arg-type]
        stats = client.cache_stats()
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu,
            "stats": stats, "digests": digests}


def row(directory: str, urls: list[str], ttl: float, passes: int,
        out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put(read_all(directory, urls, ttl, passes))


def run_rows(directory: str, urls: list[str], ttl: float, processes: int = 1,
             passes: int = 1) -> list[dict[str, object]]:
    """Each reader in a new process (spawned: a restart, as another program would)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    readers = [context.Process(target=row, args=(directory, urls, ttl, passes, out))
               for _ in range(processes)]
    for reader in readers:
        reader.start()
    found = [out.get(timeout=600) for _ in readers]
    for reader in readers:
        reader.join()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    # longer than the cold round plus the fresh one: the first entries stored must still be
    # fresh when round 2 reads them (a cold round here takes 2-6 s for 20,000 files)
    parser.add_argument("--ttl", type=float, default=30.0)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-httpcache-"))
    table: list[tuple[str, int, int, int, int, str, str, str]] = []
    failures: list[str] = []
    with ReferenceServer("--files", str(args.files), access_log=True) as server:
        urls = [f"{server.url}/get/f{index:010d}" for index in range(args.files)]
        seen = 0
        truth: dict[str, str] = {}

        def measure(label: str, directory: Path | None, processes: int = 1, passes: int = 1,
                    ) -> tuple[list[dict[str, object]], Counter[tuple[int, int]]]:
            nonlocal seen
            results = run_rows(str(directory) if directory else "", urls, args.ttl,
                               processes, passes)
            time.sleep(0.3)  # the log is written as each answer ends
            logged = server.requests()[seen:]
            seen += len(logged)
            statuses = Counter((entry.status, entry.length) for entry in logged)
            wrong = sum(result["digests"][url] != truth[url]  # type: ignore[index]
                        for result in results for url in urls) if truth else 0
            if wrong:
                failures.append(f"{label}: {wrong} wrong bodies")
            reads = len(urls) * processes * passes
            seconds = max(float(result["seconds"]) for result in results)  # type: ignore[arg-type]
            hits = sum(result["stats"].get("disk_hits", 0)  # type: ignore[attr-defined]
                       for result in results)
            table.append((label, reads, len(logged), statuses[(304, 0)],
                          sum(entry.length for entry in logged if entry.status == 200),
                          f"{hits / reads:.1%}", f"{reads / seconds:,.0f}",
                          "yes" if not wrong else f"NO ({wrong})"))
            return results, statuses

        plain, _ = measure("0. no cache_dir (for scale)", None)
        truth.update(plain[0]["digests"])  # type: ignore[arg-type]
        cache = work / "cache"
        _, statuses = measure("1. cold (empty cache_dir)", cache)
        if statuses != {(200, 100): args.files}:
            failures.append(f"cold: {statuses}")
        _, statuses = measure("2. fresh (within ttl, new process)", cache)
        if statuses:
            failures.append(f"fresh round made requests: {statuses}")
        time.sleep(args.ttl + 0.2)
        _, statuses = measure("3. revalidation (after ttl)", cache)
        if statuses != {(304, 0): args.files}:
            failures.append(f"revalidation: {statuses}")
        _, statuses = measure("4. restart (within renewed ttl)", cache)
        if statuses:
            failures.append(f"restart round made requests: {statuses}")
        shared = work / "shared"
        _, statuses = measure("5. two processes, new cache_dir, 2 passes each", shared,
                              processes=2, passes=2)
        db = sqlite3.connect(shared / "index.sqlite")
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        count, size = db.execute("SELECT count, bytes FROM totals").fetchone()
        rows = db.execute("SELECT count(*), coalesce(sum(size), 0) FROM entries").fetchone()
        if integrity != "ok" or (count, size) != rows or count != args.files:
            failures.append(f"shared index: {integrity}, totals {(count, size)}, rows {rows}")
    os.system(f"rm -rf {work}")
    print(f"{args.files:,} URLs of 100-byte files from `bulkfetch serve` (MD5 ETag, "
          f"Last-Modified, no Cache-Control), Client(cache_dir=..., cache_dir_ttl="
          f"{args.ttl:g}); each row a new process; counts from the server's access log\n")
    print("| round | reads | requests | 304s | body bytes sent | disk hit ratio | reads/s "
          "| bodies right |\n|---|---:|---:|---:|---:|---:|---:|---|")
    for label, reads, requests, not_modified, sent, ratio, rate, right in table:
        print(f"| {label} | {reads:,} | {requests:,} | {not_modified:,} | {sent:,} | {ratio} "
              f"| {rate} | {right} |")
    print(f"\nshared directory after row 5: integrity {integrity}, {count:,} entries, "
          f"{size:,} bytes (the triggers' totals agree with the rows: {(count, size) == rows})")
    print("\nbars:", "met" if not failures else "MISSED: " + "; ".join(failures))
    print(json.dumps({"failures": failures}), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
