"""Where fetched bodies go: a Sink per worker process."""

from __future__ import annotations

from pathlib import Path

from bulkfetch.config import SinkOptions
from bulkfetch.sinks.base import Sink, SinkFailure, SinkFatal
from bulkfetch.sinks.directory import DirectorySink
from bulkfetch.sinks.null import NullSink


def open_sink(options: SinkOptions, dest: Path, worker: int) -> Sink:
    if options.kind == "null":
        return NullSink()
    return DirectorySink(dest, worker, options.fanout)


__all__ = ["DirectorySink", "NullSink", "Sink", "SinkFailure", "SinkFatal", "open_sink"]
