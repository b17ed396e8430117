"""The files a worker fetches in parts (parts.RangedFile), from their first piece to their
storing: their bytes hashed in file order (in line, or by a thread of their own), a record
of the bytes written kept beside each (resume.py) so that a killed run resumes them, and a
file whose every piece is in, hashed and checked handed to the sink.

BigFiles (big.py) starts and ends the pieces' transfers; this is what outlives any one of
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bulkfetch.engine import resume
from bulkfetch.engine.digests import BY_SIZE, checked_way
from bulkfetch.engine.layouts import PartLayouts
from bulkfetch.engine.parts import RangedFile
from bulkfetch.engine.transfers import Transfers
from bulkfetch.sinks.base import SinkFatal

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

HASH_STEP = 8 << 20  # bytes written in order before they are handed to the hashing thread
POLL_S = 0.02  # how often poll() looks for bytes to hash and to record
# A ranged file's bytes are recorded every CHECKPOINT_S seconds, or every CHECKPOINT_BYTES,
# while at least CHECKPOINT_MIN bytes came since the last record: a kill -9 costs the rerun
# about a quarter of a second of the transfer (a record is a rename of a small file; at 1 s
# a pull killed halfway at 280 MB/s fetched 65% again, benchmarks/pull.py, session 17).
# Every DURABLE_S a record follows an fsync of the data: what a power loss costs
# (engine/resume.py).
CHECKPOINT_S = 0.25
CHECKPOINT_BYTES = 256 << 20
DURABLE_S = 10.0
CHECKPOINT_MIN = 1 << 20

# (transfer, spool, size, hex MD5, how it was checked) -> whether the sink took it
Store = Callable[[tuple[Any, ...], Any, int, str, int, tuple[str, str] | None], bool]


class RangedFiles:
    def __init__(self, transfers: Transfers, layouts: PartLayouts, store: Store) -> None:
        self.transfers = transfers
        self.layouts = layouts
        self.store = store
        self.files: set[RangedFile] = set()  # not yet stored or dropped
        self.hasher: ThreadPoolExecutor | None = None  # hashes ranged files in file order
        # fsyncs a ranged file's data and then writes its durable record, beside the hashing:
        # on the hashing thread, the hash jobs queued behind an fsync wait for the disk to
        # take every byte written since the last one, and the file then waits at its end for
        # the hashing to catch up. (Here the disk keeps up with 300 MB/s: 4 GiB from 8 x 40
        # MB/s went at 293-298 MB/s with no fsync at all and 286 with it on the hashing
        # thread; with this thread, medians of three runs 273 against 271 MB/s before, within
        # the noise; a disk slower than the network, not measured, makes the wait longer.
        # Session 23.)
        self.recorder: ThreadPoolExecutor | None = None
        self.next_poll = 0.0
        self.size_only = 0  # ranged files no whole-file digest vouched for
        self.continued = 0  # bytes of stored files that a killed run's partial files held

    def add(self, ranged: RangedFile, record: resume.PartialRecord | None = None) -> None:
        """`ranged` begins: a new file, or one `record` left."""
        ranged.recorded = ranged.written
        ranged.recorded_at = ranged.durable_at = time.monotonic()
        if record is not None:
            ranged.durable = record.parts if record.durable is None else record.durable
            ranged.carried = ranged.written
        self.files.add(ranged)

    def hash_more(self, ranged: RangedFile, at_least: int) -> None:
        """Hand the hashing thread what is newly written in order, if it is `at_least`
        bytes (or the rest of the file)."""
        end = ranged.hashable_end()
        if end - ranged.hash_submitted <= at_least and end < ranged.plan.total:
            return
        if end > ranged.hash_submitted:
            ranged.hash_job = ranged.hashing = self._hasher().submit(
                ranged.hash_region, ranged.hash_submitted, end)
            ranged.hash_submitted = end

    def poll(self) -> None:
        """Hash what came in order since, record what is written, and store the files whose
        every part is in and hashed. The first two at most every POLL_S: a loop paced by
        a slow server turns many times a second, each time for a few kilobytes."""
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLL_S
            for ranged in self.files:
                self.hash_more(ranged, HASH_STEP)
                new = ranged.written - ranged.recorded
                if new >= CHECKPOINT_BYTES or (new >= CHECKPOINT_MIN and
                                               now - ranged.recorded_at >= CHECKPOINT_S):
                    # (one fsync at a time: while one runs, records say what is written)
                    self._checkpoint(ranged, durable=now - ranged.durable_at >= DURABLE_S
                                     and (ranged.recording is None or ranged.recording.done()))
        verify = self.transfers.verify
        for ranged in [r for r in self.files if r.done == len(r.parts)
                       and r.hash_submitted == r.plan.total and r.idle()]:
            self.files.discard(ranged)
            try:
                if ranged.hash_job is not None:
                    ranged.hash_job.result()
            except OSError as exc:
                self.forget(ranged)
                raise SinkFatal(f"cannot read back {ranged.name}'s ranges: {exc}") from None
            reason = ranged.mismatch() if verify else None
            way = checked_way(ranged.plan.stated) if verify else BY_SIZE
            if reason and self.layouts.cut_otherwise(ranged.name, ranged.plan.stated,
                                                     ranged.other):
                reason, way = None, BY_SIZE
            if reason:
                self.forget(ranged)
                self.transfers.retry_or_fail(ranged.transfer, reason, True, None, big=True)
                continue
            if not ranged.plan.stated:
                self.size_only += 1
            resume.remove(ranged.spool.dir_fd, ranged.spool.name)
            if self.store(ranged.transfer, ranged.spool, ranged.plan.total,
                          ranged.md5.hexdigest(), way, ranged.plan.kept):
                self.continued += ranged.carried

    def _checkpoint(self, ranged: RangedFile, durable: bool, now: bool = False) -> None:
        """Record the bytes written so far, unless `now` on the hashing thread (behind its
        hash jobs), or when `durable` (fsync them first, and record them as durable) on the
        recording thread. The two records are written under temporary names of their own;
        whichever is renamed into place last is true (each says no more than was written,
        and a durable one no more than was fsynced)."""
        layout = ranged.layout()
        stated = tuple((algorithm, raw.hex()) for algorithm, raw in ranged.plan.stated.items())
        ranged.recorded = ranged.written
        ranged.recorded_at = time.monotonic()
        if durable or resume.BOOT_ID is None:
            durable, ranged.durable_at = True, ranged.recorded_at
        plan = ranged.plan

        def write() -> None:
            record = resume.PartialRecord(ranged.name, plan.total, plan.validator, layout,
                                          stated)
            if resume.write_record(ranged.spool, record, durable, ranged.durable):
                ranged.durable = layout

        if now:
            write()
        elif durable:
            ranged.recording = self._recorder().submit(write)
        else:
            ranged.hashing = self._hasher().submit(write)  # FIFO: after the hash jobs

    def _hasher(self) -> ThreadPoolExecutor:
        if self.hasher is None:
            # loaded only when a file goes by ranges: 9 ms of start-up a run would pay
            from concurrent.futures import ThreadPoolExecutor

            self.hasher = ThreadPoolExecutor(1, thread_name_prefix="bulkfetch-hash")
        return self.hasher

    def _recorder(self) -> ThreadPoolExecutor:
        if self.recorder is None:
            from concurrent.futures import ThreadPoolExecutor

            self.recorder = ThreadPoolExecutor(1, thread_name_prefix="bulkfetch-record")
        return self.recorder

    def wait_hashing(self, timeout: float) -> bool:
        """Wait up to `timeout` for a hash or record job, when nothing else is in flight;
        False at once when none is running (the pieces left wait for a retry, or are about
        to be handed to the hashing thread)."""
        # Only jobs still running: a finished one (the last fsync's, long ago) would end
        # the wait at once, and the loop would spin beside the hashing thread it waits for
        # (on one core it took 70% of it: the last bytes of 4 GiB hashed 0.15 s later).
        jobs = [job for ranged in self.files for job in ranged.running()]
        if not jobs:
            return False
        from concurrent.futures import FIRST_COMPLETED, wait

        wait(jobs, timeout, FIRST_COMPLETED)
        return True

    def drop(self, ranged: RangedFile) -> None:
        """Give up `ranged` and remove its spool. Its parts in flight stop at their next
        chunk and end as usual (taking their handles out here could leave one in the batch
        of completions being handled); parts not started are skipped."""
        ranged.cancelled = True
        self.files.discard(ranged)
        self.forget(ranged)

    def forget(self, ranged: RangedFile) -> None:
        """Remove `ranged`'s partial file and its record, once the hashing and recording
        threads are done with them."""
        self._settle(ranged)
        resume.remove(ranged.spool.dir_fd, ranged.spool.name)
        ranged.spool.discard()

    @staticmethod
    def _settle(ranged: RangedFile) -> None:
        """Let the hashing and recording threads finish with `ranged` (they read and
        fsync the spool, and write its record) before the spool is closed."""
        jobs = ranged.running()
        if jobs:
            from concurrent.futures import wait

            wait(jobs)

    def keep_for_rerun(self) -> None:
        """A stop: every file in parts is kept for the rerun, with what is durable now."""
        for ranged in list(self.files):
            self.files.discard(ranged)
            self._settle(ranged)
            self._checkpoint(ranged, durable=True, now=True)
            ranged.spool.close()

    def close(self) -> None:
        if self.hasher is not None:
            self.hasher.shutdown(wait=True)
            self.hasher = None
        if self.recorder is not None:
            self.recorder.shutdown(wait=True)
            self.recorder = None
