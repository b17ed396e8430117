"""bulkfetch: download millions to billions of files as fast as hardware and server allow.

    report = bulkfetch.download("http://127.0.0.1:8000", "dest", workers=2)
    for name, body in bulkfetch.open_dataset("dest"): ...
"""

__version__ = "0.1.0"  # first: modules imported below read it

from bulkfetch.api import build_options, download
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.models import Failure, Progress, Report


def __getattr__(name: str) -> object:
    # open_dataset is imported on first use: `bulkfetch get` never needs the readers.
    if name == "open_dataset":
        from bulkfetch.dataset import open_dataset

        return open_dataset
    raise AttributeError(f"module 'bulkfetch' has no attribute {name!r}")


__all__ = [
    "BulkfetchError",
    "Failure",
    "Progress",
    "Report",
    "UsageError",
    "__version__",
    "build_options",
    "download",
    "open_dataset",
]
