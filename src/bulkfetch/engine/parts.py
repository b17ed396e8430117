"""A big file fetched as byte ranges into one spool file, over one or several connections.

When the first attempt at a body is stopped for being bigger than --spool-above, its
headers say whether ranges are safe: a 200 with a Content-Length, `Accept-Ranges: bytes`,
and a strong validator (ETag, else Last-Modified) that every range request sends back in
If-Range. The file is cut into pieces (piece_ranges: at least 16 MiB, at most 256 of them)
handed out in file order to --parts connections (a file under --split-above goes as one
plain stream instead, engine/big.py). Each piece is a transfer like a small file's: it takes
a handle, counts against --concurrency, and writes its bytes by offset (pwrite). A piece
that breaks off is retried from where it stopped, not from its start. A piece is trusted
only when the answer is a 206 whose Content-Range names exactly the range asked for; a 200
(the server ignores ranges, or the file changed and If-Range no longer matches) or any other
Content-Range restarts the file as one plain stream, so a file never mixes bytes of two
versions.

MD5 is sequential, and pieces in file order keep the bytes written from byte 0 on growing
at the whole file's rate. On a worker with no core to spare, the piece where that prefix
ends hashes its chunks as they come, on the loop's thread (no read back); what other pieces
wrote beyond it is read back from the page cache and hashed by one thread per worker while
the transfers go on. So a file over one connection costs what a plain stream costs, and one
over eight leaves little to hash once its last byte is in (a piece per connection at most,
not seven eighths of the file). When the machine has more cores than workers, the thread
hashes everything: the transfer and the hash run on two cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bulkfetch.dest.validators import kept_validator
from bulkfetch.engine.digests import (
    NoMd5,
    final_headers,
    final_status,
    md5_hasher,
    mismatch,
    new_hasher,
    stated_digests,
    strongest,
)
from bulkfetch.sinks.base import SinkFailure, SinkFatal
from bulkfetch.sinks.spool import FileSpool
from bulkfetch.sources.abilities import Pinned

READ_CHUNK = 1 << 20  # bytes read back per hash update
PIECE_MIN = 16 << 20  # bytes of a piece, unless the file has fewer per connection
PIECES_MAX = 256  # pieces of one file: its resume record stays small
CATCH_UP_MAX = 4 << 20  # bytes the loop's thread reads back to go on hashing in line


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """What the first response said about a file that may be fetched in ranges."""

    total: int
    validator: str  # sent back in If-Range
    stated: dict[str, bytes]  # the whole file's digests the response stated
    vouched_by: str = ""  # `stated` is what this vouches for (digests.Pinned), not the server
    # (ETag, Last-Modified) for get --sync to ask with later, when the response stated no
    # MD5 (dest/validators.py; a stated MD5 is kept in the sums instead)
    kept: tuple[str, str] | None = None

    def pin(self, pinned: Pinned | None) -> SplitPlan:
        """This plan with the digest the source vouches for in place of the server's."""
        if pinned is None or not pinned.algorithm:
            return self
        return SplitPlan(self.total, self.validator, pinned.stated(self.stated),
                         pinned.vouched_by, self.kept)


def split_plan(lines: list[bytes]) -> SplitPlan | None:
    """A plan when the response in `lines` allows fetching its file in ranges, else None."""
    if final_status(lines) != 200:
        return None
    headers = final_headers(lines)
    length = headers.get("content-length", "")
    if not length.isdigit() or int(length) == 0:
        return None
    if "bytes" not in headers.get("accept-ranges", "").lower():
        return None
    etag = headers.get("etag", "")
    validator = etag if etag.startswith('"') else headers.get("last-modified", "")
    if not validator:  # nothing would tell a changed file from the one we started
        return None
    stated = stated_digests(headers)
    return SplitPlan(int(length), validator, stated, kept=kept_for_sync(validator, stated))


def kept_for_sync(validator: str, stated: dict[str, bytes]) -> tuple[str, str] | None:
    """SplitPlan.kept: the If-Range validator, unless the server stated an MD5."""
    return None if "md5" in stated else kept_validator(validator)


