"""Reference loops the benchmarks measure bulkfetch against, each run as its own process:

    python benchmarks/baselines.py pycurl URL FILES      bare libcurl multi loop, 64 handles,
                                                         bodies kept in memory, status checked
    python benchmarks/baselines.py create DIR FILES      create and write 100-byte files
    python benchmarks/baselines.py create-renamed DIR FILES
                                                         the same under a temporary name in
                                                         DIR/.tmp, each renamed into place
    python benchmarks/baselines.py asyncio URL FILES [DEST]
                                                         the case study's asyncio design:
                                                         aiohttp, a semaphore of 64, listing
                                                         page by page; DEST: one file each

Each prints one JSON line: {"files": done, "bad": failed}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pycurl

from bulkfetch.bench.designs import run_asyncio

CONCURRENCY = 64


def name(index: int, files: int) -> str:
    return f"f{index:0{max(10, len(str(max(files - 1, 0))))}d}"


def bare_pycurl(base: str, files: int) -> dict[str, int]:
    multi = pycurl.CurlMulti()
    free = []
    # Bodies by handle in a dict: an attribute on a pycurl object is a slow lookup.
    chunks: dict[pycurl.Curl, list[bytes]] = {}
    for _ in range(CONCURRENCY):
        handle = pycurl.Curl()
        chunks[handle] = []
        handle.setopt(pycurl.WRITEFUNCTION, chunks[handle].append)
        handle.setopt(pycurl.NOSIGNAL, 1)
        free.append(handle)
    urls = (f"{base}/get/{name(i, files)}" for i in range(files))
    active = done = bad = 0
    exhausted = False
    while True:
        while free and not exhausted:
            url = next(urls, None)
            if url is None:
                exhausted = True
                break
            handle = free.pop()
            chunks[handle].clear()
            handle.setopt(pycurl.URL, url)
            multi.add_handle(handle)
            active += 1
        if not active:
            break
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        while True:
            queued, succeeded, failed = multi.info_read()
            for handle in succeeded:
                body = b"".join(chunks[handle])
                if handle.getinfo(pycurl.RESPONSE_CODE) == 200 and body:
                    done += 1
                else:
                    bad += 1
                multi.remove_handle(handle)
                free.append(handle)
                active -= 1
            for handle, _code, _message in failed:
                bad += 1
                multi.remove_handle(handle)
                free.append(handle)
                active -= 1
            if not queued:
                break
        multi.select(1.0)
    return {"files": done, "bad": bad}


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def bare_create(directory: str, files: int) -> dict[str, int]:
    """Create and write 100-byte files, named relative to a directory fd (the cheapest way:
    no path walk per file), as the directory sink does."""
    os.makedirs(directory, exist_ok=True)
    dest = os.open(directory, _DIRECTORY)
    body = os.urandom(100)
    for i in range(files):
        fd = os.open(name(i, files), _CREATE, 0o644, dir_fd=dest)
        os.write(fd, body)
        os.close(fd)
    os.close(dest)
    return {"files": files, "bad": 0}


def bare_create_renamed(directory: str, files: int) -> dict[str, int]:
    """bare_create() plus the least a downloader must add so that a file appears under its
    name only when whole: a temporary name in DIR/.tmp, then rename(2) into DIR, both
    relative to directory fds as the directory sink has them; so the difference between
    the two loops is the rename."""
    os.makedirs(os.path.join(directory, ".tmp"), exist_ok=True)
    dest = os.open(directory, _DIRECTORY)
    temporary = os.open(".tmp", _DIRECTORY, dir_fd=dest)
    body = os.urandom(100)
    for i in range(files):
        final = name(i, files)
        fd = os.open(final, _CREATE, 0o644, dir_fd=temporary)
        os.write(fd, body)
        os.close(fd)
        os.rename(final, final, src_dir_fd=temporary, dst_dir_fd=dest)
    os.close(temporary)
    os.rmdir(".tmp", dir_fd=dest)
    os.close(dest)
    return {"files": files, "bad": 0}


def main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "pycurl":
        result = bare_pycurl(argv[1], int(argv[2]))
    elif kind == "create":
        result = bare_create(argv[1], int(argv[2]))
    elif kind == "create-renamed":
        result = bare_create_renamed(argv[1], int(argv[2]))
    elif kind == "asyncio":
        dest = argv[3] if len(argv) > 3 else None
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        if dest:
            os.makedirs(dest, exist_ok=True)
        # the same design `bulkfetch bench` runs (bulkfetch.bench.designs)
        result = asyncio.run(run_asyncio(argv[1], int(argv[2]), dest))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
