"""The fetcher's big bodies: streamed to a spool as one transfer, or split into ranges.

A transfer lands here when libcurl stopped its in-memory attempt at --spool-above, or at
once: with --spool-above 0, and when its source gave a size (an S3 listing, a registry's
descriptor) above --spool-above and under --split-above (sized_streams). Its first
response decides (parts.split_plan): one stream into a spool (spooling.SpooledBody), or
pieces over --parts connections written by offset into one spool (parts.RangedFile, kept
by ranged.py until stored). Big transfers hold at most half the handles, so small files
keep moving beside them; a piece is one transfer like any other. An S3 object uploaded in
parts may be asked for its parts' layout first (layouts.py, a HEAD).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pycurl

from bulkfetch.config import GetOptions
from bulkfetch.dest.validators import http_validators
from bulkfetch.engine import resume, spooling
from bulkfetch.engine.digests import BY_SIZE, checked_way
from bulkfetch.engine.layouts import PartLayouts
from bulkfetch.engine.multipart import LayoutProbe
from bulkfetch.engine.pacing import BigPacing
from bulkfetch.engine.pages import PageState
from bulkfetch.engine.parts import Part, RangedFile, SplitPlan, kept_for_sync, split_plan
from bulkfetch.engine.ranged import RangedFiles
from bulkfetch.engine.transfers import Transfers
from bulkfetch.models import InFlight, Page
from bulkfetch.net.curl import attempt_failure, header_value, retry_after_seconds
from bulkfetch.net.redirects import REDIRECT_STATUSES
from bulkfetch.sinks.base import KeepsValidators, SinkFailure, SinkFatal

_URL = pycurl.URL
# see nap(): a 4 ms nap while the big bodies average under 64 MB/s each, judged every 0.1 s
NAP_S, NAP_BELOW_RATE, NAP_WINDOW_S = 0.004, 64 << 20, 0.1


AUTO_SLOTS = 32  # big streams in flight under --concurrency auto (see BigFiles.slots)

class BigFiles:
    def __init__(self, transfers: Transfers, options: GetOptions) -> None:
        self.transfers = transfers
        sink = transfers.sink
        # where the sink keeps them, a streamed body's validators when its ETag is not its MD5
        self.keep_validators = sink.keep_validators if isinstance(sink, KeepsValidators) \
            else None
        limits = options.limits
        self.spool_above = limits.spool_above
        self.split_above = limits.split_above
        self.parts = limits.parts
        # (state, name, url, attempt) of a stream, (..., part) of a range
        self.pending: deque[tuple[Any, ...]] = deque()
        self.active: dict[pycurl.Curl, spooling.SpooledBody | Part | LayoutProbe] = {}
        # Streams started at once (sized_streams), not first in memory to be stopped at
        # their headers: that costs a second request per file and, with the rest of its
        # body unread, its connection. Counted by the fetcher's wants_pages like its own
        # pending, so a worker takes no more pages than it can start.
        self.sized: deque[tuple[Any, ...]] = deque()
        # Streams in flight at once: half a fixed --concurrency; under auto, AUTO_SLOTS on
        # handles of their own beside the small transfers' window (which starts at a few
        # and judges itself by files/s: a split file's parts end too seldom for that).
        self.slots = AUTO_SLOTS if limits.adaptive else max(1, limits.concurrency // 2)
        self.last_moved = 0  # bytes of the big bodies in flight when the window began
        self.window_start = 0.0
        self.napping = False
        # Names with a partial file a killed run left (engine/resume.py): read once.
        self.partials = resume.names_with_records(Path(options.dest))
        # A core to spare (more than workers): the hashing thread hashes a ranged file
        # beside its transfers; else the loop hashes in line, which costs less CPU.
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.hash_in_line = (len(usable) if usable else os.cpu_count() or 1) <= limits.workers
        self.restarts = 0  # ranged files started over as one stream
        self.layouts = PartLayouts(transfers.layout_request if transfers.verify else None)
        self.ranged = RangedFiles(transfers, self.layouts, self._store)
        gate = transfers.gate
        # --limit-rate (engine/pacing.py); a gate made later (a Retry-After) has no rate
        self.pacing = BigPacing(gate) if gate is not None and gate.byte_rate > 0 else None

    # -- starting ------------------------------------------------------------------------
    def sized_streams(self, state: PageState, page: Page
                      ) -> Callable[[tuple[Any, ...]], bool] | None:
        """Whether a transfer of `page` (its page state `state`) starts as a stream at once
        (self.sized), or None when none of them does. Only when its source vouches for a
        size above --spool-above and under --split-above (a bigger one is asked for whole
        first: its headers decide about ranges), and the body's check needs nothing of the
        headers an in-memory attempt would bring: a vouched digest, or no layout to ask (S3
        parts, layouts.py). A conditional page's requests stay as they are. Such a stream
        checks its headers against what the source vouches for at its first chunk."""
        low = self.spool_above
        if not low or page.headers is not None:
            return None
        if self.transfers.pinned is None and not (page.sizes and max(page.sizes) > low):
            return None
        high, pin_of = self.split_above, self.transfers.pin_of
        asks_layout = self.layouts.request is not None

        def sized(transfer: tuple[Any, ...]) -> bool:
            pinned = pin_of(transfer)
            return (pinned is not None and low < pinned.size < high
                    and (bool(pinned.algorithm) or not asks_layout))
        return sized

    def too_big(self, transfer: tuple[Any, ...], lines: list[bytes]) -> None:
        """The in-memory attempt at `transfer` stopped at --spool-above; `lines` are its
        response's headers."""
        plan = split_plan(lines)
        pinned = self.transfers.pin_of(transfer)
        if pinned is not None and plan is not None:
            wrong = pinned.contradicts(plan.total, plan.stated)
            if wrong is not None:  # the wrong file, a lie, or changed: not worth a byte
                self.transfers.fail(transfer[0], transfer[1], wrong, transfer[3], transfer[2],
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
            opened = resume.open_partial(self.transfers.sink, name, plan)
        except SinkFailure as exc:
            self.transfers.fail(state, name, str(exc), transfer[3], transfer[2], in_gate=False)
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
            opened = resume.open_partial(self.transfers.sink, name, None)
        except SinkFailure:
            return False
        if opened is None:
            return False
        spool, record = opened
        if record is None:
            spool.discard()
            return False
        stated = {algorithm: bytes.fromhex(value) for algorithm, value in record.digests}
        pinned = self.transfers.pin_of(transfer)
        if pinned is not None and pinned.contradicts(record.total, stated) is not None:
            spool.discard()  # another file than the one listed now: start it over
            return False
        plan = SplitPlan(record.total, record.validator, stated,
                         kept=kept_for_sync(record.validator, stated)).pin(pinned)
        self._begin(RangedFile.resumed(transfer, spool, plan, self.parts, record.parts), record)
        return True

    def _begin(self, ranged: RangedFile, record: resume.PartialRecord | None = None) -> None:
        """Start `ranged`, a new file or one `record` left."""
        ranged.in_line = self.hash_in_line
        ranged.take_digests(self.transfers.verify, self.transfers.sink.needs_md5)
        self.ranged.add(ranged, record)
        self.pending.extend((*ranged.transfer, part) for part in ranged.hand_out())

    def start_some(self) -> None:
        transfers = self.transfers
        free, pending, sized, active = transfers.free, self.pending, self.sized, self.active
        gate = transfers.gate
        while free and (pending or sized) and len(active) < self.slots:
            transfer = pending.popleft() if pending else sized.popleft()
            if gate is not None and not gate.admit(transfer, big=True):
                continue
            if len(transfer) == 5:
                if isinstance(transfer[4], LayoutProbe):
                    self._start_probe(transfer)
                elif not transfer[4].file.cancelled:
                    self._start_part(transfer)
                elif transfers.windows is not None:  # let through, never started
                    gate.done(transfer[2])  # type: ignore[union-attr]
            else:
                self._start_stream(transfer)

    def _start_stream(self, transfer: tuple[Any, ...]) -> None:
        transfers = self.transfers
        try:
            spool = transfers.sink.open_spool(transfer[1])
        except SinkFailure as exc:
            if transfers.windows is not None:  # let through, never started
                transfers.gate.done(transfer[2])  # type: ignore[union-attr]
            transfers.fail(transfer[0], transfer[1], str(exc), transfer[3], transfer[2],
                           in_gate=False)
            return
        handle = transfers.free.pop()
        body = spooling.SpooledBody(transfer, spool, transfers.buffers[handle][1],
                                    pinned=transfers.pin_of(transfer),
                                    part_size=self.layouts.sizes.get(transfer[1], 0),
                                    verify=transfers.verify,
                                    keep_md5=transfers.sink.needs_md5)
        spooling.prepare(handle, body.write)
        if transfers.sign is not None:
            handle.setopt(pycurl.HTTPHEADER, transfers.sign(transfer[2]))
        elif transfers.request_headers is not None:
            # A cache's page (conditional.py): the handle may hold another item's
            # If-None-Match. A big body is asked for whole, unconditionally (the 200 that
            # sent it here said the kept one is out of date; or --spool-above 0).
            if transfers.base_headers:
                handle.setopt(pycurl.HTTPHEADER, transfers.base_headers)
            else:  # (setting an empty list would leave the last one in place)
                handle.unsetopt(pycurl.HTTPHEADER)
        self._add(handle, body, transfer)

    def _start_part(self, transfer: tuple[Any, ...]) -> None:
        part: Part = transfer[4]
        part.reset()
        transfers = self.transfers
        handle = transfers.free.pop()
        part.lines = transfers.buffers[handle][1]
        spooling.prepare(handle, part.write)
        sign = transfers.sign
        handle.setopt(pycurl.HTTPHEADER, part.headers() + (
            transfers.base_headers if sign is None else sign(transfer[2])))
        self._add(handle, part, transfer)

    def _start_probe(self, transfer: tuple[Any, ...]) -> None:
        probe: LayoutProbe = transfer[4]
        transfers = self.transfers
        handle = transfers.free.pop()
        probe.lines = transfers.buffers[handle][1]
        url, headers = transfers.layout_request(transfer[2])  # type: ignore[misc]
        handle.setopt(pycurl.NOBODY, 1)
        handle.setopt(pycurl.MAXFILESIZE_LARGE, 0)  # (it is the part's Content-Length)
        handle.setopt(pycurl.HTTPHEADER, headers)
        self._add(handle, probe, transfer, url)

    def _add(self, handle: pycurl.Curl, body: spooling.SpooledBody | Part | LayoutProbe,
             transfer: tuple[Any, ...], url: str | None = None) -> None:
        self.active[handle] = body
        self.transfers.transfer_of[handle] = transfer
        if self.pacing is not None:
            self.pacing.started(body, transfer[2])
        handle.setopt(_URL, transfer[2] if url is None else url)
        self.transfers.multi.add_handle(handle)

    def _release(self, handle: pycurl.Curl) -> spooling.SpooledBody | Part | LayoutProbe:
        """Take `handle` out of the multi and back to a small-file handle, keeping what its
        attempt said (status, Retry-After, Content-Length) on the body. Its header lines
        stay until _free(): the body's checks read them."""
        transfers = self.transfers
        body = self.active.pop(handle)
        if self.pacing is not None:
            self.pacing.ended(handle, body)
        transfers.multi.remove_handle(handle)
        chunks, lines = transfers.buffers[handle]
        status = (body.status if body.started else 0) or handle.getinfo(pycurl.RESPONSE_CODE)
        body.status = status
        if status in (429, 503):
            body.retry_after = retry_after_seconds(header_value(lines, b"retry-after"))
        body.announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD_T)
        spooling.restore(handle, chunks, self.spool_above)
        if isinstance(body, LayoutProbe):
            handle.setopt(pycurl.HTTPGET, 1)  # (NOBODY 0 alone would leave it a HEAD)
        if not isinstance(body, spooling.SpooledBody):
            if transfers.base_headers:  # the source's own headers stay (S3: signing)
                handle.setopt(pycurl.HTTPHEADER, transfers.base_headers)
            else:
                handle.unsetopt(pycurl.HTTPHEADER)
        return body

    def _free(self, handle: pycurl.Curl) -> None:
        for buffer in self.transfers.buffers[handle]:
            buffer.clear()
        self.transfers.free.append(handle)

    # -- ending --------------------------------------------------------------------------
    def completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        transfers = self.transfers
        transfer = transfers.transfer_of[handle]
        body = self._release(handle)
        if transfers.windows is not None:  # (its start was counted for its host)
            transfers.gate.done(transfer[2])  # type: ignore[union-attr]
        try:
            if isinstance(body, LayoutProbe):
                self._go(transfer[:4], self.layouts.settled(transfer[1], body, error))
            elif transfers.follows and body.status in REDIRECT_STATUSES:
                self._follow(transfer, body, header_value(transfers.buffers[handle][1],
                                                          b"location"))
            elif isinstance(body, Part):
                self._part_completed(transfer, body, error)
            else:
                self._stream_completed(body, error)
        finally:
            self._free(handle)

    def _follow(self, transfer: tuple[Any, ...], body: spooling.SpooledBody | Part,
                location: str | None) -> None:
        """A redirect the engine follows itself (Transfers.follows: requests carry the
        user's headers), for a big body (a SpooledBody: --spool-above 0, a retry from the
        listed URL) or a piece of one (a Part: a partial file resumed from its listed URL):
        asked again at the Location, with that host's headers, at most MAX_HOPS hops. A
        piece moves its whole file there."""
        ranged = body.file if isinstance(body, Part) else None
        if ranged is not None and ranged.cancelled:
            return
        if isinstance(body, spooling.SpooledBody):
            body.spool.discard()
        state, name, url, attempt = transfer[:4]
        target, why = self.transfers.hop(state, name, url, location)
        if target is None:
            if ranged is not None:
                self.ranged.drop(ranged)
            self.transfers.fail(state, name, why, attempt, url, in_gate=False)
            return
        if ranged is None:
            self.pending.appendleft((state, name, target, attempt))
            return
        ranged.transfer = (state, name, target, ranged.transfer[3])
        self.pending.appendleft((state, name, target, attempt, body))

    def _stream_completed(self, body: spooling.SpooledBody,
                          error: tuple[int, str] | None) -> None:
        transfers, transfer = self.transfers, body.transfer
        if isinstance(body.error, SinkFatal):
            body.spool.discard()
            raise body.error
        reason, retryable = attempt_failure(body, error, 200, transfer[2],
                                            transfers.reauthorize)
        cut_otherwise = False
        if not reason:
            reason = body.mismatch(body.announced, transfers.verify) or ""
            if reason and self.layouts.cut_otherwise(transfer[1], body.stated, body.other):
                reason, cut_otherwise = "", True
        if reason:
            body.spool.discard()
            transfers.retry_or_fail(transfer, reason, retryable, body.retry_after, big=True)
            return
        # (after mismatch(): an empty body read its headers there)
        way = checked_way(body.stated) if transfers.verify and not cut_otherwise else BY_SIZE
        # validators kept, as for a small body, when no MD5 was stated (the ETag is not one)
        self._store(transfer, body.spool, body.size, body.md5.hexdigest(), way,
                    None if "md5" in body.stated else http_validators(body.lines))

    def _store(self, transfer: tuple[Any, ...], spool: Any, size: int, md5: str,
               way: int, validators: tuple[str, str] | None = None) -> bool:
        """Hand `spool` to the sink; False when the sink refused it (the file failed).
        `validators`: (ETag, Last-Modified) of a body that stated no MD5, which the sink
        may keep for get --sync (dest/validators.py)."""
        state, name = transfer[0], transfer[1]
        transfers = self.transfers
        self.layouts.forget(name)
        try:
            transfers.sink.store_spool(state.page.seq, name, spool, size, md5)
        except SinkFailure as exc:
            transfers.fail(state, name, str(exc), transfer[3], transfer[2], in_gate=False)
            return False
        if validators is not None and self.keep_validators is not None:
            self.keep_validators(name, *validators)  # (before the page may end, just below)
        transfers.checked[way] += 1
        transfers.pages.stored(state, size)
        return True

    def _part_completed(self, transfer: tuple[Any, ...], part: Part,
                        error: tuple[int, str] | None) -> None:
        ranged = part.file
        if ranged.cancelled:
            return
        if isinstance(part.error, SinkFatal):
            self.ranged.drop(ranged)
            raise part.error
        if part.problem:  # the server cannot be trusted with ranges for this file
            self.ranged.drop(ranged)
            self.restarts += 1
            self.pending.append(ranged.transfer)
            return
        transfers = self.transfers
        reason, retryable = attempt_failure(part, error, 206, ranged.transfer[2],
                                            transfers.reauthorize)
        if not reason and part.written != part.end - part.start:
            reason = f"range of {part.written} bytes, asked {part.end - part.start}"
        if reason:
            attempt = transfer[3]
            if retryable and attempt <= transfers.policy.retries:
                transfers.retry_later((*ranged.transfer[:3], attempt + 1, part),
                                      attempt, part.retry_after, big=True)
                return
            self.ranged.drop(ranged)
            state, name = ranged.transfer[0], ranged.transfer[1]
            transfers.fail(state, name, f"{reason} (bytes {part.start}-{part.end - 1})",
                           attempt, ranged.transfer[2], in_gate=False)
            return
        part.complete = True
        ranged.done += 1
        ranged.taken -= 1
        # its next piece first: a file under way keeps its connections, and its bytes
        # keep coming in order
        self.pending.extendleft((*ranged.transfer, piece) for piece in
                                reversed(ranged.hand_out()))
        self.ranged.hash_more(ranged, 0)

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
            moved = sum(ranged.written for ranged in self.ranged.files) + sum(
                body.size for body in self.active.values()
                if isinstance(body, spooling.SpooledBody))
            if self.window_start:  # (the first window only begins)
                rate = (moved - self.last_moved) / (now - self.window_start)
                self.napping = 0 <= rate < NAP_BELOW_RATE * len(self.active)
            self.window_start, self.last_moved = now, moved
        if self.napping:
            time.sleep(NAP_S)

    # -- watching and stopping -----------------------------------------------------------
    def in_flight(self) -> tuple[int, list[InFlight]]:
        """(bytes of big bodies this run moved so far, not stored yet, (name, done, total) of
        each: a file resumed from a stopped run's partial file counts as done what it
        held, and only what came since as moved)."""
        entries: list[InFlight] = [(body.transfer[1], body.size, body.total)
                                   for body in self.active.values()
                                   if isinstance(body, spooling.SpooledBody)]
        entries += [(ranged.name, ranged.written, ranged.plan.total)
                    for ranged in self.ranged.files]
        carried = sum(ranged.carried for ranged in self.ranged.files)
        return sum(entry[1] for entry in entries) - carried, entries

    def abandon(self) -> None:
        for handle in list(self.active):
            body = self._release(handle)
            self._free(handle)
            if isinstance(body, spooling.SpooledBody):
                body.spool.discard()
        self.ranged.keep_for_rerun()
        self.pending.clear()
        self.sized.clear()

    def close(self) -> None:
        self.ranged.close()
