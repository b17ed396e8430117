"""The blob cache every pull shares: blobs/ALG/HEX under one directory, content-addressed.

A blob enters the cache only after the engine verified it against its manifest digest and
it was fsynced in a layout; a pull that needs it again links it (a hard link: no copy, no
space) or, across file systems, copies it. Blobs are made read-only, since a layout and the
cache may share one inode. Two pulls at once are safe: every entry appears by rename.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from bulkfetch.oci.reference import Digest


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bulkfetch" / "oci"


def _regular_of_size(path: Path, size: int) -> bool:
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_size == size


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` becomes `source`'s content by rename: a hard link when both are on one file
    system, else a fsynced copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name[:16]}.", dir=target.parent)
    os.close(fd)
    os.unlink(temporary)
    try:
        try:
            os.link(source, temporary)
        except OSError:  # another file system, or links not allowed: copy
            shutil.copyfile(source, temporary)
            with open(temporary, "rb+") as handle:
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o444)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class BlobCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: Digest) -> Path:
        return self.root / digest.path

    def has(self, digest: Digest, size: int) -> bool:
        return _regular_of_size(self.path(digest), size)

    def place(self, digest: Digest, size: int, target: Path) -> bool:
        """Put the cached blob at `target`; False when the cache does not hold it (or it
        cannot be read: the pull then fetches it)."""
        if not self.has(digest, size):
            return False
        try:
            _link_or_copy(self.path(digest), target)
        except OSError:
            return False
        return _regular_of_size(target, size)

    def keep(self, digest: Digest, size: int, source: Path) -> None:
        """Add the verified blob at `source` (OSError when the cache cannot take it)."""
        if not self.has(digest, size):
            with contextlib.suppress(OSError):
                os.chmod(source, 0o444)
            _link_or_copy(source, self.path(digest))
