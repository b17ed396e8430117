"""bulkfetch: download millions to billions of files as fast as hardware and server allow."""

from bulkfetch.errors import BulkfetchError, UsageError

__version__ = "0.1.0"

__all__ = ["BulkfetchError", "UsageError", "__version__"]
