"""`pull --unpack ROOTFS`: an image's layers applied in order, as a container runtime builds
its root file system (image-spec layer.md: changesets, whiteouts, opaque directories).

Layer tars come from the network. Nothing outside ROOTFS is ever created, changed or
removed: member names that are absolute or climb with `..` are refused; every directory on
a member's way is opened relative to its parent without following symlinks (openat with
O_NOFOLLOW), so a symlink a layer plants (`evil -> /etc`) can never be written through, and
a member whose path passes through one is refused; files are written to a temporary name
and renamed over whatever is there, so an existing symlink is replaced, not followed;
removals (whiteouts) descend by directory descriptors and unlink symlinks as links.
Symlinks themselves are created as they are: an absolute target means the root file
system's own path once in a container (`/etc/localtime -> /usr/share/zoneinfo/UTC`), a
relative one that climbs above ROOTFS is refused. Layers stream through in constant memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
COPY_CHUNK = 1 << 20
GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"


class UnpackError(Exception):
    """A layer that cannot be applied safely; names the layer and the member."""


@dataclass
class UnpackStats:
    """`files`, `dirs` and `symlinks`: what the root file system holds at the end (a file a
    later layer replaced or removed counts once, or not at all); the rest, what the layers
    did on the way."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    whiteouts: int = 0
    skipped_devices: int = 0


def unpack(rootfs: Path, layers: Sequence[tuple[Path, str, str]]) -> UnpackStats:
    """Apply `layers` ((blob path, media type, label), bottom first) into `rootfs`, which
    must be absent or empty."""
    if rootfs.exists() and (not rootfs.is_dir() or rootfs.is_symlink() or any(rootfs.iterdir())):
        raise UnpackError(f"{rootfs} is not an empty directory")
    rootfs.mkdir(parents=True, exist_ok=True)
    stats = UnpackStats()
    root = os.open(rootfs, _DIR_FLAGS)
    try:
        for path, media_type, label in layers:
            with open(path, "rb") as raw, _decompressed(raw, media_type, label) as stream:
                _Layer(root, label or path.name, stats).apply(stream)
    finally:
        os.close(root)
    stats.files, stats.dirs, stats.symlinks = census(rootfs)
    return stats


