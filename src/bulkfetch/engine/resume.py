"""Partial big files kept across runs: DEST/.bulkfetch/partial/<key> and <key>.json.

A file fetched by ranges is written into DEST/.bulkfetch/partial/<key> (key: a hash of
its name), which a new run does not empty. Beside it, <key>.json records the bytes known
durable: the file's name, total size and validator, and for each part its range and how
many bytes from its start are written. The worker that owns the file records it (it alone
knows when its fsync ended): data fsynced first, then the record written to a temporary
name, fsynced and renamed over the old one, so after a kill -9 the record never claims
bytes the disk may not hold. A rerun of the same command finds the record when the name
is listed again, asks only for the missing ranges with If-Range set to the recorded
validator, and starts over if the file changed meanwhile. The record is removed before
the file is stored, and with it when the file is given up.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.sinks.spool import PARTIAL_DIR

RECORD = ".json"


def partial_key(name: str) -> str:
    """The partial file's name for the remote name `name` (any length, any characters)."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class PartialRecord:
    name: str
    total: int
    validator: str
    parts: tuple[tuple[int, int, int], ...]  # (start, end, bytes written from start)
    digests: tuple[tuple[str, str], ...] = ()  # (hashlib name, hex) the server stated

    @property
    def written(self) -> int:
        return sum(part[2] for part in self.parts)

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "total": self.total, "validator": self.validator,
                           "parts": [list(part) for part in self.parts],
                           "digests": dict(self.digests)}).encode()

    @classmethod
    def decode(cls, data: bytes) -> PartialRecord | None:
        """The record in `data`, or None when it is not one we wrote (ignored, then)."""
        try:
            raw = json.loads(data)
            parts = tuple((int(s), int(e), int(w)) for s, e, w in raw["parts"])
            digests = tuple((str(k), str(v)) for k, v in raw.get("digests", {}).items())
            record = cls(str(raw["name"]), int(raw["total"]), str(raw["validator"]), parts,
                         digests)
            for _, value in digests:
                bytes.fromhex(value)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not parts or parts[0][0] != 0 or parts[-1][1] != record.total or any(
                not 0 <= w <= e - s for s, e, w in parts) or any(
                a[1] != b[0] for a, b in itertools.pairwise(parts)):
            return None
        return record


def save(dir_fd: int, key: str, record: PartialRecord) -> None:
    """Write `record` for partial file `key` durably (the data must be fsynced already)."""
    temporary = key + RECORD + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, record.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, key + RECORD, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def load(dir_fd: int, key: str) -> PartialRecord | None:
    try:
        fd = os.open(key + RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return PartialRecord.decode(os.read(fd, 1 << 20))
    finally:
        os.close(fd)


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
                        found.append(record)
    return found


def describe_partials(dest: Path) -> list[str]:
    """Lines for `bulkfetch status`: each partial file a rerun resumes, and how far it is."""
    from rich.filesize import decimal

    found = records(dest)
    lines = [f"partial files (a rerun fetches only their missing bytes): {len(found):,}"]
    for record in found[:20]:
        share = 100 * record.written / record.total if record.total else 100.0
        lines.append(f"  {record.name}: {decimal(record.written)} of {decimal(record.total)} "
                     f"({share:.0f}%) in {len(record.parts)} ranges")
    if len(found) > 20:
        lines.append(f"  ... and {len(found) - 20:,} more")
    return lines if found else []
