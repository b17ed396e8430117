"""Where fetched bodies go: a Sink per worker process."""

from __future__ import annotations

from pathlib import Path

from bulkfetch.config import SinkOptions
from bulkfetch.sinks.base import Sink, SinkFailure, SinkFatal
from bulkfetch.sinks.directory import DirectorySink
from bulkfetch.sinks.null import NullSink
from bulkfetch.sinks.tar import TarSink


def open_sink(options: SinkOptions, dest: Path, worker: int) -> Sink:
    if options.kind == "null":
        return NullSink()
    if options.kind == "tar":
        return TarSink(dest, worker, options.shard_files, options.shard_size)
    return DirectorySink(dest, worker, options.fanout, options.fsync)


__all__ = ["DirectorySink", "NullSink", "Sink", "SinkFailure", "SinkFatal", "TarSink", "open_sink"]
