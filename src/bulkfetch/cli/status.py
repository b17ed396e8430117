"""`bulkfetch status DEST [--json] [--watch]`: one look at DEST's run, or one every few
seconds until the run ends."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from bulkfetch.dest.journal_reader import Status, read_status
from bulkfetch.engine.resume import describe_partials
from bulkfetch.util.redact import TEXT_LIMIT, safe_text


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


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _quoted(name: str) -> str:
    """A remote name quoted and escaped, cut to TEXT_LIMIT characters (a hostile listing
    can hold names of thousands)."""
    if len(name) <= TEXT_LIMIT:
        return repr(name)
    return f"{name[:TEXT_LIMIT]!r}… ({len(name):,} characters)"


def render_status(status: Status) -> str:
    t = status.totals
    state = status.state + (f" (pid {status.pid})" if status.pid else "")
    lines = [f"{status.dest}: {state}"]
    if "source" in status.fingerprint:
        lines.append(f"source: {status.fingerprint['source']}")
    listing = "complete" if t.listing_done else "not complete"
    lines.append(f"pages: {t.pages_done:,} of {t.pages_listed:,} listed done (listing {listing})")
    # "fetched": a --sync pass counts the files it found unchanged as ok, with no bytes
    lines.append(f"files: {t.files_ok:,} ok, {t.files_failed:,} failed, {t.files_listed:,} "
                 f"listed; {_size(t.bytes)} fetched")
    lines.append(f"started {_when(t.started_at)}, last update {_when(t.updated_at)}")
    if status.live is not None:
        lines += render_live(status.live)
    if status.last_error:
        lines.append(f"last error: {safe_text(status.last_error)}")
    if status.failures:
        lines.append(f"failures (first {len(status.failures)} of {t.files_failed:,}):")
        lines += [f"  {_quoted(f.name)}: {safe_text(f.reason)} ({f.attempts} attempts)"
                  for f in status.failures]
    retry = "rerun with --retry-failed to try the failed files again"
    if len(status.failures) == t.files_failed and all(
            f.refused for f in status.failures):
        retry = ("every failed file was refused before any request, for what the listing "
                 "says of it: a retry would refuse it again")
    hint = {"interrupted": "rerun the same command to resume",
            "finished with failures": retry,
            "empty": "nothing listed yet: rerun the same command to start"}.get(status.state)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def render_live(live: dict[str, Any]) -> list[str]:
    """A running run's own numbers (status.json): ahead of the journal's, which count a page
    only once all its files are stored."""
    def count(key: str) -> int:
        value = live.get(key)
        return value if isinstance(value, int) else 0

    lines = [f"now: {count('files_ok'):,} ok, {count('files_failed'):,} failed, "
             f"{_size(count('bytes'))}; {float(live.get('files_per_s') or 0):,.0f} files/s, "
             f"{_size(float(live.get('bytes_per_s') or 0))}/s over the last 10 s"]
    limit = count("concurrency")
    lines.append(f"in flight: {count('in_flight'):,}" + (f" (limit {limit:,})" if limit else "")
                 + f", retries {count('retries'):,}; updated "
                 f"{max(0.0, time.time() - float(live.get('updated_at') or 0)):.1f} s ago")
    hosts = live.get("hosts")
    if isinstance(hosts, dict) and len(hosts) > 1:
        shown = sorted(hosts.items(), key=lambda item: -int(item[1]))[:5]
        lines.append("in flight by host: " + ", ".join(f"{h} {n:,}" for h, n in shown))
    reasons = live.get("failures_by_reason")
    if isinstance(reasons, dict) and reasons:
        shown = sorted(reasons.items(), key=lambda item: -int(item[1]))
        lines.append("failed this run: " + ", ".join(f"{r} {n:,}" for r, n in shown))
    if live.get("metrics_url"):
        lines.append(f"metrics: {live['metrics_url']}")
    return lines
