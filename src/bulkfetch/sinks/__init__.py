"""Where fetched bodies go: a Sink per worker process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bulkfetch.config import SinkOptions
from bulkfetch.sinks.base import Sink, SinkFailure, SinkFatal
from bulkfetch.sinks.directory import DirectorySink
from bulkfetch.sinks.null import NullSink
from bulkfetch.sinks.stream import StreamSink
from bulkfetch.sinks.tar import TarSink


def sink_type(options: SinkOptions) -> type[Sink]:
    """The class of the sinks `options` ask for (its abilities are declared on it)."""
    if options.kind == "null":
        return NullSink
    if options.kind in ("stream", "stream-each"):
        return StreamSink
    if options.kind == "tar":
        return TarSink
    return DirectorySink


def open_sink(options: SinkOptions, dest: Path, worker: int, outbox: Any = None) -> Sink:
    """Worker `worker`'s sink; `outbox`, the worker's results channel, is where the stream
    kinds send bodies (bulkfetch.stream)."""
    kind = sink_type(options)
    if kind is StreamSink:
        return StreamSink(outbox, one_by_one=options.kind == "stream-each")
    if kind is TarSink:
        return TarSink(dest, worker, options.shard_files, options.shard_size)
    if kind is DirectorySink:
        return DirectorySink(dest, worker, options.fanout, options.fsync)
    return NullSink()


__all__ = ["DirectorySink", "NullSink", "Sink", "SinkFailure", "SinkFatal", "StreamSink", "TarSink",
           "open_sink", "sink_type"]
