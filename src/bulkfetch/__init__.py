"""bulkfetch: download millions to billions of files as fast as hardware and server allow.

    report = bulkfetch.download("http://127.0.0.1:8000", "dest", workers=2)
    for name, body in bulkfetch.open_dataset("dest"): ...
    with bulkfetch.Client() as client:
        for url, body in client.get_many(urls): ...
    with bulkfetch.stream("http://127.0.0.1:8000/list", workers=2) as files:
        for name, body in files: ...
"""

__version__ = "0.1.0"  # first: modules imported below read it

from typing import TYPE_CHECKING

from bulkfetch.errors import BulkfetchError, UsageError

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers
    from bulkfetch.api import build_options, download
    from bulkfetch.models import Failure, Progress, Report


def __getattr__(name: str) -> object:
    # The library's entry points are imported on first use: the CLI's commands import what
    # they need, and `bulkfetch hash` or `status` never need the options of a download
    # (14 ms of every command's start-up).
    if name in ("build_options", "download"):
        from bulkfetch import api

        return getattr(api, name)
    if name in ("Failure", "Progress", "Report"):
        from bulkfetch import models

        return getattr(models, name)
    # open_dataset is imported on first use: `bulkfetch get` never needs the readers.
    if name == "open_dataset":
        from bulkfetch.dataset import open_dataset

        return open_dataset
    if name in ("Client", "FetchError"):  # the engine is imported only when used
        from bulkfetch import client

        return getattr(client, name)
    if name in ("stream", "Stream"):
        from bulkfetch import streaming

        return getattr(streaming, name)
    raise AttributeError(f"module 'bulkfetch' has no attribute {name!r}")


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
