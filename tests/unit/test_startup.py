"""Start-up: a quiet or logged `get` loads only what it uses.

rich's console and tables, email.utils and concurrent.futures together were about a third of
bulkfetch's own import time; runs that never draw a live display or a summary table, parse
an HTTP-date Retry-After or close a tar shard must not pay for them.
"""

from __future__ import annotations

import subprocess
import sys

LATE = ("rich.console", "rich.live", "rich.table", "email.utils", "concurrent.futures")

PROBE = f"""
import io, sys
import bulkfetch.cli, bulkfetch.cli.get, bulkfetch.runners.local, bulkfetch.sinks.null
import bulkfetch.sinks.tar
from bulkfetch.net.curl import retry_after_seconds
from bulkfetch.models import Progress, Report
from bulkfetch.cli.progress import make_display
from bulkfetch.cli.report import stop_line, write_report
for quiet in (True, False):
    display = make_display(quiet=quiet, stream=io.StringIO())
    display.start(); display.update(Progress()); display.stop()
retry_after_seconds("120")
print(" ".join(sorted(m for m in sys.modules if m in {LATE!r})))
"""


def _loaded(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return set(done.stdout.split())


def test_a_quiet_or_logged_run_does_not_load_rich_tables_or_rare_helpers() -> None:
    assert _loaded(PROBE) == set()


def test_the_probe_sees_those_modules_once_they_are_used() -> None:
    # The same probe must be able to fail: using the summary and an HTTP-date loads them.
    used = PROBE.replace(
        'retry_after_seconds("120")',
        'retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT")\n'
        "from bulkfetch.cli.report import summary_table\n"
        "summary_table(Report(source='s', dest='d'))")
    assert {"rich.table", "email.utils"} <= _loaded(used)
