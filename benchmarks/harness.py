"""What the benchmark scripts share; the code lives in `bulkfetch.bench.harness` (used by
`bulkfetch bench` too) and is re-exported here so the scripts import it as before."""

from __future__ import annotations

import os
import sys

try:
    import bulkfetch.bench.harness  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.bench.harness import (
    CLOCK_TICKS,
    Measured,
    Pinning,
    Server,
    TreeMemory,
    alternating_rounds,
    bulkfetch_command,
    cached_export,
    export_for_nginx,
    fit_open_file_cache,
    free_port,
    log,
    per_file,
    pinning,
    report_verified,
    run_measured,
    settle,
    start_nginx,
    start_reference,
    tree_cpu_seconds,
    tree_pids,
)
from bulkfetch.bench.scratch import FreshFilesystems
from bulkfetch.bench.stats import median_interval, verdict


def pages_done(dest: str | os.PathLike[str]) -> int:
    """Pages the journal of DEST holds done (0 while it cannot be read yet)."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{dest}/.bulkfetch/journal.sqlite?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM pages WHERE status = 'done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


__all__ = [
    "CLOCK_TICKS",
    "FreshFilesystems",
    "Measured",
    "Pinning",
    "Server",
    "TreeMemory",
    "alternating_rounds",
    "bulkfetch_command",
    "cached_export",
    "export_for_nginx",
    "fit_open_file_cache",
    "free_port",
    "log",
    "median_interval",
    "pages_done",
    "per_file",
    "pinning",
    "report_verified",
    "run_measured",
    "settle",
    "start_nginx",
    "start_reference",
    "tree_cpu_seconds",
    "tree_pids",
    "verdict",
]
