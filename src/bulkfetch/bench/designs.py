"""The case study's designs, written fresh from its description, each run as its own process:

    python -m bulkfetch.bench.designs NAME URL FILES DEST [--workers W]

NAME is one of:

    sync          one requests.Session, list a page, download its files one by one
    threads-N     the main thread lists pages into a bounded queue.Queue; N threads (each
                  with its own requests.Session) take names from it and download them
    processes     a ProcessPoolExecutor of W processes, one task per file (a bounded number
                  of tasks in flight; each process reuses one requests.Session)
    asyncio       one asyncio loop, aiohttp, a semaphore of 64 transfers, pages listed in turn
    combo         W processes each running an asyncio loop (aiohttp, semaphore of 64); only
                  pagination tokens cross processes: a worker takes a token from a shared
                  queue, fetches that page, puts the page's NextMarker back on the queue at
                  once and downloads the page's files while others follow the chain

Every design lists through the seed API (GET /list, then /list?next-marker=T), downloads the
first FILES names listed, writes one file per download as DEST/<name> (as the case study's
users did) and prints one JSON line: {"files": downloaded, "bad": failed}. Each is written
the way a careful user would (keep-alive sessions, uvloop when installed, bounded queues), so
the comparison is with the designs at their best, not with strawmen. W defaults to the
machine's cores. Exit status 3: a library is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import queue
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

CONCURRENCY = 64  # transfers in flight in the asyncio designs (per process for combo)
PAGES_IN_FLIGHT = 2  # pages a combo worker downloads at once
NAMES = ("sync", "threads-10", "threads-100", "processes", "asyncio", "combo")
REQUIRES = {"sync": "requests", "threads": "requests", "processes": "requests",
            "asyncio": "aiohttp", "combo": "aiohttp"}

Counts = dict[str, int]


def requirement(name: str) -> str:
    """The Python package design `name` needs."""
    return REQUIRES[name.split("-", 1)[0]]


# -- shared pieces ----------------------------------------------------------------------------
def list_url(base: str, token: str | None) -> str:
    if token is None:
        return f"{base}/list"
    return f"{base}/list?next-marker={urllib.parse.quote(token, safe='')}"


def file_url(base: str, name: str) -> str:
    return f"{base}/get/{urllib.parse.quote(name)}"


def local_path(dest: str, name: str) -> str | None:
    """DEST/<name>, or None for a name that would leave DEST (names are untrusted)."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or "\0" in name:
        return None
    return os.path.join(dest, *parts)


def write_file(dest: str, name: str, body: bytes) -> bool:
    path = local_path(dest, name)
    if path is None:
        return False
    if "/" in name:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(body)
    return True


def take(names: list[str], remaining: int) -> list[str]:
    return names[:max(0, remaining)]


def pages_sync(get_json: Callable[[str], dict[str, Any]], base: str,
               files: int) -> Iterator[list[str]]:
    """The names of each page, in order, until `files` names have been listed."""
    token: str | None = None
    remaining = files
    while remaining > 0:
        page = get_json(list_url(base, token))
        names = take(page["FileNames"], remaining)
        remaining -= len(names)
        yield names
        token = page.get("NextMarker")
        if not token:
            return


def _requests_session() -> Any:
    import requests
    from requests.adapters import HTTPAdapter

    session = requests.Session()  # one per thread or process: one keep-alive connection
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1))
    return session


def _fetch_requests(session: Any, base: str, name: str, dest: str) -> bool:
    import requests

    try:
        response = session.get(file_url(base, name), timeout=60)
    except requests.RequestException:
        return False
    return response.status_code == 200 and write_file(dest, name, response.content)


def _session_json(session: Any) -> Callable[[str], dict[str, Any]]:
    def get_json(url: str) -> dict[str, Any]:
        response = session.get(url, timeout=60)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    return get_json


# -- sync -------------------------------------------------------------------------------------
def run_sync(base: str, files: int, dest: str) -> Counts:
    session = _requests_session()
    counts = {"files": 0, "bad": 0}
    for names in pages_sync(_session_json(session), base, files):
        for name in names:
            counts["files" if _fetch_requests(session, base, name, dest) else "bad"] += 1
    return counts


# -- threads + queue.Queue --------------------------------------------------------------------
def run_threads(base: str, files: int, dest: str, threads: int) -> Counts:
    work: queue.Queue[str | None] = queue.Queue(maxsize=10 * threads)  # bounded
    totals = {"files": 0, "bad": 0}
    lock = threading.Lock()

    def worker() -> None:
        session = _requests_session()
        done = bad = 0
        while (name := work.get()) is not None:
            if _fetch_requests(session, base, name, dest):
                done += 1
            else:
                bad += 1
        with lock:
            totals["files"] += done
            totals["bad"] += bad

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    try:
        for names in pages_sync(_session_json(_requests_session()), base, files):
            for name in names:
                work.put(name)
    finally:
        for _ in pool:
            work.put(None)
        for thread in pool:
            thread.join()
    return totals


# -- ProcessPoolExecutor, one task per file ---------------------------------------------------
_process_session: Any = None


def _process_fetch(base: str, name: str, dest: str) -> bool:
    global _process_session
    if _process_session is None:
        _process_session = _requests_session()
    return _fetch_requests(_process_session, base, name, dest)


