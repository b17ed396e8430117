"""A download as `get` and `demo` run it: the live display while the workers run, then the
summary on stderr (or the one stop line with --quiet) and the --report JSON."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.util.redact import safe_text

if TYPE_CHECKING:
    from bulkfetch.config import GetOptions
    from bulkfetch.models import Report

__all__ = ["run_download"]


def run_download(options: GetOptions, *, quiet: bool, plain: bool,
                 report_path: str | None) -> Report:
    """Run `options` to its end; its Report (the exit status is the caller's to give)."""
    from bulkfetch.cli.progress import make_display
    from bulkfetch.cli.report import print_summary, stop_line, write_report
    from bulkfetch.runners.local import run

    display = make_display(quiet=quiet, force_plain=plain)
    display.start()
    try:
        report = run(options, on_progress=display.update)
    except UsageError as exc:
        display.stop()
        raise click.UsageError(str(exc)) from None
    except BulkfetchError as exc:  # run() reports most stops in the Report; this is the net
        display.stop()
        raise click.ClickException(f"{exc}. Rerun the same command to resume.") from None
    except KeyboardInterrupt:  # Ctrl-C before the run installed its own handler
        display.stop()
        click.echo("bulkfetch: interrupted while starting. Rerun the same command to resume.",
                   err=True)
        sys.exit(130)
    except BaseException:
        display.stop()
        raise
    display.finish(report)  # its last figures are the summary's
    if not quiet:
        from rich.console import Console

        print_summary(report, Console(stderr=True))
    elif (line := stop_line(report)) is not None:
        click.echo(f"bulkfetch: {line}", err=True)
    if report_path:
        import dataclasses
        from pathlib import Path

        from bulkfetch.dest.failures_file import beside_report

        try:
            copied = beside_report(Path(report_path), report.failures_file)
            report = dataclasses.replace(report, failures_file=copied)
        except OSError as exc:  # the report still says where DEST's list is
            click.echo(f"bulkfetch: cannot copy the list of failures beside {report_path}: "
                       f"{exc}", err=True)
        try:
            write_report(report, Path(report_path))
        except OSError as exc:  # (its directory was checked before the run began)
            click.echo(f"bulkfetch: cannot write the report {safe_text(report_path)}: "
                       f"{exc.strerror or exc}", err=True)
            if report.exit_code == 0:  # what was asked for is missing
                sys.exit(1)
    return report
