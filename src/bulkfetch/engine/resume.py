"""Partial big files kept across runs: DEST/.bulkfetch/partial/<key> and <key>.json.

A file fetched by ranges is written into DEST/.bulkfetch/partial/<key> (key: a hash of
its name), which a new run does not empty. Beside it, <key>.json records the file's name,
total size and validator, and for each piece its range and how many bytes from its start
are written. The worker that owns the file writes the record every quarter second
(big.CHECKPOINT_S) to a temporary name renamed over the old one.

Which bytes a record may claim: a killed process loses nothing it wrote (its bytes are in
the kernel's page cache), a machine that stops does. So a record names the machine's boot
(Linux's boot id) and holds two layouts: the bytes written, good while the machine has
not restarted, and the bytes made durable by the last fsync, about every DURABLE_S (the
data fsynced first, then the record, itself fsynced). After a kill -9 a rerun continues
from the last quarter second; after a power loss, from the last fsync. An fsync every
second stalls a fast download: strace of one 1 GiB download over one connection counted
14 fsyncs taking 2.7 s in all (session 12; benchmarks/bigfiles.py's one-connection row went
from 163 to 272 MB/s with this change and in-line hashing together). Where the boot cannot be told,
every record is durable.

A rerun of the same command finds the record when the name is listed again, asks only for
the missing ranges with If-Range set to the recorded validator, and starts over if the file
changed meanwhile. The record is removed before the file is stored, and with it when the
file is given up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bulkfetch.sinks.spool import PARTIAL_DIR, FileSpool

RECORD = ".json"
Layout = tuple[tuple[int, int, int], ...]  # (start, end, bytes written from start) a piece


def _boot_id() -> str | None:
    """This boot of the machine, or None where it cannot be told."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


BOOT_ID = _boot_id()