def run_processes(base: str, files: int, dest: str, workers: int) -> Counts:
    counts = {"files": 0, "bad": 0}
    in_flight: set[concurrent.futures.Future[bool]] = set()

    def collect(done: set[concurrent.futures.Future[bool]]) -> None:
        for future in done:
            ok = not future.exception() and future.result()
            counts["files" if ok else "bad"] += 1

    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        for names in pages_sync(_session_json(_requests_session()), base, files):
            for name in names:
                in_flight.add(pool.submit(_process_fetch, base, name, dest))
                if len(in_flight) >= 8 * workers:  # bounded, like the case study's queue
                    done, in_flight = concurrent.futures.wait(
                        in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                    collect(done)
        done, _ = concurrent.futures.wait(in_flight)
        collect(done)
    return counts


# -- asyncio + aiohttp ------------------------------------------------------------------------
async def _fetch_aiohttp(session: Any, semaphore: asyncio.Semaphore, base: str, name: str,
                         dest: str | None, counts: Counts) -> None:
    """One file; dest None keeps the body in memory (the transport alone)."""
    import aiohttp

    async with semaphore:
        try:
            async with session.get(file_url(base, name)) as response:
                body = await response.read()
                ok = response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            ok = False
    ok = ok and (dest is None or write_file(dest, name, body))
    counts["files" if ok else "bad"] += 1


async def _get_json(session: Any, url: str) -> dict[str, Any]:
    async with session.get(url) as response:
        response.raise_for_status()
        return await response.json(content_type=None)  # type: ignore[no-any-return]


def _aiohttp_session() -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=60))


async def run_asyncio(base: str, files: int, dest: str | None) -> Counts:
    semaphore = asyncio.Semaphore(CONCURRENCY)
    counts = {"files": 0, "bad": 0}
    pending: set[asyncio.Task[None]] = set()
    async with _aiohttp_session() as session:
        token: str | None = None
        remaining = files
        while remaining > 0:
            page = await _get_json(session, list_url(base, token))
            names = take(page["FileNames"], remaining)
            remaining -= len(names)
            for name in names:
                pending.add(asyncio.create_task(
                    _fetch_aiohttp(session, semaphore, base, name, dest, counts)))
            while len(pending) > 10 * CONCURRENCY:  # bounded
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            token = page.get("NextMarker")
            if not token:
                break
        if pending:
            await asyncio.wait(pending)
    return counts


# -- combo: processes x asyncio, only tokens cross processes ----------------------------------
# A queue item is (token or None for the first page, names still wanted), or STOP.
STOP = "stop"


async def _combo_worker(base: str, dest: str, tokens: Any, workers: int) -> Counts:
    semaphore = asyncio.Semaphore(CONCURRENCY)
    pages = asyncio.Semaphore(PAGES_IN_FLIGHT)
    counts = {"files": 0, "bad": 0}
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[None]] = set()

    async def page_task(session: Any, token: str | None, remaining: int) -> None:
        try:
            try:
                page = await _get_json(session, list_url(base, token))
            except Exception:
                counts["bad"] += 1  # the chain is broken: everyone stops
                for _ in range(workers):
                    tokens.put(STOP)
                return
            names = take(page["FileNames"], remaining)
            following = page.get("NextMarker")
            left = remaining - len(names)
            if following and left > 0:
                tokens.put((following, left))  # hand the chain on before downloading
            else:
                for _ in range(workers):
                    tokens.put(STOP)
            await asyncio.gather(*(_fetch_aiohttp(session, semaphore, base, name, dest, counts)
                                   for name in names))
        finally:
            pages.release()

    async with _aiohttp_session() as session:
        while True:
            await pages.acquire()
            item = await loop.run_in_executor(None, tokens.get)
            if item == STOP:
                pages.release()
                break
            token, remaining = item
            task = asyncio.create_task(page_task(session, token, remaining))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)
    return counts


def _combo_main(base: str, dest: str, tokens: Any, results: Any, workers: int) -> None:
    _install_uvloop()
    results.put(asyncio.run(_combo_worker(base, dest, tokens, workers)))


def run_combo(base: str, files: int, dest: str, workers: int) -> Counts:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    tokens = context.Queue(maxsize=4 * workers)  # bounded; holds tokens only
    results = context.Queue()
    processes = [context.Process(target=_combo_main, args=(base, dest, tokens, results, workers))
                 for _ in range(workers)]
    for process in processes:
        process.start()
    if files > 0:
        tokens.put((None, files))
    else:
        for _ in range(workers):
            tokens.put(STOP)
    totals = {"files": 0, "bad": 0}
    for _ in processes:
        counts = results.get()
        totals["files"] += counts["files"]
        totals["bad"] += counts["bad"]
    for process in processes:
        process.join()
    return totals


# -- entry point ------------------------------------------------------------------------------
def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(name: str, base: str, files: int, dest: str, workers: int) -> Counts:
    os.makedirs(dest, exist_ok=True)
    if name == "sync":
        return run_sync(base, files, dest)
    if name.startswith("threads-"):
        return run_threads(base, files, dest, int(name.split("-", 1)[1]))
    if name == "processes":
        return run_processes(base, files, dest, workers)
    if name == "asyncio":
        _install_uvloop()
        return asyncio.run(run_asyncio(base, files, dest))
    if name == "combo":
        return run_combo(base, files, dest, workers)
    raise ValueError(f"unknown design {name!r}; one of {', '.join(NAMES)}")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bulkfetch.bench.designs",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("name", help=", ".join(NAMES) + " (threads-N for any N)")
    parser.add_argument("url")
    parser.add_argument("files", type=int)
    parser.add_argument("dest")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        counts = run(args.name, args.url.rstrip("/"), args.files, args.dest, args.workers)
    except ImportError as exc:
        print(f"{args.name}: needs {exc.name} (pip install -e .[bench])", file=sys.stderr)
        return 3
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(counts))
    return 0 if counts["bad"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
