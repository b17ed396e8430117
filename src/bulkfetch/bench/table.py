"""The markdown the benchmark prints: the session's table, the sweeps' tables, the notes."""

from __future__ import annotations

from bulkfetch.bench.rows import BEST_DESIGN, Row, Skipped, ratio, reference_rates

HEADER = ("| row | files | files/s | files/s per core | CPU µs/file | peak RSS MB | × ceiling "
          f"| × {BEST_DESIGN} | verified |")
ALIGN = "|---|---:|---:|---:|---:|---:|---:|---:|---|"


def files_cell(row: Row) -> str:
    if row.kind == "ceiling":
        return f"{row.files:,} requests"
    if row.subset:
        return f"{row.files:,} (subset 1/{round(row.total / row.files)})"
    return f"{row.files:,}"


def times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def row_line(row: Row, ceiling: float | None, best: float | None) -> str:
    cpu = "—" if row.kind == "ceiling" and not row.files else f"{row.cpu_us_per_file:,.1f}"
    return (f"| {row.name} | {files_cell(row)} | {row.files_per_s:,.0f} | "
            f"{row.files_per_s_per_core:,.0f} | {cpu} | {row.peak_rss_mb:,.0f} | "
            f"{times(ratio(row.files_per_s, ceiling))} | {times(ratio(row.files_per_s, best))} "
            f"| {row.check} |")


def skipped_line(skipped: Skipped) -> str:
    return f"| {skipped.name} | — | — | — | — | — | — | — | skipped: {skipped.reason} |"


def main_table(rows: list[Row], skipped: list[Skipped], title: str) -> str:
    """The session's rows (sweep points excluded) in the order they ran, then skipped ones."""
    ceiling, best = reference_rates(rows)
    lines = [title, "", HEADER, ALIGN]
    lines += [row_line(r, ceiling, best) for r in rows if r.sweep is None]
    lines += [skipped_line(s) for s in skipped]
    return "\n".join(lines)


def sweep_table(rows: list[Row], sweep: str) -> str:
    points = [r for r in rows if r.sweep == sweep]
    if not points:
        return ""
    knob = "workers" if sweep == "workers" else "concurrency per worker"
    lines = [f"Sweep of {knob} (bulkfetch, null sink, {points[0].files:,} files each):", "",
             f"| {knob} | files/s | CPU µs/file | peak RSS MB | verified |",
             "|---:|---:|---:|---:|---|"]
    for r in points:
        value = r.workers if sweep == "workers" else r.concurrency
        lines.append(f"| {value} | {r.files_per_s:,.0f} | {r.cpu_us_per_file:,.1f} | "
                     f"{r.peak_rss_mb:,.0f} | {r.check} |")
    return "\n".join(lines)