def piece_ranges(total: int, connections: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) pieces covering `total` bytes in order: PIECE_MIN bytes or
    more, at most PIECES_MAX, and at least one per connection."""
    size = max(PIECE_MIN, -(-total // PIECES_MAX))
    size = max(1, min(size, -(-total // connections)))
    return [(start, min(start + size, total)) for start in range(0, total, size)]


@dataclass(slots=True, eq=False)
class RangedFile:
    """One file in pieces: where its bytes go, which pieces are out, how far it is hashed."""

    transfer: Any  # the file's transfer tuple (page state, name, url, attempt)
    spool: FileSpool
    plan: SplitPlan
    connections: int = 2  # pieces in flight at once
    parts: list[Part] = field(default_factory=list)  # the pieces, in file order
    done: int = 0  # pieces complete
    taken: int = 0  # pieces handed out and not complete (in flight or waiting to retry)
    cursor: int = 0  # pieces before it are complete or handed out
    cancelled: bool = False
    hash_submitted: int = 0  # bytes hashed, or handed to the hashing thread, from 0 on
    recorded: int = 0  # bytes written when the last record was made
    recorded_at: float = 0.0  # and when (time.monotonic())
    durable: Any = None  # the layout (resume.Layout) the last fsync made durable, when any
    durable_at: float = 0.0  # when that fsync was asked for (time.monotonic())
    hashing: Any = None  # the Future of the last job on the hashing thread (hash or record)
    recording: Any = None  # the Future of its last fsync and durable record (BigFiles.recorder)
    hash_job: Any = None  # the Future of the last hash job
    md5: Any = None  # set in __post_init__ (digests.md5_hasher)
    other: Any = None  # the strongest non-MD5 digest stated, when there is one
    in_line: bool = True  # hash where the hash stands in line; False: all on the thread
    carried: int = 0  # bytes a killed run's partial file held when this run took it up

    def __post_init__(self) -> None:
        self.take_digests(verify=True, keep_md5=False)
        other = strongest(self.plan.stated)
        if other is not None:
            self.other = new_hasher(other[0])
        self.parts = [Part(self, start, end) for start, end in
                      piece_ranges(self.plan.total, self.connections)]

    @classmethod
    def resumed(cls, transfer: Any, spool: FileSpool, plan: SplitPlan, connections: int,
                layout: tuple[tuple[int, int, int], ...]) -> RangedFile:
        """A file whose pieces `layout` ((start, end, bytes written)) a killed run left."""
        ranged = cls(transfer, spool, plan, connections)
        ranged.parts = []
        for start, end, written in layout:
            part = Part(ranged, start, end, written=written)
            part.begin = start + written
            part.complete = written == end - start
            ranged.done += part.complete
            ranged.parts.append(part)
        return ranged

    def layout(self) -> tuple[tuple[int, int, int], ...]:
        """(start, end, bytes written) of each piece: what a resume record holds."""
        return tuple((part.start, part.end, part.written) for part in self.parts)

    def hand_out(self) -> list[Part]:
        """The next pieces in file order, as many as connections are free."""
        out: list[Part] = []
        parts = self.parts
        while self.taken < self.connections and self.cursor < len(parts):
            part = parts[self.cursor]
            self.cursor += 1
            if not part.complete:
                self.taken += 1
                out.append(part)
        return out

    @property
    def name(self) -> str:
        return self.transfer[1]

    @property
    def written(self) -> int:
        return sum(part.written for part in self.parts)

    def hashable_end(self) -> int:
        """The end of what is written contiguously from byte 0 (parts write in order
        within themselves, so the first unfinished part adds its written prefix)."""
        end = 0
        for part in self.parts:
            if not part.complete:
                return part.start + part.written
            end = part.end
        return end

    def take_digests(self, verify: bool, keep_md5: bool) -> None:
        """Which digests to take: under --no-verify (not `verify`) none, so nothing is read
        back, but the MD5 a sink that records every body's (`keep_md5`) needs; that MD5
        too where a pinned SHA is the check."""
        pinned_other = bool(self.plan.vouched_by) and "md5" not in self.plan.stated
        self.md5 = md5_hasher(verify, keep_md5, pinned_other)
        if not verify:
            self.other = None

    def hash_region(self, start: int, end: int) -> None:
        """Bytes [start, end) of the spool into the hashers: on the hashing thread, or on
        the loop's to catch up (hashlib and pread release the GIL)."""
        hashers = [h for h in (self.md5, self.other) if h is not None
                   and not isinstance(h, NoMd5)]
        if not hashers:
            return
        offset = start
        while offset < end:
            chunk = os.pread(self.spool.fd, min(READ_CHUNK, end - offset), offset)
            if not chunk:
                raise OSError(0, f"the spool of {self.name} ended at byte {offset}")
            for hasher in hashers:
                hasher.update(chunk)
            offset += len(chunk)

    def hash_in_line(self, at: int, data: bytes) -> None:
        """`data`, just written at `at`, into the hashers when every byte before it is
        hashed: the hashing thread is idle and at most CATCH_UP_MAX bytes need reading back
        first. Else the thread hashes it later (BigFiles.poll)."""
        if self.hash_job is not None and not self.hash_job.done():
            return
        gap = at - self.hash_submitted
        if gap:
            if gap > CATCH_UP_MAX:
                return
            try:
                self.hash_region(self.hash_submitted, at)
            except OSError:
                return  # the thread meets it again and reports it
        self.md5.update(data)
        if self.other is not None:
            self.other.update(data)
        self.hash_submitted = at + len(data)

    def running(self) -> list[Any]:
        """The jobs of the hashing and the recording thread still running for this file."""
        return [job for job in (self.hashing, self.recording)
                if job is not None and not job.done()]

    def idle(self) -> bool:
        """No job of the hashing or the recording thread is left for this file."""
        return not self.running()

    def mismatch(self) -> str | None:
        """Why the complete file is not the one the server meant, or None."""
        return mismatch(self.plan.stated, self.md5, self.other, "the file's ranges",
                        self.plan.vouched_by)

    @property
    def checked_by_size_only(self) -> bool:
        return not self.plan.stated


