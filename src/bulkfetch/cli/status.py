"""`bulkfetch status DEST [--json] [--watch]`: one look at DEST's run, or one every few
seconds until the run ends."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from bulkfetch.dest.journal_reader import Status, read_status, render_status
from bulkfetch.engine.resume import describe_partials


def _show(status: Status, dest: Path, as_json: bool, watch: bool) -> None:
    if as_json:
        found = status.as_json()
        found["partials"] = describe_partials(dest)[1:]
        click.echo(json.dumps(found, indent=None if watch else 1))
        return
    if watch and click.get_text_stream("stdout").isatty():
        click.clear()
    click.echo(render_status(status))
    for line in describe_partials(dest):
        click.echo(line)
    if watch:
        click.echo("")


def watch_status(dest: str, *, as_json: bool, watch: bool, interval: float) -> None:
    """Print DEST's status once, or with `watch` every `interval` seconds while a run holds
    DEST (then once more, its end). Ctrl-C ends the watch quietly."""
    path = Path(dest)
    try:
        while True:
            status = read_status(path)
            _show(status, path, as_json, watch)
            if not watch or status.state != "running":
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return
