"""`bulkfetch bench`: the case study's table, reproduced on this machine beside bulkfetch and
its peers. Only click is imported here; the session's modules load when the command runs."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DEFAULT_FILES = 200_000
QUICK_FILES = 20_000


@click.command(context_settings=CONTEXT)
@click.option("--files", type=click.IntRange(min=100), default=None,
              help=f"Files of 100 bytes in the data set. [default: {DEFAULT_FILES:,}; "
                   f"with --quick {QUICK_FILES:,}]")
@click.option("--quick", is_flag=True,
              help="A short session (under 3 minutes on 2 cores): fewer files, a 2 s wrk "
                   "ceiling, shorter pauses between rows.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="PATH", help="Also write the rows as a JSON list here.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="DIR",
              help="Results directory (table.md, results.json, chart.png, sweep plots, "
                   "machine.txt); its path is printed at the end. [default: "
                   "$XDG_CACHE_HOME/bulkfetch/bench/<date>-<machine>, ~/.cache when unset; "
                   "-quick added with --quick]")
@click.option("--sweep-workers", is_flag=True,
              help="Also plot files/s of bulkfetch (null sink) against workers 1..2×cores.")
@click.option("--sweep-concurrency", is_flag=True,
              help="Also plot files/s of bulkfetch (null sink, 1 worker) against "
                   "concurrency 1, 4, 16, 64, 256.")
@click.option("--export-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="DIR", help="Keep the nginx export here and reuse it next time "
                                  "(default: a temporary one).")
@click.option("--only", default=None, metavar="NAMES",
              help="Run only the rows whose names start with one of these (comma list), "
                   "e.g. wrk,combo,bulkfetch-tar.")
def bench(files: int | None, quick: bool, json_path: Path | None, out: Path | None,
          sweep_workers: bool, sweep_concurrency: bool, export_dir: Path | None,
          only: str | None) -> None:
    """Measure bulkfetch beside the case study's designs and peer tools on this machine.

    Exports the data set, starts nginx as in the standard setup of docs/guide/benchmarks.md
    (server on core 0, client on core 1 when there are two or more), measures the wrk
    ceiling, then runs each row with a fresh destination and verifies it (file count and a
    sample of MD5s):

    \b
      designs    sync, threads-10, threads-100, processes, asyncio, combo (the case study's,
                 written fresh; the slow ones on a proportional subset of the files)
      bulkfetch  dir, tar and null sinks with 1 worker and with one worker per core
      peers      rclone (HTTP over an nginx autoindex), aria2c, wget2, curl --parallel

    Prints a markdown table (files/s, per core, CPU µs per file, peak RSS, ratio to the wrk
    ceiling and to the case study's best design 'combo', verified) and a projection for one
    billion files; writes the results directory (--out) with a bar chart and, with
    --sweep-*, line plots. A missing tool or library skips its row with the reason. Needs nginx
    (apt-get install nginx-light); the baselines need `pip install -e .[bench]`.
    Exit status: 0 every row verified, 1 some row not verified or no session.
    """
    from bulkfetch.bench import output, session
    from bulkfetch.bench.harness import log

    count = files or (QUICK_FILES if quick else DEFAULT_FILES)
    settings = session.Settings(
        files=count,
        quick=quick,
        sweep_workers=sweep_workers,
        sweep_concurrency=sweep_concurrency,
        export_dir=export_dir.absolute() if export_dir else None,
        only=tuple(p.strip() for p in only.split(",") if p.strip()) if only else (),
        wrk_seconds=2.0 if quick else 5.0,
        # deleting the last row's files leaves the filesystem work for a while
        pause=min(0.5 if quick else 2.0, 0.2 + count / 50_000),
    )
    signal.signal(signal.SIGTERM, _interrupt)  # stop nginx and the row's processes too
    missing = session.environment_note()
    if missing:
        log(missing)
    try:
        outcome = session.run(settings)
    except session.BenchError as exc:
        raise click.ClickException(str(exc)) from None
    if missing:
        outcome.notes.append(missing)
    directory = (out or output.default_out(quick)).absolute()
    text, written = output.write(outcome, directory, json_path)
    click.echo(text)
    log(f"results: {directory} ({', '.join(written)})")
    failed = [r.name for r in outcome.rows if not r.verified]
    if failed:
        log(f"NOT verified: {', '.join(failed)}")
        sys.exit(1)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
