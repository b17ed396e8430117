"""bulkfetch: download millions to billions of files as fast as hardware and server allow.

    report = bulkfetch.download("http://127.0.0.1:8000", "dest", workers=2)
"""

__version__ = "0.1.0"  # first: modules imported below read it

from bulkfetch.api import build_options, download
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.models import Failure, Progress, Report

__all__ = [
    "BulkfetchError",
    "Failure",
    "Progress",
    "Report",
    "UsageError",
    "__version__",
    "build_options",
    "download",
]
