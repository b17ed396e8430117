"""`bulkfetch hash`: checksums of many files and of huge files in worker processes.

MD5 and SHA of one file are sequential, so the parallelism is across files. The main process
walks the paths (or reads a checksum file, or a tar destination's index), cuts the stream into
batches of up to BATCH_FILES paths or about BATCH_BYTES of data, and hands each batch to an
idle worker; a worker answers with the batch's digests. What crosses the process boundary
stays tiny and batched: a list of (path, size) down, a list of hex digests up, so a small
file costs no round trip of its own. Results come back in any order and are given out in
the order the paths were given or walked; only a few batches per worker (pool.py) may be
out ahead of the oldest unanswered one, so memory does not grow with the number of files.

A worker reads each file through one reused CHUNK-byte buffer with `os.readv`, after
`posix_fadvise(SEQUENTIAL)` for files of more than a few chunks. The chunk is 128 KiB, not
1 MiB or more: measured on the 2-core EPYC VM here, a 1 GiB file in the page cache hashed at
610-620 MB/s with 64-128 KiB reads (md5sum: 570-600 MB/s) and at 470-520 MB/s with 256 KiB
to 4 MiB reads, whose copies no longer fit beside the data in the core's 512 KiB L2 (the
kernel's copy time tripled). At 128 KiB the Python loop runs 8,192 times per GiB, well
under 1% of the time. BLAKE3 is the exception to "one file, one core": a big file is mapped
and hashed by the blake3 package on all cores (about twice its single-thread speed here;
update_mmap and readinto at 1-64 MiB were measured and were slower or equal).
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bulkfetch.errors import UsageError
from bulkfetch.hashing.pool import Tick, WorkerPool
from bulkfetch.util.checksum_lines import ALGORITHMS, CheckEntry

if TYPE_CHECKING:  # the tar reader loads only for --dest
    from bulkfetch.dataset import MemberInfo

__all__ = [
    "Digest",
    "HashOptions",
    "HashProgress",
    "WorkerPool",
    "batched",
    "check_entries",
    "hash_paths",
    "require_algorithm",
    "verify_members",
    "walk",
]

CHUNK = 128 << 10
ADVISE_ABOVE = 4 * CHUNK  # posix_fadvise costs a syscall: only where readahead pays
TICK_BYTES = 8 << 20  # a worker publishes its byte count this often within a file
BLAKE3_THREADS_ABOVE = 32 << 20  # BLAKE3 on all cores from here; rayon's split pays
BLAKE3_SLICE = 256 << 20  # a mapped file is hashed and counted this much at a time
BATCH_FILES = 256
STDIN = "-"  # the path that names standard input
STATE_DIR = ".bulkfetch"  # a download's state in its DEST: left out of a directory's walk
BATCH_BYTES = 64 << 20

# A digest is lower-case hex, or the error that kept the file from being read.
Digest = str | OSError
Job = tuple[str, int]  # path and size; a negative size is -errno of a failure found earlier
P = TypeVar("P")
C = TypeVar("C")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class HashOptions:
    algo: str = "md5"
    workers: int = field(default_factory=_cores)
    batch_files: int = BATCH_FILES
    batch_bytes: int = BATCH_BYTES


@dataclass(slots=True)
class HashProgress:
    """Live counters of a run: the main thread writes them, a display thread reads them."""

    started: float = field(default_factory=time.monotonic)
    listed_files: int = 0
    listed_bytes: int = 0
    listing_done: bool = False
    files_done: int = 0
    failed: int = 0
    read_bytes: Callable[[], int] = lambda: 0  # bytes the workers have hashed so far


def require_algorithm(algo: str) -> None:
    """UsageError unless `algo` can be computed here (blake3 needs its package)."""
    if algo not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algo!r}: use one of {', '.join(ALGORITHMS)}")
    if algo == "blake3":
        try:
            import blake3  # noqa: F401
        except ImportError:
            raise UsageError("--algo blake3 needs the blake3 package: "
                             "pip install 'bulkfetch[hash]'") from None


def _failure(code: int, reason: str | None = None) -> OSError:
    """A small picklable error: the errno and its message, no path, no traceback."""
    return OSError(code, reason or os.strerror(code))


# -- what the main process feeds the workers ------------------------------------------------


def walk(paths: Iterable[str]) -> Iterator[Job]:
    """(path, size) of every file to hash, in order: each PATH as given, a directory's
    regular files recursively by name in byte order. In a directory, symlinks to regular
    files are hashed; symlinks to directories are not followed, and other entries (dangling
    links, FIFOs, sockets, devices) are skipped, and so is a directory's .bulkfetch, where a
    download keeps its journal and sums: its state, which the next run changes, not its
    data. What cannot be read comes out with -errno, in its place. "-" is standard input,
    as for md5sum (a file named so is ./-)."""
    for path in paths:
        if path == STDIN:
            yield path, 0  # (its size is known at its end)
            continue
        try:
            info = os.stat(path)
        except OSError as exc:
            yield path, -(exc.errno or errno.EIO)
            continue
        if stat.S_ISDIR(info.st_mode):
            yield from _walk_directory(path)
        else:
            yield path, info.st_size


def _walk_directory(top: str) -> Iterator[Job]:
    """One sorted listing of names per level being walked (the least a sorted order needs)."""
    try:
        names = sorted(os.listdir(top), key=os.fsencode)
    except OSError as exc:
        yield top, -(exc.errno or errno.EIO)
        return
    for name in names:
        if name == STATE_DIR:
            continue
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                info = os.stat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue
        except FileNotFoundError:
            continue  # removed since the listing, or a dangling link
        except OSError as exc:
            yield path, -(exc.errno or errno.EIO)
            continue
        if stat.S_ISDIR(info.st_mode):
            yield from _walk_directory(path)
        elif stat.S_ISREG(info.st_mode):
            yield path, info.st_size


def _stat_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        return -(exc.errno or errno.EIO)


def batched(items: Iterable[C], size_of: Callable[[C], int], *, files: int, nbytes: int,
            group_of: Callable[[C], object] | None = None) -> Iterator[list[C]]:
    """Consecutive runs of `items` of at most `files` items and about `nbytes` bytes; an item
    that would take a batch past `nbytes` starts the next one (so a big file has a batch to
    itself), and with `group_of` a batch never spans two groups."""
    batch: list[C] = []
    total = 0
    group: object = None
    for item in items:
        size = max(size_of(item), 0)
        key = group_of(item) if group_of is not None else None
        if batch and (len(batch) >= files or total + size > nbytes or key != group):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size
        group = key
    if batch:
        yield batch


# -- the workers ----------------------------------------------------------------------------


def _new_hash(algo: str, *, threads: bool = False) -> Callable[[], Any]:
    if algo == "blake3":
        from blake3 import blake3

        return functools.partial(blake3, max_threads=blake3.AUTO if threads else 1)
    import hashlib  # here, not at the top: a BLAKE3 run does without OpenSSL's start-up

    return functools.partial(getattr(hashlib, algo), usedforsecurity=False)


class _FileHasher:
    """In a worker: the digests of a batch of files."""

    def __init__(self, algo: str, tick: Tick) -> None:
        self._algo = algo
        self._new = _new_hash(algo)
        self._tick = tick
        self._buffer = bytearray(CHUNK)
        self._view = memoryview(self._buffer)

    def __call__(self, batch: list[Job]) -> list[Digest]:
        return [self._one(path, size) for path, size in batch]

    def _one(self, path: str, size: int) -> Digest:
        if size < 0:
            return _failure(-size)
        try:
            # (a forked worker shares the main process's standard input, which only "-" reads)
            fd = os.dup(0) if path == STDIN else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            return _failure(exc.errno or errno.EIO, exc.strerror)
        try:
            if self._algo == "blake3" and size >= BLAKE3_THREADS_ABOVE:
                mapped = self._blake3_mapped(fd)
                if mapped is not None:
                    return mapped
            if size >= ADVISE_ABOVE:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            return self._read(fd)
        except OSError as exc:
            return _failure(exc.errno or errno.EIO, exc.strerror)
        finally:
            os.close(fd)

    def _read(self, fd: int) -> str:
        """The digest of everything `fd` reads until EOF; the loop does nothing per chunk
        but read, hash and count."""
        digest = self._new()
        update, buffer, readv, tick = digest.update, self._buffer, os.readv, self._tick
        buffers = (buffer,)
        unreported = 0
        while (n := readv(fd, buffers)) == CHUNK:
            update(buffer)
            unreported += CHUNK
            if unreported >= TICK_BYTES:
                tick(unreported)
                unreported = 0
        while n:  # the tail, and whatever a growing file adds after a short read
            update(self._view[:n])
            unreported += n
            n = readv(fd, buffers)
        tick(unreported)
        return str(digest.hexdigest())

    def _blake3_mapped(self, fd: int) -> str | None:
        """BLAKE3 of a big regular file on all cores, or None for anything else. The file is
        mapped: a file truncated while it is hashed ends this worker with SIGBUS, and the
        run then stops with an error rather than a wrong digest. It is fed in slices of
        BLAKE3_SLICE so that the bar moves on slow storage (as fast as one update here)."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return None
        digest = _new_hash("blake3", threads=True)()
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            for start in range(0, len(view), BLAKE3_SLICE):
                with view[start:start + BLAKE3_SLICE] as piece:
                    digest.update(piece)
                    self._tick(len(piece))
        return str(digest.hexdigest())