def partial_key(name: str) -> str:
    """The partial file's name for the remote name `name` (any length, any characters)."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class PartialRecord:
    name: str
    total: int
    validator: str
    parts: Layout  # the bytes written
    digests: tuple[tuple[str, str], ...] = ()  # (hashlib name, hex) the server stated
    # When given, `parts` hold only while the machine runs the boot `boot`; `durable` holds
    # after a restart. When not, `parts` are durable.
    boot: str = ""
    durable: Layout | None = None

    @property
    def written(self) -> int:
        return sum(part[2] for part in self.parts)

    def held_by(self, size: int) -> bool:
        """Whether a partial file of `size` bytes can hold every byte the record claims
        (pieces not started claim none, wherever they begin)."""
        return size >= max((s + w for s, _, w in self.parts if w), default=0)

    def for_this_boot(self) -> PartialRecord:
        """The record with the layout this machine can trust now."""
        if self.durable is None or (self.boot and self.boot == BOOT_ID):
            return self
        return replace(self, parts=self.durable, boot="", durable=None)

    def encode(self) -> bytes:
        raw = {"name": self.name, "total": self.total, "validator": self.validator,
               "parts": [list(part) for part in self.parts], "digests": dict(self.digests)}
        if self.durable is not None:
            raw |= {"boot": self.boot, "durable": [list(part) for part in self.durable]}
        return json.dumps(raw).encode()

    @classmethod
    def decode(cls, data: bytes) -> PartialRecord | None:
        """The record in `data`, or None when it is not one we wrote (ignored, then)."""
        try:
            raw = json.loads(data)
            parts = _layout(raw["parts"])
            durable = _layout(raw["durable"]) if "durable" in raw else None
            digests = tuple((str(k), str(v)) for k, v in raw.get("digests", {}).items())
            record = cls(str(raw["name"]), int(raw["total"]), str(raw["validator"]), parts,
                         digests, str(raw.get("boot", "")), durable)
            for _, value in digests:
                bytes.fromhex(value)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        layouts = [parts] if durable is None else [parts, durable]
        if not all(_covers(layout, record.total) for layout in layouts):
            return None
        return record


def _layout(raw: list[list[int]]) -> Layout:
    return tuple((int(s), int(e), int(w)) for s, e, w in raw)


def _covers(layout: Layout, total: int) -> bool:
    """`layout` is pieces in order, from 0 to `total`, each written no further than its end."""
    return bool(layout) and layout[0][0] == 0 and layout[-1][1] == total and all(
        0 <= w <= e - s for s, e, w in layout) and all(
        a[1] == b[0] for a, b in itertools.pairwise(layout))


def save(dir_fd: int, key: str, record: PartialRecord, durable: bool) -> None:
    """Write `record` for partial file `key`; `durable`: fsynced (its data must be already)."""
    # (a durable record is written on a thread of its own: a name of its own)
    temporary = key + RECORD + (".durable.tmp" if durable else ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, record.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, key + RECORD, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_record(spool: FileSpool, record: PartialRecord, durable: bool,
                 last_durable: Layout | None) -> bool:
    """Write `record` (its layout: the bytes written) beside `spool`: `durable`, after an
    fsync of the data, else as good on this boot only, beside `last_durable` (the layout
    the last durable record held; none: nothing durable yet). True when a durable record
    was written. A record that cannot be written leaves the one before it: a rerun asks
    for a little more, and verification decides, as for any file."""
    try:
        if durable:
            os.fsync(spool.fd)
        else:
            nothing = tuple((start, end, 0) for start, end, _ in record.parts)
            record = replace(record, boot=BOOT_ID or "", durable=last_durable or nothing)
        save(spool.dir_fd, spool.name, record, durable)
    except OSError:
        return False
    return durable


def load(dir_fd: int, key: str) -> PartialRecord | None:
    try:
        fd = os.open(key + RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        record = PartialRecord.decode(os.read(fd, 16 << 20))
    finally:
        os.close(fd)
    return None if record is None else record.for_this_boot()


def remove(dir_fd: int, key: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(key + RECORD, dir_fd=dir_fd)


def names_with_records(dest: Path) -> set[str]:
    """The names of the partial files a run may resume."""
    return {record.name for record in records(dest)}


def records(dest: Path) -> list[PartialRecord]:
    directory = dest / PARTIAL_DIR
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(directory)):
            if entry.endswith(RECORD):
                with contextlib.suppress(OSError):
                    record = PartialRecord.decode((directory / entry).read_bytes())
                    if record is not None:
                        found.append(record.for_this_boot())
    return found


def describe_partials(dest: Path) -> list[str]:
    """Lines for `bulkfetch status`: each partial file a rerun resumes, and how far it is."""
    from rich.filesize import decimal

    found = records(dest)
    lines = [f"partial files (a rerun fetches only their missing bytes): {len(found):,}"]
    for record in found[:20]:
        share = 100 * record.written / record.total if record.total else 100.0
        lines.append(f"  {record.name}: {decimal(record.written)} of {decimal(record.total)} "
                     f"({share:.0f}%) in {len(record.parts)} pieces")
    if len(found) > 20:
        lines.append(f"  ... and {len(found) - 20:,} more")
    return lines if found else []


def open_partial(sink: Any, name: str, plan: Any,
                 ) -> tuple[FileSpool, PartialRecord | None] | None:
    """The partial file of `name` in `sink` and its record; the record only when the file
    can be resumed: its bytes are there, and they are of `plan`'s (parts.SplitPlan) version
    of the file when a plan is given. A file that cannot be resumed is emptied and its
    record removed. None for a sink that keeps no partial files, or when another transfer
    holds the file. Raises SinkFailure."""
    key = partial_key(name)
    spool = sink.open_partial(key)
    if spool is None:
        return None
    try:
        # One transfer per partial file: the same name listed twice, in this worker or
        # another, goes as a plain stream of its own (the lock goes with the fd).
        fcntl.flock(spool.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        spool.close()
        return None
    record = load(spool.dir_fd, key)
    if record is not None and (
            record.name != name
            or not record.held_by(os.fstat(spool.fd).st_size)
            or (plan is not None and (record.total, record.validator)
                != (plan.total, plan.validator))):
        record = None
    if record is None:
        remove(spool.dir_fd, key)
        # Only a file with bytes in it: ext4 writes back on close a file truncated to
        # zero and written again (auto_da_alloc), 1.4 s for 1 GiB, stalling the loop.
        if os.fstat(spool.fd).st_size:
            os.ftruncate(spool.fd, 0)
    return spool, record
