"""--sink tar: each worker packs bodies into its own shards, DEST/shard-WWW-NNNNNN.tar.

Why: one 100-byte file costs tens of microseconds of filesystem metadata; a tar member costs
a 512-byte header built from a template (ustar.py packs them, in C when it is built).
Shards are plain POSIX tar (ustar, with a PAX header for names that do not fit), so tarfile
and webdataset read them as they are.

Pages and shards: every page's files go into ONE shard (the shard that was current when the
page began), so a page is durable exactly when that shard is closed. A shard stops taking
new pages once the pages begun in it bring --shard-files files (or it holds --shard-size
bytes) but stays open until they finish; meanwhile new pages start the next shard. A page
writes whole samples in listing order (ordered.py), so webdataset reads them whole.

Closing a shard: write the end-of-archive blocks, fsync, commit its rows to DEST/index.sqlite,
rename .tar.part -> .tar, fsync DEST. Only then are its pages' reports released to the
journal. index.recover() handles a run killed between any two of those steps.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bulkfetch.dest import index
from bulkfetch.models import PageReport
from bulkfetch.sinks.base import SinkAbilities, SinkFatal, Writer
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sinks.ordered import Held, PageInOrder, sample_keys
from bulkfetch.sinks.spool import PARTIAL_DIR, FileSpool, SpoolDirectory
from bulkfetch.sinks.ustar import BLOCK, END, member_header, new_packer

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Shard:
    """One open shard: a .tar.part file, the packer appending to it (with its members'
    index rows) and the pages it holds."""

    def __init__(self, dest_fd: int, worker: int, number: int, dest: Path | None = None) -> None:
        self.dest_fd = dest_fd
        self.worker = worker
        self.file = index.shard_file(worker, number)
        self.part = self.file + ".part"
        # messages name the shard by its path (DEST/shard-...tar.part) when DEST is known
        self.where = str(dest / self.part) if dest is not None else self.part
        try:
            self.fd = os.open(self.part, _FILE_FLAGS, 0o644, dir_fd=dest_fd)
        except FileExistsError:
            raise SinkFatal(f"{self.where} already exists: another run is writing to this "
                            "DEST") from None
        except OSError as exc:
            raise SinkFatal(f"cannot create {self.where}: {exc.strerror}") from None
        self.mtime = int(time.time())
        self.packer = new_packer(self.fd, self.where, self.mtime)
        self.add = self.packer.add  # the page's writer: one call per stored file
        self.open_pages = 0
        self.given = 0  # files of the pages begun in it
        self.held: list[PageReport] = []

    @property
    def offset(self) -> int:
        return self.packer.offset

    @property
    def files(self) -> int:
        return len(self.packer.members) // 4

    def add_spooled(self, name: str, spool: FileSpool, size: int, md5: str) -> None:
        """Append the member `name` whose body is the spool's file: the same bytes as
        packer.add() of that body, with the body copied file to file in the kernel."""
        packer = self.packer
        packer.append(member_header(name, size, self.mtime))
        packer.flush()
        data_at = packer.offset
        try:
            _copy_file(spool.fd, self.fd, size)
        except OSError as exc:
            raise SinkFatal(f"cannot write {self.where}: {exc.strerror}") from None
        packer.advance(size)
        packer.append(bytes(-size % BLOCK))
        packer.members.extend((name, data_at, size, md5))

    def close(self, conn: sqlite3.Connection) -> list[PageReport]:
        """Make the shard durable and indexed; return the page reports it releases. If that
        fails before the index has its rows (disk full ...), the .tar.part is removed: its
        pages are not done and a rerun fetches them again."""
        try:
            self.packer.append(END)
            self.packer.flush()
            try:
                os.fsync(self.fd)
            except OSError as exc:
                raise SinkFatal(f"cannot write {self.where}: {exc.strerror}") from None
            try:
                index.add_shard_flat(conn, self.file, self.worker, self.packer.offset,
                                     time.time(), self.held, self.packer.members)
            except sqlite3.Error as exc:
                raise SinkFatal(f"cannot update {index.INDEX_NAME}: {exc}") from None
        except BaseException:
            self.discard()
            raise
        os.close(self.fd)
        try:
            os.rename(self.part, self.file, src_dir_fd=self.dest_fd, dst_dir_fd=self.dest_fd)
            os.fsync(self.dest_fd)
        except OSError as exc:  # index.recover() renames it at the next start
            raise SinkFatal(f"cannot rename {self.where}: {exc.strerror}") from None
        released, self.held = self.held, []
        self.packer.release()
        return released

    def discard(self) -> None:
        """Drop a shard whose pages cannot all finish: those pages will be fetched again."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.part, dir_fd=self.dest_fd)
        self.packer.release()
        self.held.clear()


def _copy_file(source: int, target: int, size: int) -> None:
    """`size` bytes from the start of `source` to the position of `target`: by
    copy_file_range(2) (no copy through user space), by sendfile(2) where that is refused
    (another filesystem, an old kernel)."""
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(source, target, size - copied, copied)
            if n == 0:
                raise OSError(0, f"the spooled file ended {size - copied} bytes early")
            copied += n
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    while copied < size:
        n = os.sendfile(target, source, copied, size - copied)
        if n == 0:
            raise OSError(0, f"the spooled file ended {size - copied} bytes early")
        copied += n


