"""Files that must survive a crash whole: written to a temporary name beside them, fsynced,
renamed into place, and the rename made durable by an fsync of the directory. A reader
sees the old file or the whole new one, never a part, after a kill or a power loss.
A file rewritten every second (status.json, metrics.prom) takes the rename without the
fsyncs: write_atomically()."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """`data` into `path` as described above; on any error the temporary file is removed
    and the error raised. The parent directory must exist."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp",
                                     dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)  # mkstemp makes 0600
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make the renames in `directory` durable where the platform allows (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file and a rename: a reader never sees half."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
