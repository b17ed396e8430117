"""One error tree for everything bulkfetch raises on purpose."""

import errno


class BulkfetchError(Exception):
    """Base of every error bulkfetch raises deliberately."""


class FetchError(BulkfetchError):
    """One URL could not be fetched (after the retries the Client was given)."""

    def __init__(self, url: str, reason: str, attempts: int) -> None:
        # the attempts say why a refused connection took seconds to report: it was retried
        tried = f" ({attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{url}: {reason}{tried}")
        self.url = url
        self.reason = reason
        self.attempts = attempts


class UsageError(BulkfetchError):
    """A flag, argument or specification the user gave cannot be used (exit code 2)."""


class DestBusy(UsageError):
    """Another bulkfetch run holds DEST's lock (DEST/.bulkfetch/lock)."""

    def __init__(self, message: str, *, dest: object = None, pid: int | None = None) -> None:
        super().__init__(message)
        self.dest = dest
        self.pid = pid


class JournalMismatch(UsageError):
    """DEST's journal belongs to a different run (another source or output layout)."""

    def __init__(self, message: str, *, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences  # "key: old vs new" lines


class JournalCorrupt(UsageError):
    """DEST/.bulkfetch/journal.sqlite is unreadable or not a journal this version can use."""


class NoJournal(UsageError):
    """`bulkfetch status DEST`: DEST has no journal."""


# What an OSError says when the path itself cannot be written (read-only storage,
# permissions, a file where a directory must be): a rerun fails the same way.
NOT_WRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR})


class DestNotWritable(UsageError):
    """DEST (or its DEST/.bulkfetch) cannot be made or written here: read-only storage,
    permissions, a file where a directory must be. A rerun cannot help; the user can."""


class JournalIOError(BulkfetchError):
    """The journal could not be created or written (disk full, I/O error, permissions)."""


class TokenLoop(BulkfetchError):
    """The server's pagination returned a token that an earlier page already had."""

    def __init__(self, message: str, *, seq: int = -1, first_seq: int = -1) -> None:
        super().__init__(message)
        self.seq = seq  # the page whose token repeats
        self.first_seq = first_seq  # the page that had it first


class DataUnreadable(BulkfetchError):
    """A stored file cannot be read back (its shard is missing, unreadable or too short)."""

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name  # the member's name in the data set


class DataCorrupt(DataUnreadable):
    """A stored file's bytes differ from what the index recorded (MD5 or bounds): the shard
    is damaged on disk, or the index was altered."""