def census(rootfs: Path) -> tuple[int, int, int]:
    """(regular files, directories, symlinks) under `rootfs`, never following a symlink."""
    files = dirs = links = 0
    pending = [str(rootfs)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_symlink():
                    links += 1
                elif entry.is_dir(follow_symlinks=False):
                    dirs += 1
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    files += 1
    return files, dirs, links


@contextlib.contextmanager
def _decompressed(raw: BinaryIO, media_type: str, label: str) -> Iterator[BinaryIO]:
    """The layer's tar stream: gzip or zstd by their magic bytes (a mislabelled layer is
    read as what it is), else plain."""
    head = raw.read(4)
    raw.seek(0)
    if head.startswith(GZIP_MAGIC):
        import gzip

        with gzip.GzipFile(fileobj=raw) as stream:
            yield stream  # type: ignore[misc]
    elif head == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise UnpackError(f"layer {label} is zstd-compressed: pip install zstandard") \
                from None
        with zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            yield stream
    else:
        yield raw


def _clean(name: str, label: str, what: str = "member") -> list[str]:
    if "\0" in name:
        raise UnpackError(f"layer {label}: {what} {name!r} holds a NUL byte")
    if name.startswith("/"):
        raise UnpackError(f"layer {label}: {what} {name!r} is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnpackError(f"layer {label}: {what} {name!r} climbs with '..'")
    return parts


class _Layer:
    def __init__(self, root: int, label: str, stats: UnpackStats) -> None:
        self.root, self.label, self.stats = root, label, stats
        self.created: set[str] = set()  # paths this layer made (kept by its opaque dirs)
        self.opaque: list[list[str]] = []
        self.dir_modes: dict[str, int] = {}
        self.as_root = os.geteuid() == 0

    def refuse(self, name: str, why: str) -> UnpackError:
        return UnpackError(f"layer {self.label}: member {name!r} {why}; nothing is written "
                           "outside the root file system")

    def apply(self, stream: BinaryIO) -> None:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    self.member(tar, member)
        except tarfile.TarError as exc:
            raise UnpackError(f"layer {self.label} is not a readable tar: {exc}") from None
        for parts in self.opaque:
            self.clear_lower(parts)
        for path, mode in sorted(self.dir_modes.items(), key=lambda item: -len(item[0])):
            fd = self.walk(path.split("/") if path else [], create=False, name=path)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.fchmod(fd, mode)
                os.close(fd)

    # -- directories, never through a symlink ---------------------------------------------
    def walk(self, parts: list[str], *, create: bool, name: str) -> int | None:
        """An fd for ROOTFS/parts (created as 0755 directories when `create`), or None when
        a part is missing and not to be created. Raises when a part is a symlink."""
        fd = os.dup(self.root)
        try:
            for at, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    self.created.add("/".join(parts[:at + 1]))
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    found = os.lstat(part, dir_fd=fd)
                    if stat.S_ISLNK(found.st_mode):
                        raise self.refuse(name, "passes through the symlink "
                                          f"{'/'.join(parts[:at + 1])!r}") from None
                    if not create:
                        os.close(fd)
                        return None
                    os.unlink(part, dir_fd=fd)  # a file where the layer wants a directory
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def remove(self, parent: int, name: str) -> None:
        """Remove `name` in `parent` whatever it is; a directory's tree by descriptors,
        symlinks unlinked as links."""
        try:
            found = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(found.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        try:
            os.fchmod(fd, 0o700)  # a read-only directory's entries could not go otherwise
            for entry in list(os.scandir(fd)):
                self.remove(fd, entry.name)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)

    def clear_lower(self, parts: list[str]) -> None:
        """An opaque directory: what earlier layers put in it goes, this layer's stays."""
        fd = self.walk(parts, create=False, name="/".join(parts))
        if fd is None:
            return
        try:
            for entry in list(os.scandir(fd)):
                if "/".join([*parts, entry.name]) not in self.created:
                    self.remove(fd, entry.name)
        finally:
            os.close(fd)

    # -- members ---------------------------------------------------------------------------
    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = _clean(member.name, self.label)
        if not parts:
            return  # "./" itself
        base, path = parts[-1], "/".join(parts)
        if base == OPAQUE:
            self.opaque.append(parts[:-1])
            self.stats.whiteouts += 1
            return
        if base.startswith(WHITEOUT):
            parent = self.walk(parts[:-1], create=False, name=member.name)
            if parent is not None:
                try:
                    self.remove(parent, base[len(WHITEOUT):])
                finally:
                    os.close(parent)
            self.stats.whiteouts += 1
            return
        parent = self.walk(parts[:-1], create=True, name=member.name)
        try:
            self.created.add(path)
            if member.isdir():
                self.directory(parent, base, path, member)
            elif member.isreg():
                self.regular(tar, parent, base, member)
            elif member.issym():
                self.symlink(parent, base, parts, member)
            elif member.islnk():
                self.hardlink(parent, base, member)
            elif member.ischr() or member.isblk() or member.isfifo():
                self.device(parent, base, member)
            else:
                return
            if self.as_root and not member.isdir():
                with contextlib.suppress(OSError):
                    os.chown(base, member.uid, member.gid, dir_fd=parent,
                             follow_symlinks=False)
        finally:
            os.close(parent)

    def _mode(self, member: tarfile.TarInfo) -> int:
        return member.mode & (0o7777 if self.as_root else 0o1777)

    def directory(self, parent: int, base: str, path: str, member: tarfile.TarInfo) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(base, dir_fd=parent).st_mode):
                os.unlink(base, dir_fd=parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o755, dir_fd=parent)
            self.stats.dirs += 1
        if self.as_root:
            with contextlib.suppress(OSError):
                os.chown(base, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
        # final modes at the layer's end: a read-only directory must take its entries first
        self.dir_modes[path] = self._mode(member)

    def regular(self, tar: tarfile.TarFile, parent: int, base: str,
                member: tarfile.TarInfo) -> None:
        temporary = f".bulkfetch-unpack-{os.getpid()}"
        fd = os.open(temporary, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            source = tar.extractfile(member)
            if source is not None:
                while chunk := source.read(COPY_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
            os.fchmod(fd, self._mode(member))
        except BaseException:
            os.close(fd)
            os.unlink(temporary, dir_fd=parent)
            raise
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(base, dir_fd=parent).st_mode):
                self.remove(parent, base)
        os.replace(temporary, base, src_dir_fd=parent, dst_dir_fd=parent)
        os.utime(base, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        self.stats.files += 1

    def symlink(self, parent: int, base: str, parts: list[str],
                member: tarfile.TarInfo) -> None:
        target = member.linkname
        if "\0" in target:
            raise self.refuse(member.name, "is a symlink with a NUL byte in its target")
        if not target.startswith("/"):
            resolved = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1]
                                          else target)
            if resolved == ".." or resolved.startswith("../"):
                raise self.refuse(member.name, f"is a symlink to {target!r}, above the root")
        self.remove(parent, base)
        os.symlink(target, base, dir_fd=parent)
        self.stats.symlinks += 1

    def hardlink(self, parent: int, base: str, member: tarfile.TarInfo) -> None:
        try:
            source = _clean(member.linkname, self.label, "hard link target")
        except UnpackError as exc:
            raise self.refuse(member.name, f"is a hard link whose target {exc}") from None
        if not source:
            raise self.refuse(member.name, "is a hard link to the root")
        holder = self.walk(source[:-1], create=False, name=member.name)
        if holder is None:
            raise self.refuse(member.name, f"is a hard link to {member.linkname!r}, which is "
                              "not in the root file system")
        try:
            try:
                found = os.lstat(source[-1], dir_fd=holder)
            except FileNotFoundError:
                found = None
            if found is None or not stat.S_ISREG(found.st_mode):
                raise self.refuse(member.name, f"is a hard link to {member.linkname!r}, "
                                  "which is not a regular file in the root file system")
            self.remove(parent, base)
            os.link(source[-1], base, src_dir_fd=holder, dst_dir_fd=parent,
                    follow_symlinks=False)
        finally:
            os.close(holder)
        self.stats.hardlinks += 1

    def device(self, parent: int, base: str, member: tarfile.TarInfo) -> None:
        if not self.as_root and not member.isfifo():
            self.stats.skipped_devices += 1
            return
        kind = stat.S_IFIFO if member.isfifo() else \
            stat.S_IFCHR if member.ischr() else stat.S_IFBLK
        self.remove(parent, base)
        try:
            os.mknod(base, kind | self._mode(member), os.makedev(member.devmajor,
                                                                  member.devminor),
                     dir_fd=parent)
        except PermissionError:
            self.stats.skipped_devices += 1
