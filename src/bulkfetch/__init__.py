"""bulkfetch: download millions to billions of files as fast as hardware and server allow.

    report = bulkfetch.download("http://127.0.0.1:8000", "dest", workers=2)
    for name, body in bulkfetch.open_dataset("dest"): ...
    with bulkfetch.Client() as client:
        for url, body in client.get_many(urls): ...
    with bulkfetch.stream("http://127.0.0.1:8000/list", workers=2) as files:
        for name, body in files: ...
"""

from typing import TYPE_CHECKING

from bulkfetch._version import __version__
from bulkfetch.errors import BulkfetchError, UsageError

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers
    from bulkfetch.api import build_options, download
    from bulkfetch.models import Failure, Progress, Report


# Imported on first use, each from its module: `bulkfetch get` never needs the dataset
# readers, the CLI's commands import what they need (`bulkfetch hash` or `status` never the
# options of a download: 14 ms of start-up), and the engine only when it is used.
_LAZY = {"build_options": "api", "download": "api", "Failure": "models",
         "Progress": "models", "Report": "models", "open_dataset": "dataset",
         "Client": "client", "FetchError": "errors", "stream": "streaming",
         "Stream": "streaming"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bulkfetch' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"bulkfetch.{module}"), name)


__all__ = [
    "BulkfetchError",
    "Client",
    "Failure",
    "FetchError",
    "Progress",
    "Report",
    "UsageError",
    "__version__",
    "build_options",
    "download",
    "open_dataset",
    "stream",
]
