"""The fetcher's big bodies: streamed to a spool as one transfer, or split into ranges.

A transfer lands here when libcurl stopped its in-memory attempt at --spool-above, or at
once: with --spool-above 0, and when its source gave a size (an S3 listing, a registry's
descriptor) above --spool-above and under --split-above (sized.py). Its first
response decides (parts.split_plan): one stream into a spool (spooling.SpooledBody), or
pieces over --parts connections written by offset into one spool (parts.RangedFile). Big
transfers hold at most half the handles, so small files keep moving beside them; a piece is
one transfer like any other. An S3 object uploaded in parts may be asked for its parts'
layout first (layouts.py, a HEAD).
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pycurl

from bulkfetch.engine import resume, spooling
from bulkfetch.engine.digests import BY_SIZE, checked_way
from bulkfetch.engine.layouts import PartLayouts
from bulkfetch.engine.multipart import LayoutProbe
from bulkfetch.engine.pacing import BigPacing
from bulkfetch.engine.parts import Part, RangedFile, SplitPlan, split_plan
from bulkfetch.models import InFlight
from bulkfetch.net.curl import attempt_failure, header_value, retry_after_seconds
from bulkfetch.net.redirects import REDIRECT_STATUSES, follow_big
from bulkfetch.sinks.base import SinkFailure, SinkFatal

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from bulkfetch.engine.fetcher import Fetcher

_URL = pycurl.URL
HASH_STEP = 8 << 20  # bytes written in order before they are handed to the hashing thread
POLL_S = 0.02  # how often poll() looks for bytes to hash and to record
# see nap(): a 4 ms nap while the big bodies average under 64 MB/s each, judged every 0.1 s
NAP_S, NAP_BELOW_RATE, NAP_WINDOW_S = 0.004, 64 << 20, 0.1
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


class BigFiles:
    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        limits = fetcher.options.limits
        self.spool_above = limits.spool_above
        self.split_above = limits.split_above
        self.parts = limits.parts
        # (state, name, url, attempt) of a stream, (..., part) of a range
        self.pending: deque[tuple[Any, ...]] = deque()
        self.active: dict[pycurl.Curl, spooling.SpooledBody | Part] = {}
        # Streams started at once (sized.py), not first in memory to be stopped at
        # their headers: that costs a second request per file and, with the rest of its
        # body unread, its connection. Counted by the fetcher's wants_pages like its own
        # pending, so a worker takes no more pages than it can start.
        self.sized: deque[tuple[Any, ...]] = deque()
        self.slots = max(1, limits.concurrency // 2)
        self.ranged: set[RangedFile] = set()  # files in parts, not yet stored or dropped
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
        self.last_moved = 0  # bytes of the big bodies in flight when the window began
        self.window_start = 0.0
        self.napping = False
        # Names with a partial file a killed run left (engine/resume.py): read once.
        self.partials = resume.names_with_records(Path(fetcher.options.dest))
        # A core to spare (more than workers): the hashing thread hashes a ranged file
        # beside its transfers; else the loop hashes in line, which costs less CPU.
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.hash_in_line = (len(usable) if usable else os.cpu_count() or 1) <= limits.workers
        self.restarts = 0  # ranged files started over as one stream
        self.layouts = PartLayouts(fetcher.layout_request if fetcher.verify else None)
        gate = fetcher.gate
        # --limit-rate (engine/pacing.py); a gate made later (a Retry-After) has no rate
        self.pacing = BigPacing(gate) if gate is not None and gate.byte_rate > 0 else None
        self.size_only = 0  # ranged files no whole-file digest vouched for
        self.continued = 0  # bytes of stored files that a killed run's partial files held

    # -- starting ------------------------------------------------------------------------
    def too_big(self, transfer: tuple[Any, ...], lines: list[bytes]) -> None:
        """The in-memory attempt at `transfer` stopped at --spool-above; `lines` are its
        response's headers."""
        plan = split_plan(lines)
        pinned = self.fetcher.pin_of(transfer)
        if pinned is not None and plan is not None:
            wrong = pinned.contradicts(plan.total, plan.stated)
            if wrong is not None:  # the wrong file, a lie, or changed: not worth a byte
                self.fetcher._fail(transfer[0], transfer[1], wrong, transfer[3], transfer[2],
                                   in_gate=False)
                return
            plan = plan.pin(pinned)
        probe = self.layouts.probe_for(plan, lines)
        if probe is not None:
            self.pending.append((*transfer[:4], probe))
            return
        self._go(transfer, plan)

    def _go(self, transfer: tuple[Any, ...], plan: SplitPlan | None) -> None:
        """Fetch `transfer` by `plan`: in ranges, or as one stream."""
        if plan is None or plan.total < self.split_above:
            # Below --split-above one plain stream, hashed as it arrives: no resume
            # record, no pieces; such a file is not resumed, fetching it again costs little.
            self.pending.append(transfer)
            return
        state, name = transfer[0], transfer[1]
        try:
            opened = resume.open_partial(self.fetcher.sink, name, plan)
        except SinkFailure as exc:
            self.fetcher._fail(state, name, str(exc), transfer[3], transfer[2], in_gate=False)
            return
        if opened is None:  # the null sink keeps nothing, or the same name is in flight
            self.pending.append(transfer)
            return
        spool, record = opened
        if record is not None:
            self._begin(RangedFile.resumed(transfer, spool, plan, self.parts, record.parts),
                        record)
        else:
            self._begin(RangedFile(transfer, spool, plan, self.parts))

    def resume(self, transfer: tuple[Any, ...]) -> bool:
        """Start `transfer` from the partial file a killed run left, asking only for the
        missing bytes, if its record is there (else False: fetch it as usual)."""
        name = transfer[1]
        self.partials.discard(name)  # one partial file, one transfer
        try:
            opened = resume.open_partial(self.fetcher.sink, name, None)
        except SinkFailure:
            return False
        if opened is None:
            return False
        spool, record = opened
        if record is None:
            spool.discard()
            return False
        stated = {algorithm: bytes.fromhex(value) for algorithm, value in record.digests}
        pinned = self.fetcher.pin_of(transfer)
        if pinned is not None and pinned.contradicts(record.total, stated) is not None:
            spool.discard()  # another file than the one listed now: start it over
            return False
        plan = SplitPlan(record.total, record.validator, stated).pin(pinned)
        self._begin(RangedFile.resumed(transfer, spool, plan, self.parts, record.parts), record)
        return True

    def _begin(self, ranged: RangedFile, record: resume.PartialRecord | None = None) -> None:
        """Start `ranged`, a new file or one `record` left."""
        ranged.in_line = self.hash_in_line
        ranged.take_digests(self.fetcher.verify, self.fetcher.sink.needs_md5)
        ranged.recorded = ranged.written
        ranged.recorded_at = ranged.durable_at = time.monotonic()
        if record is not None:
            ranged.durable = record.parts if record.durable is None else record.durable
            ranged.carried = ranged.written
        self.ranged.add(ranged)
        self.pending.extend((*ranged.transfer, part) for part in ranged.hand_out())

    def start_some(self) -> None:
        free, pending, sized, active = self.fetcher.free, self.pending, self.sized, self.active
        gate = self.fetcher.gate
        while free and (pending or sized) and len(active) < self.slots:
            transfer = pending.popleft() if pending else sized.popleft()
            if gate is not None and not gate.admit(transfer, big=True):
                continue
            if len(transfer) == 5:
                if isinstance(transfer[4], LayoutProbe):
                    self._start_probe(transfer)
                elif not transfer[4].file.cancelled:
                    self._start_part(transfer)
                elif self.fetcher.windows is not None:  # let through, never started
                    gate.done(transfer[2])  # type: ignore[union-attr]
            else:
                self._start_stream(transfer)

    def _start_stream(self, transfer: tuple[Any, ...]) -> None:
        fetcher = self.fetcher
        try:
            spool = fetcher.sink.open_spool(transfer[1])
        except SinkFailure as exc:
            if fetcher.windows is not None:  # let through, never started
                fetcher.gate.done(transfer[2])  # type: ignore[union-attr]
            fetcher._fail(transfer[0], transfer[1], str(exc), transfer[3], transfer[2],
                          in_gate=False)
            return
        handle = fetcher.free.pop()
        body = spooling.SpooledBody(transfer, spool, fetcher.buffers[handle][1],
                                    pinned=fetcher.pin_of(transfer),
                                    part_size=self.layouts.sizes.get(transfer[1], 0),
                                    verify=fetcher.verify, keep_md5=fetcher.sink.needs_md5)
        spooling.prepare(handle, body.write)
        if fetcher.sign is not None:
            handle.setopt(pycurl.HTTPHEADER, fetcher.sign(transfer[2]))
        elif fetcher.request_headers is not None:
            # A cache's page (fetcher._page_headers): the handle may hold another item's
            # If-None-Match. A big body is asked for whole, unconditionally (the 200 that
            # sent it here said the kept one is out of date; or --spool-above 0).
            if fetcher.base_headers:
                handle.setopt(pycurl.HTTPHEADER, fetcher.base_headers)
            else:  # (setting an empty list would leave the last one in place)
                handle.unsetopt(pycurl.HTTPHEADER)
        self._add(handle, body, transfer)

    def _start_part(self, transfer: tuple[Any, ...]) -> None:
        part: Part = transfer[4]
        part.reset()
        handle = self.fetcher.free.pop()
        part.lines = self.fetcher.buffers[handle][1]
        spooling.prepare(handle, part.write)
        sign = self.fetcher.sign
        handle.setopt(pycurl.HTTPHEADER, part.headers() + (
            self.fetcher.base_headers if sign is None else sign(transfer[2])))
        self._add(handle, part, transfer)

    def _start_probe(self, transfer: tuple[Any, ...]) -> None:
        probe: LayoutProbe = transfer[4]
        handle = self.fetcher.free.pop()
        probe.lines = self.fetcher.buffers[handle][1]
        url, headers = self.fetcher.layout_request(transfer[2])  # type: ignore[misc]
        handle.setopt(pycurl.NOBODY, 1)
        handle.setopt(pycurl.MAXFILESIZE_LARGE, 0)  # (it is the part's Content-Length)
        handle.setopt(pycurl.HTTPHEADER, headers)
        self._add(handle, probe, transfer, url)

    def _add(self, handle: pycurl.Curl, body: spooling.SpooledBody | Part | LayoutProbe,
             transfer: tuple[Any, ...], url: str | None = None) -> None:
        self.active[handle] = body
        self.fetcher.transfer_of[handle] = transfer
        if self.pacing is not None:
            self.pacing.started(body, transfer[2])
        handle.setopt(_URL, transfer[2] if url is None else url)
        self.fetcher.multi.add_handle(handle)

    def _release(self, handle: pycurl.Curl) -> spooling.SpooledBody | Part | LayoutProbe:
        """Take `handle` out of the multi and back to a small-file handle, keeping what its
        attempt said (status, Retry-After, Content-Length) on the body. Its header lines
        stay until _free(): the body's checks read them."""
        fetcher = self.fetcher
        body = self.active.pop(handle)
        if self.pacing is not None:
            self.pacing.ended(handle, body)
        fetcher.multi.remove_handle(handle)
        chunks, lines = fetcher.buffers[handle]
        status = (body.status if body.started else 0) or handle.getinfo(pycurl.RESPONSE_CODE)
        body.status = status
        if status in (429, 503):
            body.retry_after = retry_after_seconds(header_value(lines, b"retry-after"))
        body.announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD_T)
        spooling.restore(handle, chunks, self.spool_above)
        if isinstance(body, LayoutProbe):
            handle.setopt(pycurl.HTTPGET, 1)  # (NOBODY 0 alone would leave it a HEAD)
        if not isinstance(body, spooling.SpooledBody):
            if fetcher.base_headers:  # the source's own headers stay (S3: signing)
                handle.setopt(pycurl.HTTPHEADER, fetcher.base_headers)
            else:
                handle.unsetopt(pycurl.HTTPHEADER)
        return body

    def _free(self, handle: pycurl.Curl) -> None:
        for buffer in self.fetcher.buffers[handle]:
            buffer.clear()
        self.fetcher.free.append(handle)

    # -- ending --------------------------------------------------------------------------
    def completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        transfer = self.fetcher.transfer_of[handle]
        body = self._release(handle)
        if self.fetcher.windows is not None:  # (its start was counted for its host)
            self.fetcher.gate.done(transfer[2])  # type: ignore[union-attr]
        try:
            if isinstance(body, LayoutProbe):
                self._go(transfer[:4], self.layouts.settled(transfer[1], body, error))
            elif self.fetcher.follows and body.status in REDIRECT_STATUSES:
                follow_big(self, transfer, body, header_value(self.fetcher.buffers[handle][1],
                                                              b"location"))
            elif isinstance(body, Part):
                self._part_completed(transfer, body, error)
            else:
                self._stream_completed(body, error)
        finally:
            self._free(handle)

    def _stream_completed(self, body: spooling.SpooledBody,
                          error: tuple[int, str] | None) -> None:
        fetcher, transfer = self.fetcher, body.transfer
        if isinstance(body.error, SinkFatal):
            body.spool.discard()
            raise body.error
        reason, retryable = attempt_failure(body, error, 200, transfer[2],
                                            fetcher.reauthorize)
        cut_otherwise = False
        if not reason:
            reason = body.mismatch(body.announced, fetcher.verify) or ""
            if reason and self.layouts.cut_otherwise(transfer[1], body.stated, body.other):
                reason, cut_otherwise = "", True
        if reason:
            body.spool.discard()
            fetcher._retry_or_fail(transfer, reason, retryable, body.retry_after, big=True)
            return
        # (after mismatch(): an empty body read its headers there)
        way = checked_way(body.stated) if fetcher.verify and not cut_otherwise else BY_SIZE
        self._store(transfer, body.spool, body.size, body.md5.hexdigest(), way)

    def _store(self, transfer: tuple[Any, ...], spool: Any, size: int, md5: str,
               way: int) -> bool:
        """Hand `spool` to the sink; False when the sink refused it (the file failed)."""
        state, name = transfer[0], transfer[1]
        self.layouts.forget(name)
        try:
            self.fetcher.sink.store_spool(state.page.seq, name, spool, size, md5)
        except SinkFailure as exc:
            self.fetcher._fail(state, name, str(exc), transfer[3], transfer[2], in_gate=False)
            return False
        self.fetcher.checked[way] += 1
        self.fetcher._stored(state, size)
        return True

    def _part_completed(self, transfer: tuple[Any, ...], part: Part,
                        error: tuple[int, str] | None) -> None:
        ranged = part.file
        if ranged.cancelled:
            return
        if isinstance(part.error, SinkFatal):
            self._drop(ranged)
            raise part.error
        if part.problem:  # the server cannot be trusted with ranges for this file
            self._drop(ranged)
            self.restarts += 1
            self.pending.append(ranged.transfer)
            return
        reason, retryable = attempt_failure(part, error, 206, ranged.transfer[2],
                                            self.fetcher.reauthorize)
        if not reason and part.written != part.end - part.start:
            reason = f"range of {part.written} bytes, asked {part.end - part.start}"
        if reason:
            attempt = transfer[3]
            if retryable and attempt <= self.fetcher.policy.retries:
                self.fetcher._retry_later((*ranged.transfer[:3], attempt + 1, part),
                                          attempt, part.retry_after, big=True)
                return
            self._drop(ranged)
            state, name = ranged.transfer[0], ranged.transfer[1]
            self.fetcher._fail(state, name, f"{reason} (bytes {part.start}-{part.end - 1})",
                               attempt, ranged.transfer[2], in_gate=False)
            return
        part.complete = True
        ranged.done += 1
        ranged.taken -= 1
        # its next piece first: a file under way keeps its connections, and its bytes
        # keep coming in order
        self.pending.extendleft((*ranged.transfer, piece) for piece in
                                reversed(ranged.hand_out()))
        self._hash_more(ranged, 0)

    def _hash_more(self, ranged: RangedFile, at_least: int) -> None:
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
        """Hash what came in order since, record what is durable, and store the files whose
        every part is in and hashed. The first two at most every POLL_S: a loop paced by
        a slow server turns many times a second, each time for a few kilobytes."""
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLL_S
            for ranged in self.ranged:
                self._hash_more(ranged, HASH_STEP)
                new = ranged.written - ranged.recorded
                if new >= CHECKPOINT_BYTES or (new >= CHECKPOINT_MIN and
                                               now - ranged.recorded_at >= CHECKPOINT_S):
                    # (one fsync at a time: while one runs, records say what is written)
                    self._checkpoint(ranged, durable=now - ranged.durable_at >= DURABLE_S
                                     and (ranged.recording is None or ranged.recording.done()))
        for ranged in [r for r in self.ranged if r.done == len(r.parts)
                       and r.hash_submitted == r.plan.total and r.idle()]:
            self.ranged.discard(ranged)
            try:
                if ranged.hash_job is not None:
                    ranged.hash_job.result()
            except OSError as exc:
                self._forget(ranged)
                raise SinkFatal(f"cannot read back {ranged.name}'s ranges: {exc}") from None
            reason = ranged.mismatch() if self.fetcher.verify else None
            way = checked_way(ranged.plan.stated) if self.fetcher.verify else BY_SIZE
            if reason and self.layouts.cut_otherwise(ranged.name, ranged.plan.stated,
                                                     ranged.other):
                reason, way = None, BY_SIZE
            if reason:
                self._forget(ranged)
                self.fetcher._retry_or_fail(ranged.transfer, reason, True, None, big=True)
                continue
            if not ranged.plan.stated:
                self.size_only += 1
            resume.remove(ranged.spool.dir_fd, ranged.spool.name)
            if self._store(ranged.transfer, ranged.spool, ranged.plan.total,
                           ranged.md5.hexdigest(), way):
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

    def nap(self) -> None:
        """Only big bodies are in flight. When they arrive slowly (a server that paces its
        connections sends a few kilobytes at a time), let their sockets fill for a moment,
        so that a turn of the loop moves hundreds of kilobytes, not one packet's worth
        (benchmarks/ranges.py, 1 GiB at 40 MB/s a connection, 8 parts: 4.75 s of CPU per
        GiB without the nap, 3.86 with it; session 11's results). Whether they are
        slow is judged every NAP_WINDOW_S by their bytes per second; a fast stream is never
        held back (its socket would fill and stall the sender)."""
        now = time.monotonic()
        if now - self.window_start >= NAP_WINDOW_S:
            # (a file's pieces follow each other on a connection: its bytes, not theirs)
            moved = sum(ranged.written for ranged in self.ranged) + sum(
                body.size for body in self.active.values()
                if isinstance(body, spooling.SpooledBody))
            if self.window_start:  # (the first window only begins)
                rate = (moved - self.last_moved) / (now - self.window_start)
                self.napping = 0 <= rate < NAP_BELOW_RATE * len(self.active)
            self.window_start, self.last_moved = now, moved
        if self.napping:
            time.sleep(NAP_S)

    def wait_hashing(self, timeout: float) -> bool:
        """Wait up to `timeout` for a hash or record job, when nothing else is in flight;
        False at once when none is running (the pieces left wait for a retry, or are about
        to be handed to the hashing thread)."""
        # Only jobs still running: a finished one (the last fsync's, long ago) would end
        # the wait at once, and the loop would spin beside the hashing thread it waits for
        # (on one core it took 70% of it: the last bytes of 4 GiB hashed 0.15 s later).
        jobs = [job for ranged in self.ranged for job in ranged.running()]
        if not jobs:
            return False
        from concurrent.futures import FIRST_COMPLETED, wait

        wait(jobs, timeout, FIRST_COMPLETED)
        return True

    def _drop(self, ranged: RangedFile) -> None:
        """Give up `ranged` and remove its spool. Its parts in flight stop at their next
        chunk and end as usual (taking their handles out here could leave one in the batch
        of completions being handled); parts not started are skipped."""
        ranged.cancelled = True
        self.ranged.discard(ranged)
        self._forget(ranged)

    def _forget(self, ranged: RangedFile) -> None:
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

    # -- watching and stopping -----------------------------------------------------------
    def in_flight(self) -> tuple[int, list[InFlight]]:
        """(bytes of big bodies on their way, (name, done, total) of each)."""
        entries: list[InFlight] = [(body.transfer[1], body.size, body.total)
                                   for body in self.active.values()
                                   if isinstance(body, spooling.SpooledBody)]
        entries += [(ranged.name, ranged.written, ranged.plan.total) for ranged in self.ranged]
        return sum(entry[1] for entry in entries), entries

    def abandon(self) -> None:
        for handle in list(self.active):
            body = self._release(handle)
            self._free(handle)
            if isinstance(body, spooling.SpooledBody):
                body.spool.discard()
        for ranged in list(self.ranged):  # kept for the rerun, with what is durable now
            self.ranged.discard(ranged)
            self._settle(ranged)
            self._checkpoint(ranged, durable=True, now=True)
            ranged.spool.close()
        self.pending.clear()
        self.sized.clear()

    def close(self) -> None:
        if self.hasher is not None:
            self.hasher.shutdown(wait=True)
            self.hasher = None
        if self.recorder is not None:
            self.recorder.shutdown(wait=True)
            self.recorder = None

