"""Writing a data set out as files: OUT/<name>, exactly as safely as the directory sink.

The names come from DEST (an index can be tampered with), so every name is checked again
with check_name and written by a DirectorySink: never through a symlink, never outside OUT,
each file under a temporary name first. The sink's temporary directory OUT/.bulkfetch/tmp is
made for the extraction and removed afterwards, with anything of ours still in it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.dataset.base import Dataset
from bulkfetch.errors import DataUnreadable, UsageError
from bulkfetch.sinks.base import SinkFailure, SinkFatal
from bulkfetch.sinks.directory import DirectorySink
from bulkfetch.util.names import RESERVED, check_name

__all__ = ["ExtractResult", "extract"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class ExtractResult:
    files: int = 0  # written
    bytes: int = 0
    failed: int = 0  # refused, unreadable, corrupt or not writable
    stopped: str | None = None  # why the extraction ended early (disk full, …), if it did

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.stopped else 0


def extract(dataset: Dataset, out: Path, *, pattern: str | None = None,
            on_failure: Callable[[str, str], None] | None = None,
            on_progress: Callable[[ExtractResult], None] | None = None) -> ExtractResult:
    """Write every member of `dataset` (matching the glob `pattern`) to OUT/<name>.

    A member that cannot be written is a failure (`on_failure(name, reason)`) and the rest go
    on; a full or read-only disk stops the extraction (`stopped`). UsageError when OUT
    cannot be used.
    """
    out = Path(out)
    _prepare(dataset.dest, out)
    result = ExtractResult()

    def fail(name: str, reason: str) -> None:
        result.failed += 1
        if on_failure is not None:
            on_failure(name, reason)

    def unreadable(name: str, exc: DataUnreadable) -> None:
        fail(name, str(exc))

    with _sink(out) as sink, contextlib.closing(
            dataset.items(pattern, on_error=unreadable)) as members:
        for name, body in members:
            reason = check_name(name)
            if reason is not None:
                fail(name, f"refused: {reason}")
                continue
            try:
                sink.write(name, body)
            except SinkFailure as exc:
                fail(name, str(exc))
                continue
            except SinkFatal as exc:
                result.stopped = str(exc)
                break
            result.files += 1
            result.bytes += len(body)
            if on_progress is not None:
                on_progress(result)
    return result


def _prepare(dest: Path, out: Path) -> None:
    """Create OUT if needed; refuse an OUT that overlaps DEST either way."""
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory: give a directory for OUT")
    if _contains(dest, out):
        raise UsageError(f"{out} is {dest} or inside it: the extracted files would mix with "
                         "the data set; choose an OUT outside DEST")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {out}: {exc.strerror}") from None
    if _contains(out, dest):
        raise UsageError(f"{dest} is inside {out}: extracted files could overwrite the data "
                         "set being read; choose an OUT that does not contain DEST")


def _contains(outer: Path, inner: Path) -> bool:
    """True when `inner` is `outer` or lies below it, compared by inode so that another
    path to the same directory (a bind mount, a symlinked parent) is caught too. For an
    `inner` that does not exist yet, its nearest existing ancestor decides."""
    try:
        target = os.stat(outer)
    except OSError:
        return False
    path = os.path.realpath(inner)
    while True:
        with contextlib.suppress(OSError):
            found = os.stat(path)
            if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
                return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent


@contextlib.contextmanager
def _sink(out: Path) -> Iterator[DirectorySink]:
    """A DirectorySink writing into OUT, with the temporary directory it needs made here and
    removed again on the way out (only what this extraction created)."""
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        made_state = _make_directory(out_fd, RESERVED, out)
        state_fd = os.open(RESERVED, _DIR_FLAGS, dir_fd=out_fd)
        try:
            made_tmp = _make_directory(state_fd, "tmp", out / RESERVED)
            sink = DirectorySink(out, worker=0)
            try:
                yield sink
            finally:
                sink.close()
                _remove_temporaries(state_fd, sink.prefix)
                if made_tmp:
                    with contextlib.suppress(OSError):
                        os.rmdir("tmp", dir_fd=state_fd)
        finally:
            os.close(state_fd)
        if made_state:
            with contextlib.suppress(OSError):
                os.rmdir(RESERVED, dir_fd=out_fd)
    finally:
        os.close(out_fd)


def _make_directory(parent: int, name: str, where: Path) -> bool:
    """Make the directory `name` in `parent` unless it exists; True when made here. A
    symlink or a file in its place is refused, not followed."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    except OSError as exc:
        raise UsageError(f"cannot create {where / name}: {exc.strerror}") from None
    try:
        os.close(os.open(name, _DIR_FLAGS, dir_fd=parent))
    except OSError:
        raise UsageError(f"{where / name} is not a directory (a symlink or a file?): "
                         "remove it or choose another OUT") from None
    return made


def _remove_temporaries(state_fd: int, prefix: str) -> None:
    """Unlink this sink's temporary files left by an interrupted write (Ctrl-C mid-file)."""
    with contextlib.suppress(OSError):
        tmp_fd = os.open("tmp", _DIR_FLAGS, dir_fd=state_fd)
        try:
            with os.scandir(tmp_fd) as entries:
                leftovers = [e.name for e in entries if e.name.startswith(prefix)]
            for name in leftovers:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=tmp_fd)
        finally:
            os.close(tmp_fd)
