"""bulkfetch bench: rows, ratios, the JSON record, the projection and the markdown tables."""

from __future__ import annotations

import math

import pytest

from bulkfetch.bench.rows import (
    Row,
    Skipped,
    best_bulkfetch,
    project,
    projection_line,
    record,
    reference_rates,
    skipped_record,
)
from bulkfetch.bench.table import files_cell, main_table, sweep_table
from bulkfetch.bench.verify import Check

REQUIRED = {"name", "files_per_s", "cpu_us_per_file", "peak_rss_mb", "verified"}


def row(name: str, kind: str, files: int, seconds: float, *, total: int = 10_000,
        cpu: float = 1.0, ok: bool = True, cores: int = 1, sweep: str | None = None,
        workers: int | None = None, concurrency: int | None = None) -> Row:
    return Row(name=name, kind=kind, files=files, total=total, seconds=seconds,
               cpu_seconds=cpu, peak_rss=50 * 2**20, cores=cores,
               check=Check(ok, "detail"), sweep=sweep, workers=workers,
               concurrency=concurrency)


def session() -> list[Row]:
    return [
        row("wrk", "ceiling", 100_000, 2.0, cpu=1.3),  # 50,000/s
        row("sync", "design", 500, 2.5),  # subset, 200/s
        row("combo", "design", 10_000, 5.0),  # 2,000/s
        row("bulkfetch-null-1w", "bulkfetch", 10_000, 0.25),  # 40,000/s
        row("bulkfetch-tar-1w", "bulkfetch", 10_000, 0.5, cpu=0.3),  # 20,000/s
        row("bulkfetch-dir-1w", "bulkfetch", 10_000, 1.0),  # 10,000/s
    ]


def test_derived_figures() -> None:
    r = row("bulkfetch-tar-2w", "bulkfetch", 10_000, 0.5, cpu=0.25, cores=2)
    assert r.files_per_s == 20_000
    assert r.files_per_s_per_core == 10_000
    assert r.cpu_us_per_file == pytest.approx(25.0)
    assert r.peak_rss_mb == 50.0
    assert not r.subset
    assert row("sync", "design", 500, 1.0).subset
    assert not row("wrk", "ceiling", 100, 1.0).subset  # requests, not a subset of files


def test_ratios_use_this_sessions_ceiling_and_combo() -> None:
    rows = session()
    ceiling, best = reference_rates(rows)
    assert (ceiling, best) == (50_000, 2_000)
    data = record(rows[4], ceiling, best)
    assert set(data) >= REQUIRED
    assert data["ratio_to_ceiling"] == 0.4
    assert data["ratio_to_best_design"] == 10.0
    assert data["verified"] is True
    assert data["cpu_us_per_file"] == 30.0


def test_an_unverified_reference_gives_no_ratio() -> None:
    rows = session()
    rows[2] = row("combo", "design", 10_000, 5.0, ok=False)
    _, best = reference_rates(rows)
    assert best is None
    assert record(rows[3], None, best)["ratio_to_best_design"] is None


def test_skipped_record_keeps_the_required_keys() -> None:
    data = skipped_record(Skipped("rclone", "rclone is not installed"))
    assert set(data) >= REQUIRED
    assert data["skipped"] == "rclone is not installed"
    assert data["verified"] is None


def test_projection_arithmetic() -> None:
    p = project(row("bulkfetch-tar-1w", "bulkfetch", 10_000, 0.5))  # 20,000 files/s per core
    assert p.hours_one_core == pytest.approx(1e9 / 20_000 / 3600)  # 13.9 h
    assert p.hours_case_study_cores == pytest.approx(p.hours_one_core / 16)
    two = project(row("bulkfetch-tar-2w", "bulkfetch", 10_000, 0.5, cores=2))
    assert two.per_core == 10_000 and two.hours_one_core == pytest.approx(2 * p.hours_one_core)
    assert math.isinf(project(row("x", "bulkfetch", 0, 1.0)).hours_one_core)


def test_projection_takes_the_best_row_that_keeps_the_files() -> None:
    rows = session()
    assert best_bulkfetch(rows).name == "bulkfetch-tar-1w"  # null is faster but keeps nothing
    line = projection_line(rows)
    assert line.startswith("One billion files at bulkfetch-tar-1w's 20,000 files/s per client")
    assert "13.9 hours on 1 core, 0.87 hours on a 16-core client" in line
    assert "8.4 hours on 16 cores" in line
    only_null = [r for r in rows if "-null-" in r.name or r.kind != "bulkfetch"]
    assert best_bulkfetch(only_null).name == "bulkfetch-null-1w"
    assert projection_line([r for r in rows if r.kind != "bulkfetch"]).startswith("No verified")
    unverified = [row("bulkfetch-tar-1w", "bulkfetch", 10, 1.0, ok=False)]
    assert best_bulkfetch(unverified) is None


def test_main_table() -> None:
    text = main_table(session(), [Skipped("aria2c", "aria2c is not installed")], "Title")
    lines = text.splitlines()
    assert lines[0] == "Title"
    assert lines[2].startswith("| row | files | files/s | files/s per core | CPU µs/file |")
    assert len(lines) == 4 + 6 + 1
    wrk = lines[4]
    assert wrk.startswith("| wrk | 100,000 requests | 50,000 | 50,000 |")
    sync = next(line for line in lines if line.startswith("| sync "))
    assert "| 500 (subset 1/20) | 200 | 200 | 2,000.0 |" in sync
    assert "| 0.00 | 0.10 | yes: detail |" in sync
    tar = next(line for line in lines if line.startswith("| bulkfetch-tar-1w "))
    assert "| 0.40 | 10.00 |" in tar
    assert lines[-1] == "| aria2c | — | — | — | — | — | — | — | skipped: aria2c is not installed |"


def test_table_without_references_shows_dashes() -> None:
    rows = [r for r in session() if r.name not in ("wrk", "combo")]
    line = main_table(rows, [], "T").splitlines()[4]
    assert line.endswith("| — | — | yes: detail |")


def test_files_cell() -> None:
    assert files_cell(row("asyncio", "design", 2_500, 1.0)) == "2,500 (subset 1/4)"
    assert files_cell(row("combo", "design", 10_000, 1.0)) == "10,000"


def test_sweep_tables_leave_the_main_table() -> None:
    rows = [*session(),
            row("bulkfetch-null-1w-c64", "sweep", 10_000, 0.5, sweep="workers", workers=1,
                concurrency=64),
            row("bulkfetch-null-2w-c64", "sweep", 10_000, 0.4, sweep="workers", workers=2,
                concurrency=64),
            row("bulkfetch-null-1w-c4", "sweep", 10_000, 1.0, sweep="concurrency", workers=1,
                concurrency=4)]
    assert "-c64" not in main_table(rows, [], "T")
    workers = sweep_table(rows, "workers").splitlines()
    assert workers[0] == "Sweep of workers (bulkfetch, null sink, 10,000 files each):"
    assert workers[4].startswith("| 1 | 20,000 |") and workers[5].startswith("| 2 | 25,000 |")
    concurrency = sweep_table(rows, "concurrency").splitlines()
    assert concurrency[4].startswith("| 4 | 10,000 |")
    assert sweep_table(session(), "workers") == ""
