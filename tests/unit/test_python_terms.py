"""A Python caller's mistakes said in Python's terms: download(), stream() and Client name
build_options()' parameters (restart=True), not the CLI's flags (--restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

import bulkfetch
from bulkfetch.api import build_options, in_python_terms
from bulkfetch.dest.journal import Journal
from bulkfetch.errors import JournalMismatch, UsageError


@pytest.mark.parametrize(("cli", "python"), [
    ("Use --restart to start over", "Use restart=True to start over"),
    ("--max-delete limits --delete: add --sync --delete",
     "max_delete limits delete=True: add sync=True delete=True"),
    ("--no-verify turns checksums off", "verify=False turns checksums off"),
    ("--timeout must be positive", "total_timeout must be positive"),
    ("--page-size must be >= 1", "page_size must be >= 1"),
    ("--resume is not a flag", "--resume is not a flag"),  # no such parameter: as it was
])
def test_flags_become_parameters(cli: str, python: str) -> None:
    assert in_python_terms(cli) == python


def test_download_into_another_runs_dest_says_restart_true(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    earlier = build_options("http://127.0.0.1:9/one", dest)
    Journal.open(dest, earlier.fingerprint()).close()
    with pytest.raises(JournalMismatch) as caught:
        bulkfetch.download("http://127.0.0.1:9/two", dest, workers=1)
    assert "restart=True" in str(caught.value) and "--restart" not in str(caught.value)
    assert caught.value.differences  # (the error keeps its fields)


def test_a_bad_option_of_stream_and_client_is_said_in_python_terms() -> None:
    with pytest.raises(UsageError, match="retries must be >= 0") as caught:
        bulkfetch.stream("http://127.0.0.1:9", retries=-1)
    assert "--retries" not in str(caught.value)
    with pytest.raises(UsageError) as caught:
        bulkfetch.Client(concurrency="lots")
    assert "--concurrency" not in str(caught.value) and "concurrency" in str(caught.value)
