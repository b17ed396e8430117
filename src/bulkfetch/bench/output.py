"""What a session leaves behind: the markdown on stdout, and in the results directory
table.md, results.json, chart.png, sweep-workers.png, sweep-concurrency.png, machine.txt."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bulkfetch.bench import machine, plots
from bulkfetch.bench.rows import (
    BEST_DESIGN,
    CEILING,
    Row,
    projection_line,
    record,
    reference_rates,
    skipped_record,
)
from bulkfetch.bench.session import Outcome
from bulkfetch.bench.table import main_table, sweep_table

SWEEPS = ("workers", "concurrency")


def default_out(quick: bool, environ: Mapping[str, str] | None = None,
                today: datetime.date | None = None) -> Path:
    """$XDG_CACHE_HOME/bulkfetch/bench/<date>-<machine>[-quick] (~/.cache when unset or not
    absolute, as the XDG spec says): outside any checkout, so a session never leaves
    untracked files in the project; `--out` records one where it should be kept."""
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(env.get("HOME") or Path.home(), ".cache")
    name = machine.slug(today) + ("-quick" if quick else "")
    return Path(cache) / "bulkfetch" / "bench" / name


def records(outcome: Outcome) -> list[dict[str, Any]]:
    ceiling, best = reference_rates(outcome.rows)
    return ([record(r, ceiling, best) for r in outcome.rows]
            + [skipped_record(s) for s in outcome.skipped])


def definitions(rows: list[Row]) -> str:
    return (f"files/s per core: files/s ÷ the client's cores ({rows[0].cores if rows else 1}); "
            f"CPU µs/file: user + sys of the client's whole process tree; × ceiling: files/s ÷ "
            f"{CEILING}'s requests/s on one URL; × {BEST_DESIGN}: files/s ÷ the case study's "
            f"best design (processes × asyncio, only tokens cross processes) in this run; "
            f"verified: file count and MD5s of a sample against the export.")


def markdown(outcome: Outcome, chart_notes: list[str]) -> str:
    """Everything printed on stdout; the projection is the closing line."""
    parts = [main_table(outcome.rows, outcome.skipped, outcome.title), ""]
    for sweep in SWEEPS:
        text = sweep_table(outcome.rows, sweep)
        if text:
            parts += [text, ""]
    notes = [definitions(outcome.rows), *outcome.notes, *chart_notes]
    parts += [f"- {note}" for note in notes]
    parts += ["", projection_line(outcome.rows)]
    return "\n".join(parts)


def write(outcome: Outcome, out: Path, json_path: Path | None) -> tuple[str, list[str]]:
    """Write the results directory (and `json_path`); returns (stdout text, files written)."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    chart_notes: list[str] = []
    title = outcome.title.split(";")[0]
    reason = plots.bar_chart(outcome.rows, out / "chart.png", title)
    if reason is None:
        written.append("chart.png")
    else:
        chart_notes.append(f"chart skipped: {reason}")
    for sweep in SWEEPS:
        if not any(r.sweep == sweep for r in outcome.rows):
            continue
        name = f"sweep-{sweep}.png"
        reason = plots.sweep_plot(outcome.rows, sweep, out / name,
                                  f"bulkfetch, null sink: files/s against {sweep} "
                                  f"({outcome.placement})")
        if reason is None:
            written.append(name)
        else:
            chart_notes.append(f"{name} skipped: {reason}")
    text = markdown(outcome, chart_notes)
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    data = json.dumps(records(outcome), indent=1, ensure_ascii=False) + "\n"
    (out / "results.json").write_text(data, encoding="utf-8")
    (out / "machine.txt").write_text(machine.describe(outcome.placement), encoding="utf-8")
    written += ["table.md", "results.json", "machine.txt"]
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(data, encoding="utf-8")
    return text, written
