"""One benchmark row: what was run, what it measured, whether it was correct; and the pure
arithmetic over rows (ratios, the JSON record, the per-core projection)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bulkfetch.bench.verify import Check

BEST_DESIGN = "combo"  # the case study's best design: its row is the "× combo" reference
CEILING = "wrk"
CASE_STUDY_HOURS_16_CORES = 8.4  # one billion files, 16-core client, the combo design
CASE_STUDY_CORES = 16
BILLION = 1_000_000_000


@dataclass
class Row:
    name: str  # begins with the design or tool: sync, threads-10, bulkfetch-tar-2w, wrk ...
    kind: str  # ceiling | design | bulkfetch | peer | sweep
    files: int  # files this row fetched (for the ceiling: requests answered)
    total: int  # files of the session; files < total: a proportional subset
    seconds: float
    cpu_seconds: float  # user + sys of the client's whole process tree
    peak_rss: int  # bytes, summed over the tree
    cores: int  # client cores the row could use
    check: Check
    note: str = ""
    workers: int | None = None
    concurrency: int | None = None
    sweep: str | None = None  # "workers" or "concurrency" for sweep points
    command: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.check.ok

    @property
    def subset(self) -> bool:
        return self.kind != "ceiling" and self.files < self.total

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0

    @property
    def files_per_s_per_core(self) -> float:
        return self.files_per_s / max(1, self.cores)

    @property
    def cpu_us_per_file(self) -> float:
        return self.cpu_seconds / self.files * 1e6 if self.files else 0.0

    @property
    def peak_rss_mb(self) -> float:
        return self.peak_rss / 2**20


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


def ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def reference_rates(rows: list[Row]) -> tuple[float | None, float | None]:
    """(the ceiling's requests/s, the best design's files/s) of this session, when measured
    and verified."""
    def rate(name: str) -> float | None:
        found = [r for r in rows if r.name == name and r.verified and r.sweep is None]
        return found[0].files_per_s if found else None

    return rate(CEILING), rate(BEST_DESIGN)


def record(row: Row, ceiling: float | None, best: float | None) -> dict[str, Any]:
    """The row as JSON."""
    return {
        "name": row.name,
        "kind": row.kind,
        "files": row.files,
        "subset": row.subset,
        "session_files": row.total,
        "seconds": round(row.seconds, 3),
        "files_per_s": round(row.files_per_s, 1),
        "files_per_s_per_core": round(row.files_per_s_per_core, 1),
        "client_cores": row.cores,
        "cpu_us_per_file": round(row.cpu_us_per_file, 2),
        "peak_rss_mb": round(row.peak_rss_mb, 1),
        "ratio_to_ceiling": _round(ratio(row.files_per_s, ceiling)),
        "ratio_to_best_design": _round(ratio(row.files_per_s, best)),
        "verified": row.verified,
        "check": row.check.detail,
        "workers": row.workers,
        "concurrency": row.concurrency,
        "sweep": row.sweep,
        "note": row.note,
        "command": row.command,
    }


def skipped_record(skipped: Skipped) -> dict[str, Any]:
    return {"name": skipped.name, "skipped": skipped.reason, "files_per_s": None,
            "cpu_us_per_file": None, "peak_rss_mb": None, "verified": None}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- projection -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Projection:
    row: str
    per_core: float  # files/s per client core
    hours_one_core: float
    hours_case_study_cores: float


def project(row: Row, files: int = BILLION, cores: int = CASE_STUDY_CORES) -> Projection:
    """Hours for `files` at `row`'s files/s per client core, on 1 core and on `cores` cores
    (linear scaling: assumes the server and the network keep up)."""
    per_core = row.files_per_s_per_core
    hours = files / per_core / 3600 if per_core > 0 else float("inf")
    return Projection(row.name, per_core, hours, hours / cores)


def best_bulkfetch(rows: list[Row]) -> Row | None:
    """The fastest verified bulkfetch row per core among those that keep the files (tar, dir
    sinks); the null sink only when no such row was measured."""
    candidates = [r for r in rows if r.kind == "bulkfetch" and r.verified and r.sweep is None]
    keeping = [r for r in candidates if "-null-" not in r.name]
    pool = keeping or candidates
    return max(pool, key=lambda r: r.files_per_s_per_core, default=None)


def projection_line(rows: list[Row]) -> str:
    row = best_bulkfetch(rows)
    if row is None:
        return "No verified bulkfetch row: no projection."
    p = project(row)
    return (f"One billion files at {p.row}'s {p.per_core:,.0f} files/s per client core: "
            f"{p.hours_one_core:,.1f} hours on 1 core, {p.hours_case_study_cores:,.2f} hours on "
            f"a {CASE_STUDY_CORES}-core client like the case study's (its best design: "
            f"{CASE_STUDY_HOURS_16_CORES} hours on {CASE_STUDY_CORES} cores), if the rate "
            "scales with cores and the server keeps up.")
