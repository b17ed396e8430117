"""A worker process: pages from the task queue into its Fetcher; reports and ticks back."""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.engine.fetcher import Fetcher
from bulkfetch.sinks import SinkFatal, open_sink
from bulkfetch.sources import make_source

TICK_S = 0.1


def worker_main(worker: int, options: GetOptions, tasks: Any, results: Any, stop: Any,
                parent_pid: int) -> None:
    # The main process owns Ctrl-C and SIGTERM: it stops us through `stop`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sink = open_sink(options.sink, Path(options.dest), worker)
    fetcher = Fetcher(options, make_source(options), sink, worker)
    no_more_pages = False
    last_tick = 0.0
    try:
        while True:
            while fetcher.wants_pages and not no_more_pages:
                try:
                    page = tasks.get(timeout=0.05) if fetcher.idle else tasks.get_nowait()
                except queue.Empty:
                    break
                if page is None:
                    no_more_pages = True
                else:
                    fetcher.add_page(page)
            for report in fetcher.step(0.05):
                results.put(("page", report))
            now = time.monotonic()
            if now - last_tick >= TICK_S:
                # Checked with the tick, not every loop: the loop runs once per few files.
                if stop.is_set() or os.getppid() != parent_pid:
                    fetcher.abandon()
                    break
                results.put(("tick", fetcher.tick()))
                last_tick = now
            if no_more_pages and fetcher.idle:
                break
    except SinkFatal as exc:
        fetcher.abandon()
        results.put(("fatal", str(exc)))
    finally:
        results.put(("tick", fetcher.tick()))
        fetcher.close()
        sink.close()
        results.put(("exit", worker))
