"""A worker process: pages from the task queue into its Fetcher; reports and ticks back."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.engine.fetcher import Fetcher
from bulkfetch.models import PageReport
from bulkfetch.net.curl import FatalTransferError
from bulkfetch.sinks import SinkFatal, open_sink
from bulkfetch.sources import make_source

TICK_S = 0.1
# On a stop, seconds spent finishing the pages already in hand, by sink: a tar shard with an
# unfinished page must be dropped whole, a directory keeps every file already renamed.
STOP_GRACE_S = {"tar": 10.0}


def worker_main(worker: int, options: GetOptions, tasks: Any, results: Any, stop: Any,
                parent_pid: int, *, own_signals: bool = True,
                share: Callable[[], Sequence[float]] | None = None) -> None:
    """Fetch the pages `tasks` gives (None: no more) until told to `stop` or the process
    whose pid is `parent_pid` is gone; everything said goes to `results`. `own_signals`:
    this is the process's main thread (a worker process), not a thread of a Ray actor.
    `share`: this worker's fractions of --limit-rate and --max-rps now, as the coordinator
    moves them (runners/rate_shares.py), read with each tick."""
    if own_signals:  # the main process owns Ctrl-C and SIGTERM: it stops us through `stop`
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sink = open_sink(options.sink, Path(options.dest), worker, results)
    fetcher = Fetcher(options, make_source(options, listing=False), sink, worker)
    no_more_pages = False
    stop_by: float | None = None  # when stopping: give up on the pages in hand at this time
    last_tick = 0.0

    def send_reports(reports: list[PageReport]) -> None:
        # One message for both: how many pages finished fetching (the coordinator may send
        # that many more) and the reports that became durable.
        fetched = fetcher.take_fetched()
        if fetched or reports:
            results.put(("pages", fetched, reports))

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
            send_reports(fetcher.step(0.05))
            now = time.monotonic()
            if now - last_tick >= TICK_S:
                # Checked with the tick, not every loop: the loop runs once per few files.
                orphaned = os.getppid() != parent_pid
                if stop_by is None and (stop.is_set() or orphaned):
                    # Finishing the pages in hand saves a tar shard from being dropped. Not
                    # for a Ray actor whose node's raylet is gone: the driver has given its
                    # pages to others, and settles its shards, as soon as it sees it lost.
                    grace = 0.0 if orphaned and not own_signals else STOP_GRACE_S.get(
                        options.sink.kind, 0.0)
                    stop_by = now + grace
                    no_more_pages = True
                send_reports(sink.ready())
                if share is not None:
                    fetcher.set_rate_share(*share())
                results.put(("tick", fetcher.tick()))
                last_tick = now
            if stop_by is not None and now >= stop_by:
                fetcher.abandon()
                break
            if no_more_pages and fetcher.idle:
                break
        send_reports(sink.flush())
    except SinkFatal as exc:
        fetcher.abandon()
        # What became durable before the failure still counts: the fetcher's reports not
        # yet taken (the failure cut its step short) and the sink's from before it.
        send_reports(fetcher.take_finished() + exc.released)
        results.put(("fatal", str(exc)))
    except FatalTransferError as exc:  # a refused certificate: the user must act (exit 2)
        fetcher.abandon()
        # The pages in hand stay not done; what the sink made durable before still counts.
        released = fetcher.take_finished()
        try:
            released += sink.flush()
        except SinkFatal as sink_exc:
            released += sink_exc.released
        send_reports(released)
        results.put(("fatal", str(exc), True))
    finally:
        results.put(("tick", fetcher.tick()))
        fetcher.close()
        sink.close()
        results.put(("exit", worker))
