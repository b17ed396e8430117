"""get's warning about a fixed --concurrency above the open-file limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkfetch.api import build_options
from bulkfetch.cli import get as cli_get
from bulkfetch.engine import adaptive


@pytest.mark.parametrize(("runner", "warned"), [("local", True), ("ray", False)])
def test_only_a_local_run_is_warned_about_this_machine_s_open_file_limit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        runner: str, warned: bool) -> None:
    monkeypatch.setattr(adaptive, "open_file_ceiling", lambda reserve=None: 100)
    options = build_options("http://127.0.0.1:1", tmp_path / "d", concurrency=500,
                            runner=runner)
    cli_get._warn_above_open_files(options)
    said = capsys.readouterr().err
    # a Ray actor on another node runs under that node's limit: this one says nothing of it
    assert ("--concurrency 500 is more than the open-file limit" in said) is warned, said
