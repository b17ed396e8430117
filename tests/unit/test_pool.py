"""The local runner's ProcessPool, as the coordinator uses it."""

from __future__ import annotations

import time
from pathlib import Path

from bulkfetch.api import build_options
from bulkfetch.runners.pool import ProcessPool


def test_workers_that_exit_leave_nothing_to_read_not_an_end_of_file(tmp_path: Path) -> None:
    options = build_options("http://127.0.0.1:9", tmp_path / "dest", workers=2, sink="null")
    pool = ProcessPool(options)
    pool.start()
    pool.finish(stop_now=False)  # no pages: each worker says it exits
    exited: set[int] = set()
    deadline = time.monotonic() + 30
    while len(exited) < pool.size and time.monotonic() < deadline:
        exited |= {message[1] for message in pool.receive(0.2) if message[0] == "exit"}
    assert exited == {0, 1}
    pool.join()
    assert pool.all_gone() and pool.dead() is not None
    # the drain's last look, after every worker is gone: nothing, not EOFError
    assert pool.receive(0.05) == []
