"""The lister of a tree of directories (a web server's directory listings): many directories
listed at once on one curl multi (listing/multi_gets.py), depth first, each directory's
files sent as pages (sources/tree.py) while the next directories are being listed.

Memory stays flat however large the tree: what waits to be listed is a stack, depth first,
so it holds the directories beside the ones being listed (levels x fan-out), never a
level's width. What was listed is the journal's: every page's token names its directory,
and a directory's first page names the subdirectories found in it. A rerun lists the
directories the journal names but holds no page of, the pages not done again (from their
own directory alone), and nothing else.

A directory that answers 404, 410, 401 or 403 below the top is not the run's end: it is
one failure, named in the report, and the crawl goes on. Any other failure is retried as
every list request is; one that outlasts the retries ends the listing (a rerun resumes).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bulkfetch.config import GetOptions, RetryPolicy
from bulkfetch.listing.lister import Listed, ListerThread, ListingFailed, ListingFinished
from bulkfetch.listing.multi_gets import Answer, MultiGets
from bulkfetch.sources.listed import ListedPage, ListingError
from bulkfetch.sources.tree import (
    DirPage,
    TreeSource,
    pages_of,
    parse_next,
    parse_token,
    refused_page,
    token,
)


@dataclass(slots=True)
class _Job:
    """One directory to list, and what its listing is for."""

    path: str
    fresh: bool = True  # never listed: send every page, go on into its subdirectories
    replays: list[tuple[int, str, str | None]] = field(default_factory=list)  # journaled
    missing_from: int = 0  # not fresh: its parts from this one on were never journaled
    attempt: int = 1
    found: DirPage | None = None  # listed, waiting for its checksum files
    digests: dict[str, str] = field(default_factory=dict)  # what those gave so far
    sums_waiting: int = 0


@dataclass(frozen=True, slots=True)
class _Sums:
    """A directory's checksum file, asked for before its pages go."""

    job: _Job
    item: str


def tree_concurrency(options: GetOptions) -> int:
    """Directory listings in flight: --list-concurrency (a crawl's own, CrawlOptions)."""
    return options.crawl.list_concurrency if options.crawl is not None else 8


def resume_plan(journaled: Sequence[tuple[str, str | None]]
                ) -> tuple[list[str], dict[str, int]]:
    """From the journal's (token, next token) of every page: the directories found and not
    listed (in the order found), and the directories listed whose later parts were never
    journaled (a run stopped between them), with the first part missing."""
    parts: dict[str, tuple[int, tuple[str, ...]]] = {}
    seen: dict[str, int] = {}  # parts journaled, by directory
    for text, next_text in journaled:
        path, part = parse_token(text)
        seen[path] = seen.get(path, 0) + 1
        if part == 0:
            dirs, count = parse_next(next_text)
            parts[path] = (count, dirs)
    if not parts:
        return [""], {}
    waiting = [child for count, dirs in parts.values() for child in dirs if child not in parts]
    unfinished = {path: seen[path] for path, (count, _) in parts.items() if seen[path] < count}
    return waiting, unfinished


def _merge(digests: dict[str, str], more: dict[str, str]) -> None:
    """`more` into `digests`: a SHA-256 ("sha256:...") is kept over an MD5 for one file,
    whichever checksum file came first."""
    for item, digest in more.items():
        if digest.startswith("sha256:") or not digests.get(item, "").startswith("sha256:"):
            digests[item] = digest