@dataclass(slots=True, eq=False)
class Part:
    """One piece (a byte range) of a RangedFile, as one transfer attempt."""

    file: RangedFile
    start: int
    end: int  # exclusive
    lines: list[bytes] = field(default_factory=list)  # the handle's header lines
    written: int = 0  # bytes from `start` on, kept across attempts
    charged: float = 0  # of them, taken from --limit-rate's bucket (pacing.BigPacing)
    begin: int = 0  # where this attempt's range begins: start + written at its start
    status: int = 0
    problem: str = ""  # the answer cannot be trusted: the file restarts as one stream
    error: SinkFailure | SinkFatal | None = None
    retry_after: float | None = None
    announced: float = -1
    started: bool = False
    complete: bool = False

    def __post_init__(self) -> None:
        self.begin = self.start

    def reset(self) -> None:
        """Ready for another attempt, from where the last one stopped."""
        self.begin = self.start + self.written
        self.charged = self.written  # (a killed run's bytes came in that run)
        self.status = 0
        self.problem = ""
        self.error = None
        self.started = False

    def headers(self) -> list[str]:
        return [f"Range: bytes={self.begin}-{self.end - 1}",
                f"If-Range: {self.file.plan.validator}"]

    def write(self, data: bytes) -> int | None:
        """libcurl's write callback; 0 stops the transfer (see the module's docstring)."""
        if self.file.cancelled:  # another part made the file start over, or fail
            return 0
        if not self.started:
            self.started = True
            self.status = final_status(self.lines)
            if self.status == 200:
                self.problem = ("the server answered a range with the whole file (200): it "
                                "changed, or it does not serve ranges after all")
                return 0
            if self.status != 206:
                return 0  # judged by the status
            want = f"bytes {self.begin}-{self.end - 1}/{self.file.plan.total}"
            got = final_headers(self.lines).get("content-range", "")
            if got.lower() != want:
                self.problem = f"the server sent Content-Range {got!r} for {want!r}"
                return 0
        if self.written + len(data) > self.end - self.start:
            self.problem = f"the server sent more than the {self.end - self.start} bytes asked"
            return 0
        at = self.start + self.written
        file = self.file
        try:
            file.spool.write_at(data, at)
        except (SinkFailure, SinkFatal) as exc:
            self.error = exc
            return 0
        if file.in_line and self.start <= file.hash_submitted <= at:  # hashing stands here
            file.hash_in_line(at, data)
        self.written += len(data)
        return None