Member = tuple[int, int]  # offset and size of a member's data in its shard; size -1: invalid


class _MemberHasher:
    """In a worker: MD5s of members of one shard of a tar destination, read by offset.

    The shard's name comes from the index, which can be tampered with: only the tar sink's
    own `shard-WWW-NNNNNN.tar` names are opened, relative to DEST, never through a symlink.
    """

    def __init__(self, dest: Path, tick: Tick) -> None:
        self._dest = dest
        self._tick = tick
        self._dest_fd = -1
        self._shard: str | None = None
        self._fd: int | OSError = -1
        self._buffer = bytearray(CHUNK)
        from bulkfetch.util.md5 import md5_hex  # the builtin MD5 is faster on small members

        self._md5_hex = md5_hex
        self._md5 = _new_hash("md5")

    def __call__(self, batch: tuple[str, list[Member]]) -> list[Digest]:
        shard, members = batch
        if shard != self._shard:
            self._switch(shard)
        fd = self._fd
        if isinstance(fd, OSError):
            return [fd] * len(members)
        return [self._one(fd, offset, size) for offset, size in members]

    def _switch(self, shard: str) -> None:
        from bulkfetch.dest import index

        if isinstance(self._fd, int) and self._fd >= 0:
            os.close(self._fd)
        self._shard, self._fd = shard, -1
        match = index.SHARD_RE.match(shard)
        if match is None or match.group(3):
            self._fd = _failure(errno.EINVAL, f"the index names no valid shard file ({shard!r})")
            return
        try:
            if self._dest_fd < 0:
                self._dest_fd = os.open(self._dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fd = os.open(shard, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self._dest_fd)
        except OSError as exc:
            self._fd = _failure(exc.errno or errno.EIO, f"shard {shard}: {exc.strerror}")
            return
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._fd = _failure(errno.EINVAL, f"shard {shard} is not a regular file")
            return
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._fd = fd

    def _one(self, fd: int, offset: int, size: int) -> Digest:
        if size < 0:
            return _failure(errno.EINVAL, "the index row is invalid")
        try:
            if size <= CHUNK:
                body = os.pread(fd, size, offset)
                if len(body) != size:
                    return self._short()
                self._tick(size)
                return self._md5_hex(body)
            return self._read_large(fd, offset, size)
        except OSError as exc:
            return _failure(exc.errno or errno.EIO, f"shard {self._shard}: {exc.strerror}")

    def _read_large(self, fd: int, offset: int, size: int) -> Digest:
        digest = self._md5()
        buffer, view = self._buffer, memoryview(self._buffer)
        end = offset + size
        while offset < end:
            want = min(CHUNK, end - offset)
            part = buffer if want == CHUNK else view[:want]
            if os.preadv(fd, (part,), offset) != want:
                return self._short()
            digest.update(part)
            offset += want
        self._tick(size)
        return digest.hexdigest()

    def _short(self) -> OSError:
        return _failure(errno.EIO, f"shard {self._shard} ends before the member does "
                                   "(truncated)")


# -- the three runs -------------------------------------------------------------------------


def _listed(jobs: Iterable[tuple[C, int]], progress: HashProgress) -> Iterator[tuple[C, int]]:
    """`jobs` unchanged, counted into `progress` as they are listed."""
    for job in jobs:
        progress.listed_files += 1
        progress.listed_bytes += max(job[1], 0)
        yield job
    progress.listing_done = True


def _job_size(job: tuple[object, int]) -> int:
    return job[1]


def _named(jobs: Sequence[tuple[str, int]]) -> str:
    """A batch in words, by its largest file (the one a truncation under BLAKE3's mapping
    can have ended a worker on)."""
    largest = max(jobs, key=_job_size)[0]
    return largest if len(jobs) == 1 else f"{largest} (or one of the {len(jobs) - 1} " \
                                          "other files of its batch)"


def _run(pool: WorkerPool[P, Digest], batches: Iterable[tuple[P, list[C]]],
         progress: HashProgress) -> Iterator[tuple[C, Digest]]:
    progress.read_bytes = pool.bytes_done
    with pool:
        for contexts, digests in pool.map(batches):
            for item in zip(contexts, digests, strict=True):
                progress.files_done += 1
                yield item


def hash_paths(paths: Sequence[str], options: HashOptions,
               progress: HashProgress) -> Iterator[tuple[str, Digest]]:
    """(path, digest) of every file under `paths` (see walk), in order."""
    require_algorithm(options.algo)
    pool = WorkerPool(options.workers, functools.partial(_FileHasher, options.algo),
                      describe=_named)
    batches = batched(_listed(walk(paths), progress), _job_size, files=options.batch_files,
                      nbytes=options.batch_bytes)
    for (path, _), digest in _run(pool, ((batch, batch) for batch in batches), progress):
        yield path, digest


def check_entries(entries: Iterable[CheckEntry], algo: str, options: HashOptions,
                  progress: HashProgress) -> Iterator[tuple[CheckEntry, Digest]]:
    """(entry, digest of the file it lists) for each entry of a checksum file, in order."""
    require_algorithm(algo)
    pool = WorkerPool(options.workers, functools.partial(_FileHasher, algo),
                      describe=lambda entries: _named([(e.path, _stat_size(e.path))
                                                       for e in entries]))
    jobs = _listed(((entry, _stat_size(entry.path)) for entry in entries), progress)
    batches = batched(jobs, _job_size, files=options.batch_files, nbytes=options.batch_bytes)
    payloads = (([(entry.path, size) for entry, size in batch], [e for e, _ in batch])
                for batch in batches)
    yield from _run(pool, payloads, progress)


def _member_job(info: MemberInfo) -> tuple[MemberInfo, int]:
    valid = (isinstance(info.offset, int) and isinstance(info.size, int) and info.offset >= 0
             and info.size >= 0 and isinstance(info.shard, str))
    return info, info.size if valid else -1


def verify_members(members: Iterable[MemberInfo], dest: Path, options: HashOptions,
                   progress: HashProgress) -> Iterator[tuple[MemberInfo, Digest]]:
    """(member, MD5 of its bytes in its shard) for each member of a tar destination, in the
    index's order; each batch holds members of one shard, and different batches of one
    shard run on different workers at once."""
    pool = WorkerPool(options.workers, functools.partial(_MemberHasher, Path(dest)),
                      describe=lambda infos: "members of " + str(infos[0].shard))
    jobs = _listed(map(_member_job, members), progress)
    batches = batched(jobs, _job_size, files=options.batch_files, nbytes=options.batch_bytes,
                      group_of=lambda job: job[0].shard)
    payloads = (((str(batch[0][0].shard), [(info.offset or 0, size) for info, size in batch]),
                 [info for info, _ in batch]) for batch in batches)
    yield from _run(pool, payloads, progress)