class TreeLister(ListerThread):
    def __init__(self, source: TreeSource, policy: RetryPolicy,
                 replay: list[tuple[int, str | None, str | None]],
                 journaled: Sequence[tuple[str, str | None]], start_seq: int,
                 list_more: bool, ahead: int, concurrency: int,
                 key_of: Callable[[str], str] | None = None) -> None:
        super().__init__("bulkfetch-tree-lister", ahead)
        self.source = source
        self.policy = policy
        self.replay = replay
        self.journaled = journaled
        self.seq = start_seq
        self.list_more = list_more
        self.key_of = key_of
        self.answers: queue.Queue[tuple[_Job | _Sums, Answer]] = queue.Queue()
        self.gets: MultiGets[_Job | _Sums] = MultiGets(
            source.list_handle, concurrency,
            lambda key, answer: self.answers.put((key, answer)), self.stopping,
            name="bulkfetch-tree-gets")
        self.concurrency = self.gets.concurrency
        self.stack: list[str] = []  # directories to list, the next one last
        self.busy = 0  # directories asked for and not answered (retries on a timer too)
        # Digests a checksum file gave for files in directories below its own ("sub/x" in
        # SHA256SUMS), taken when those are listed (a stronger digest wins: _merge)
        self.below: dict[str, str] = {}

    def _ended(self) -> None:
        self.gets.close()

    def _ask(self, job: _Job) -> None:
        self.busy += 1
        self.gets.ask(job, self.source.dir_url(job.path))

    def _run(self) -> None:
        self.gets.start()
        jobs: dict[str, _Job] = {}
        for seq, text, next_text in self.replay:
            assert text is not None
            path, _ = parse_token(text)
            jobs.setdefault(path, _Job(path, fresh=False)).replays.append(
                (seq, text, next_text))
        if self.list_more:
            waiting, unfinished = resume_plan(self.journaled)
            for path, first_missing in unfinished.items():
                job = jobs.setdefault(path, _Job(path, fresh=False))
                job.missing_from = first_missing
            self.stack = waiting[::-1]
        for job in jobs.values():
            self._ask(job)
        while not self.stopping.is_set():
            while self.stack and self.busy < self.concurrency:
                self._ask(_Job(self.stack.pop()))
            if self.busy == 0:
                self._put(ListingFinished())
                return
            try:
                job, answer = self.answers.get(timeout=0.1)
            except queue.Empty:
                continue
            self.busy -= 1
            if not self._take(job, answer):
                return

    def _take(self, key: _Job | _Sums, answer: Answer) -> bool:
        """Act on one answer; False when the listing ends here."""
        if isinstance(key, _Sums):
            return self._take_sums(key, answer)
        job, source = key, self.source
        try:
            if answer.error is not None:
                raise source.transfer_error(*answer.error, answer.url)
            found = source.dir_page(job.path, answer.status, list(answer.headers),
                                    answer.body, answer.url)
        except ListingError as exc:
            return self._failed(job, exc)
        self.answered = True
        if found.sums:  # its pages go with the digests these give
            job.found, job.sums_waiting = found, len(found.sums)
            for item in found.sums:
                self.busy += 1
                self.gets.ask(_Sums(job, item), source.file_url(item))
            return True
        return self._send_pages(job, found)

    def _take_sums(self, request: _Sums, answer: Answer) -> bool:
        """A checksum file's answer: one that fails or is no such file verifies nothing (the
        report counts those files as checked by size), and never stops the crawl."""
        job = request.job
        if answer.error is None:
            _merge(job.digests, self.source.read_sums(request.item, answer.status, answer.body))
        job.sums_waiting -= 1
        if job.sums_waiting:
            return True
        assert job.found is not None
        found, digests = job.found, job.digests
        job.found, job.digests = None, {}
        own = set(found.files)
        _merge(self.below, {item: digest for item, digest in digests.items()
                            if item not in own and item.startswith(job.path)})
        return self._send_pages(job, replace(found, digests=tuple(
            digests.get(item, "") for item in found.files)))

    def _send_pages(self, job: _Job, found: DirPage) -> bool:
        """Send directory `job.path`'s pages: what the job is for (see _Job)."""
        if self.below:  # a checksum file above named some of these files
            own = found.digests or ("",) * len(found.files)
            found = replace(found, digests=tuple(
                digest or self.below.pop(item, "")
                for item, digest in zip(found.files, own, strict=True)))
        pages = pages_of(job.path, found, self.key_of)
        for seq, text, _ in job.replays:
            part = parse_token(text)[1]
            page = pages[part][1] if part < len(pages) else refused_page(
                job.path, "the directory holds fewer files than when it was listed")
            if not self._put(Listed(seq, text, page, replay=True)):
                return False
        first = 0 if job.fresh else job.missing_from or len(pages)
        for _, page in pages[first:]:
            if not self._send(token(job.path, first), page):
                return False
            first += 1
        if job.fresh:
            self.stack.extend(reversed(found.dirs))  # depth first, in the listing's order
        return True

    def _send(self, text: str, page: ListedPage) -> bool:
        listed = Listed(self.seq, text, page)
        self.seq += 1
        return self._put(listed)

    def _failed(self, job: _Job, exc: ListingError) -> bool:
        if self.first_contact_failed(exc):
            self._put(ListingFailed(str(exc), usage=True))
            return False
        if exc.retryable and job.attempt <= self.policy.retries:
            delay = self.policy.delay(job.attempt, exc.retry_after_s, self.rng)
            job.attempt += 1
            self.busy += 1  # still out, on a timer
            timer = threading.Timer(delay, self._retry, args=(job,))
            timer.daemon = True
            timer.start()
            return True
        if not exc.retryable and job.path and job.fresh:
            # gone or forbidden below the top: one failure, and the crawl goes on
            return self._send(token(job.path, 0), refused_page(job.path, str(exc)))
        tries = f" after {job.attempt} attempts" if job.attempt > 1 else ""
        self._put(ListingFailed(f"{exc}{tries}", usage=exc.usage))
        return False

    def _retry(self, job: _Job) -> None:
        """On the timer's thread: ask again (the job was never taken off `busy`)."""
        if not self.stopping.is_set():
            self.gets.ask(job, self.source.dir_url(job.path))
