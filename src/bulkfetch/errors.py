"""One error tree for everything bulkfetch raises on purpose."""


class BulkfetchError(Exception):
    """Base of every error bulkfetch raises deliberately."""


class UsageError(BulkfetchError):
    """A flag, argument or specification the user gave cannot be used (exit code 2)."""