class TarSink:
    abilities = SinkAbilities(resumes=True, ordered=True)
    needs_md5 = True  # the index holds every member's MD5

    def __init__(self, dest: Path, worker: int, shard_files: int, shard_size: int) -> None:
        self.dest = Path(dest)
        self.worker = worker
        self.shard_files = shard_files
        self.shard_size = shard_size
        self.dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.next_number = index.next_shard_number(self.dest, worker)
        self.current: _Shard | None = None
        self.draining: list[_Shard] = []  # full shards waiting for their pages to finish
        self.shard_of: dict[int, _Shard] = {}  # page seq -> its shard
        self.order_of: dict[int, PageInOrder] = {}  # page seq -> its samples, in order
        self.held = Held()
        self.conn: sqlite3.Connection | None = None
        # Closing a shard (fsync, index rows, rename) takes a second or so of mostly I/O
        # wait: one thread does it, in order, while the transfers go on.
        self.closer: ThreadPoolExecutor | None = None
        self.closing: deque[Future[list[PageReport]]] = deque()
        self.spools = SpoolDirectory(self.dest_fd, TMP_DIR, str(self.dest / TMP_DIR))
        self.spooled = 0  # spools opened, for their names
        self.partials = SpoolDirectory(self.dest_fd, PARTIAL_DIR, str(self.dest / PARTIAL_DIR))

    def _connection(self) -> sqlite3.Connection:
        if self.conn is None:
            try:
                self.conn = index.connect(self.dest, threads=True)
            except (OSError, sqlite3.Error) as exc:
                raise SinkFatal(f"cannot open {index.INDEX_NAME}: {exc}") from None
        return self.conn

    def _full(self, shard: _Shard) -> bool:
        # the files given (not only those stored): at the start of a run every page out
        # begins before any file arrives, and would all land in the first shard
        return (max(shard.files, shard.given) >= self.shard_files
                or shard.offset >= self.shard_size)

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Writer:
        shard = self.current
        if shard is not None and self._full(shard):
            self.draining.append(shard)  # closes when its last page ends
            shard = None
        if shard is None:
            shard = self.current = _Shard(self.dest_fd, self.worker, self.next_number,
                                          self.dest)
            self.next_number += 1
        shard.open_pages += 1
        shard.given += len(names)
        self.shard_of[seq] = shard
        keys = sample_keys(names)
        if keys is None:  # one member a sample: nothing to keep together
            return shard.add
        order = self.order_of[seq] = PageInOrder(names, keys, shard.add, shard.add_spooled,
                                                 self.held)
        return order.write

    def skip(self, seq: int, name: str) -> None:
        order = self.order_of.get(seq)
        if order is not None:
            order.skip(name)

    def open_spool(self, name: str) -> FileSpool:
        self.spooled += 1
        return self.spools.open(f"tar-w{self.worker}-{os.getpid()}-{self.spooled}")

    def open_partial(self, key: str) -> FileSpool:
        return self.partials.open(key, reopen=True)

    def store_spool(self, seq: int, name: str, spool: FileSpool, size: int, md5: str) -> None:
        order = self.order_of.get(seq)
        if order is not None:
            order.write_spooled(name, spool, size, md5)  # it discards the spool
            return
        try:
            self.shard_of[seq].add_spooled(name, spool, size, md5)
        finally:
            spool.discard()

    def end_page(self, report: PageReport) -> list[PageReport]:
        order = self.order_of.pop(report.seq, None)
        if order is not None:
            order.finish()
        shard = self.shard_of.pop(report.seq)
        shard.open_pages -= 1
        released = []
        if report.ok == 0:
            released.append(report)  # nothing of it sits in the shard
        else:
            shard.held.append(report)
        if shard.open_pages == 0 and (shard is not self.current or self._full(shard)):
            if shard is self.current:
                self.current = None
            else:
                self.draining.remove(shard)
            released += self._finish(shard)
            released += self._collect(wait=False, before=released)
        return released

    def _finish(self, shard: _Shard) -> list[PageReport]:
        """Start closing `shard` in the background; a shard with no file stored releases
        its reports at once."""
        if not shard.files:
            held = list(shard.held)
            shard.discard()
            return held
        if self.closer is None:
            from concurrent.futures import ThreadPoolExecutor  # tar runs only: 9 ms to load

            self.closer = ThreadPoolExecutor(1, thread_name_prefix="bulkfetch-shard-closer")
        self.closing.append(self.closer.submit(shard.close, self._connection()))
        return []

    def ready(self) -> list[PageReport]:
        """Reports of the shards closed since, in closing order."""
        return self._collect(wait=False)

    def _collect(self, wait: bool, before: list[PageReport] | None = None) -> list[PageReport]:
        """Reports of the closed shards (of all, waiting for them, when `wait`). A failed
        close raises its SinkFatal only after every other finished close is collected,
        with their reports (after `before`, already released by the caller) in it."""
        released: list[PageReport] = []
        failure: SinkFatal | None = None
        while self.closing and (wait or self.closing[0].done()):
            try:
                released += self.closing.popleft().result()
            except SinkFatal as exc:
                failure = failure or exc
        if failure is not None:
            failure.released = [*(before or []), *released, *failure.released]
            raise failure
        return released

    def flush(self) -> list[PageReport]:
        """Close every shard whose pages have all finished (end of input or a stop); drop
        the ones still holding unfinished pages, which a rerun fetches again."""
        released: list[PageReport] = []
        shards = self.draining + ([self.current] if self.current is not None else [])
        self.draining, self.current = [], None
        for shard in shards:
            if shard.open_pages:
                shard.discard()
            else:
                released += self._finish(shard)
        self.shard_of.clear()
        self._drop_orders()
        return released + self._collect(wait=True, before=released)

    def _drop_orders(self) -> None:
        for order in self.order_of.values():
            order.drop()
        self.order_of.clear()

    def close(self) -> None:
        self._drop_orders()
        for shard in self.draining + ([self.current] if self.current is not None else []):
            shard.discard()
        self.draining, self.current = [], None
        if self.closer is not None:
            self.closer.shutdown(wait=True)
            self.closer = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.spools.close()
        self.partials.close()
        os.close(self.dest_fd)

