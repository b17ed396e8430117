"""PNG charts of a session: files/s per core of every row (bars) and the sweeps (lines).
matplotlib is imported only here, lazily, with the Agg backend: `bulkfetch --help` stays fast
and no display is needed. Each function returns None when the file was written, or the
one-line reason it was not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bulkfetch.bench.rows import Row

COLOURS = {"ceiling": "#9e9e9e", "design": "#e08a3c", "bulkfetch": "#2e7d32",
           "peer": "#4a78b5", "sweep": "#2e7d32"}
LABELS = {"ceiling": "server ceiling (wrk, one URL)", "design": "case study's designs",
          "bulkfetch": "bulkfetch", "peer": "peer tools"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def missing() -> str | None:
    """Why charts cannot be drawn here, or None."""
    try:
        _pyplot()
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench])"
    return None


def bar_chart(rows: list[Row], path: Path, title: str) -> str | None:
    if (reason := missing()) is not None:
        return reason
    plt = _pyplot()
    shown = [r for r in rows if r.sweep is None]
    if not shown:
        return "no rows to chart"
    figure, axes = plt.subplots(figsize=(10, 0.42 * len(shown) + 1.8), dpi=110)
    names = [r.name + ("*" if r.subset else "") + ("" if r.verified else " (NOT verified)")
             for r in shown]
    values = [r.files_per_s_per_core for r in shown]
    bars = axes.barh(range(len(shown)), values, color=[COLOURS[r.kind] for r in shown])
    axes.set_yticks(range(len(shown)), names)
    axes.invert_yaxis()
    top = max(values) if values else 1.0
    for bar, value in zip(bars, values, strict=True):
        axes.text(bar.get_width() + top * 0.01, bar.get_y() + bar.get_height() / 2,
                  f"{value:,.0f}", va="center", fontsize=8)
    axes.set_xlim(0, top * 1.15)
    axes.set_xlabel("files/s per client core (100-byte files; higher is better)")
    axes.set_title(title, fontsize=10)
    seen = {r.kind for r in shown}
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in LABELS if k in seen]
    axes.legend(handles, [LABELS[k] for k in LABELS if k in seen], loc="lower right",
                fontsize=8)
    if any(r.subset for r in shown):
        figure.text(0.01, 0.005, "* ran on a proportional subset of the files", fontsize=7)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return None


def sweep_plot(rows: list[Row], sweep: str, path: Path, title: str) -> str | None:
    if (reason := missing()) is not None:
        return reason
    points = [r for r in rows if r.sweep == sweep]
    if not points:
        return f"no {sweep} sweep was measured"
    plt = _pyplot()
    xs = [(r.workers if sweep == "workers" else r.concurrency) or 0 for r in points]
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    axes.plot(xs, [r.files_per_s for r in points], marker="o", color=COLOURS["sweep"],
              label="files/s")
    for x, r in zip(xs, points, strict=True):
        axes.annotate(f"{r.files_per_s:,.0f}", (x, r.files_per_s), textcoords="offset points",
                      xytext=(0, 6), ha="center", fontsize=8)
    if sweep == "concurrency":
        axes.set_xscale("log", base=2)
        axes.set_xlabel("transfers in flight per worker (--concurrency), 1 worker")
    else:
        axes.set_xlabel("worker processes (--workers), 64 transfers each")
    axes.set_xticks(xs, [str(x) for x in xs])
    axes.set_ylabel("files/s (null sink)")
    axes.set_ylim(0, max(r.files_per_s for r in points) * 1.15)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return None
