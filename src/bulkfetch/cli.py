"""The command line: flags -> frozen options -> run. No logic of its own."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, ClassVar

import click

from bulkfetch import __version__
from bulkfetch.errors import UsageError

if TYPE_CHECKING:
    from bulkfetch.config import GetOptions
    from bulkfetch.models import Report

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _usage(exc: UsageError) -> click.UsageError:
    return click.UsageError(str(exc))


class _LazyGroup(click.Group):
    """Commands in other modules are imported only when run (or listed by --help), so that
    `bulkfetch get` does not pay for importing the readers."""

    LAZY: ClassVar[dict[str, str]] = {
        "ls": "bulkfetch.cli_dataset:ls",
        "cat": "bulkfetch.cli_dataset:cat",
        "extract": "bulkfetch.cli_dataset:extract",
        "bench": "bulkfetch.bench.command:bench",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.LAZY.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        import importlib

        module, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


@click.group(cls=_LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="bulkfetch")
def cli() -> None:
    """Download millions to billions of files as fast as the hardware and the server allow."""


def main() -> None:
    cli(prog_name="bulkfetch")


def _rate(name: str, help_text: str):  # type: ignore[no-untyped-def]
    return click.option(name, type=click.FloatRange(0, 1), default=0.0, show_default=True,
                        metavar="P", help=help_text)


@cli.command(context_settings=CONTEXT)
@click.option("--files", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Number of synthetic files (any size: nothing is stored, so 10^10 is fine).")
@click.option("--page-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Names per list page.")
@click.option("--file-size", default="100", show_default=True, metavar="SPEC",
              help="Bytes per file: N, 'uniform:MIN:MAX' or 'lognormal:MEDIAN:SIGMA:MAX' "
                   "(k/m/g suffixes allowed).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of names, bodies and faults: same seed, same data, same faults.")
@click.option("--nested", is_flag=True, help="Names with subdirectories, e.g. 07/42/f0000074213.")
@click.option("--root", type=click.Path(exists=True, file_okay=False), default=None,
              help="Serve the real files under this directory instead of synthetic ones.")
@click.option("--no-total", is_flag=True, help="Leave out the X-Total-Files header on list pages.")
@_rate("--fail-rate", "Answer this share of requests with 500 or 503.")
@_rate("--throttle-rate", "Answer this share with 429 and Retry-After (seconds or HTTP-date).")
@click.option("--retry-after", type=click.IntRange(min=0), default=1, show_default=True,
              metavar="SECONDS", help="Retry-After sent with throttled answers.")
@click.option("--latency", default=None, metavar="MS|MIN-MAX",
              help="Delay every answer by MS milliseconds, or uniformly MIN-MAX.")
@_rate("--truncate-rate", "Announce the full length but close the connection mid-body.")
@_rate("--corrupt-rate", "Send the right length with wrong bytes (the ETag no longer matches).")
@_rate("--reset-rate", "Reset the connection (TCP RST) instead of answering.")
@_rate("--stall-rate", "Read the request and never answer.")
@click.option("--hostile-names", is_flag=True,
              help="Mix path-traversal, malformed and colliding names into the first page.")
@click.option("--bad-pages", "bad_pages", is_flag=False, flag_value="all", default=None,
              metavar="[KINDS]",
              help="Break pagination: comma list of empty, repeat, content-type, malformed, "
                   "loop (default with no value: all; pages 1, 1, 2, 3 and the last).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on; 0 picks a free one.")
@click.option("--processes", type=click.IntRange(min=1), default=None,
              help="Server processes sharing the port (SO_REUSEPORT). [default: cores]")
@click.option("--access-log", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Log every request to FILE (no value: stderr). Off by default.")
@click.option("--export-static", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Instead of serving, write the data set as files, pre-rendered list pages "
                   "and an nginx config serving the identical API, then exit.")
def serve(files: int, page_size: int, file_size: str, seed: int, nested: bool,
          root: str | None, no_total: bool, fail_rate: float, throttle_rate: float,
          retry_after: int, latency: str | None, truncate_rate: float, corrupt_rate: float,
          reset_rate: float, stall_rate: float, hostile_names: bool, bad_pages: str | None,
          host: str, port: int, processes: int | None, access_log: str | None,
          export_static: str | None) -> None:
    """Run the reference file server: GET /list, GET /list?next-marker=TOKEN, GET /get/NAME.

    The first line on stdout is 'serving http://HOST:PORT ...'. Stop it with Ctrl-C.
    """
    from bulkfetch.server.faults import FaultConfig, parse_latency
    from bulkfetch.server.hostile import BAD_PAGE_KINDS
    from bulkfetch.server.options import ServeOptions
    from bulkfetch.server.runner import is_loopback
    from bulkfetch.server.runner import serve as run_server
    from bulkfetch.server.sizes import parse_size_spec

    kinds: frozenset[str] = frozenset()
    if bad_pages is not None:
        kinds = frozenset(BAD_PAGE_KINDS) if bad_pages == "all" else frozenset(
            k.strip() for k in bad_pages.split(",") if k.strip())
    try:
        options = ServeOptions(
            files=files,
            page_size=page_size,
            file_size=parse_size_spec(file_size),
            seed=seed,
            nested=nested,
            root=root,
            show_total=not no_total,
            faults=FaultConfig(
                stall_rate=stall_rate,
                reset_rate=reset_rate,
                fail_rate=fail_rate,
                throttle_rate=throttle_rate,
                truncate_rate=truncate_rate,
                corrupt_rate=corrupt_rate,
                latency_ms=parse_latency(latency) if latency else (0.0, 0.0),
                retry_after=retry_after,
            ),
            hostile_names=hostile_names,
            bad_pages=kinds,
            host=host,
            port=port,
            processes=processes or os.cpu_count() or 1,
            access_log=access_log,
        )
    except UsageError as exc:
        raise _usage(exc) from None

    if export_static:
        from bulkfetch.server.export import export_static as write_export

        try:
            write_export(options, export_static, progress=True)
        except UsageError as exc:
            raise _usage(exc) from None
        return
    if not is_loopback(options.host):
        click.echo(f"warning: listening on {options.host}, which is not a loopback address; "
                   "anyone who can reach it can read the data set", err=True)

    def announce(line: str) -> None:
        click.echo(line)
        sys.stdout.flush()

    try:
        code = run_server(options, announce)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {options.host}:{options.port}: "
                                   f"{exc.strerror or exc}") from None
    sys.exit(code)


def _run_download(options: GetOptions, *, quiet: bool, plain: bool,
                  report_path: str | None) -> Report:
    from rich.console import Console

    from bulkfetch.progress import make_display
    from bulkfetch.report import print_summary, write_report
    from bulkfetch.runners.local import run

    display = make_display(quiet=quiet, force_plain=plain)
    display.start()
    try:
        report = run(options, on_progress=display.update)
    except UsageError as exc:
        raise _usage(exc) from None
    finally:
        display.stop()
    if not quiet:
        print_summary(report, Console(stderr=True))
    if report_path:
        from pathlib import Path

        write_report(report, Path(report_path))
    return report


@cli.command(context_settings=CONTEXT)
@click.argument("url_or_dest", metavar="URL")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--from-file", "from_file", type=click.Path(dir_okay=False), default=None,
              metavar="URLS.txt", help="Fetch the URLs listed in this file (one per line, "
                                       "streamed); then give only DEST.")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes. [default: cores]")
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Transfers in flight per worker.")
@click.option("--per-host", type=click.IntRange(min=0), default=0, show_default=True,
              help="Connections per host per worker (0: only --concurrency limits).")
@click.option("--sink", type=click.Choice(["dir", "tar", "null"]), default="dir",
              show_default=True,
              help="dir: DEST/<name>; tar: shards DEST/shard-WWW-NNNNNN.tar plus "
                   "DEST/index.sqlite (read back with ls/cat/extract); null: verify and "
                   "discard (measures the transport).")
@click.option("--fanout", type=click.IntRange(0, 4), default=0, show_default=True,
              help="dir: levels of hash-prefix directories (ab/cd/<name>) for very large runs.")
@click.option("--shard-files", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="tar: start a new shard after this many files (at a page boundary).")
@click.option("--shard-size", default="1g", show_default=True, metavar="BYTES",
              help="tar: ... or after this many bytes (k/m/g suffixes).")
@click.option("--no-verify", is_flag=True, help="Skip the MD5 check against ETag/Content-MD5.")
@click.option("--retries", type=click.IntRange(min=0), default=8, show_default=True,
              help="Retries per file (and per list page) after the first attempt.")
@click.option("--max-retry-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              metavar="SECONDS", help="Cap on a server's Retry-After.")
@click.option("--connect-timeout", type=click.FloatRange(min=0.001), default=10.0,
              show_default=True, metavar="SECONDS", help="Give up connecting after this long.")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=30.0, show_default=True,
              metavar="SECONDS", help="Give up on a transfer that receives no byte this long.")
@click.option("--timeout", "total_timeout", type=click.FloatRange(min=0.001), default=None,
              metavar="SECONDS", help="Give up on any single request after this long.")
@click.option("--list-path", default="/list", show_default=True, help="Listing endpoint.")
@click.option("--names-key", default="FileNames", show_default=True,
              help="JSON key of the names on a list page.")
@click.option("--next-key", default="NextMarker", show_default=True,
              help="JSON key of the next page's token.")
@click.option("--marker-param", default="next-marker", show_default=True,
              help="Query parameter that carries the token.")
@click.option("--get-template", default="/get/{name}", show_default=True,
              help="Path of one file; {name} is replaced by the URL-quoted name.")
@click.option("--restart", is_flag=True, help="Forget DEST's journal and start over.")
@click.option("--retry-failed", is_flag=True,
              help="Also re-attempt the files the journal lists as failed (resuming as usual).")
@click.option("-q", "--quiet", is_flag=True, help="No progress display and no summary.")
@click.option("--plain", is_flag=True, help="Plain status lines even on a terminal.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE.json", help="Write counts, rates, options and failures here.")
def get(url_or_dest: str, dest: str | None, from_file: str | None, quiet: bool, plain: bool,
        report_path: str | None, **flags: object) -> None:
    """Download every file URL lists into DEST; rerun the same command to resume.

    URL is a server speaking the seed API (GET /list, /list?next-marker=T, /get/NAME) or
    any paginated JSON API of that shape (see --names-key and friends). Exit status: 0 all
    done, 1 some files failed, 2 usage error, 130 interrupted (resumable).
    """
    from bulkfetch.api import build_options

    if from_file is not None:
        if dest is not None:
            raise click.UsageError("with --from-file give only DEST, not a URL")
        source, target = from_file, url_or_dest
    else:
        if dest is None:
            raise click.UsageError("give both URL and DEST (or --from-file URLS.txt DEST)")
        source, target = url_or_dest, dest
    flags["verify"] = not flags.pop("no_verify")
    from bulkfetch.server.sizes import parse_bytes

    try:
        flags["shard_size"] = parse_bytes(str(flags["shard_size"]))
    except UsageError as exc:
        raise _usage(UsageError(f"--shard-size: {exc}")) from None
    try:
        options = build_options(source, target, from_file=from_file is not None,
                                **flags)  # type: ignore[arg-type]
    except UsageError as exc:
        raise _usage(exc) from None
    report = _run_download(options, quiet=quiet, plain=plain, report_path=report_path)
    sys.exit(report.exit_code)


@cli.command(context_settings=CONTEXT)
@click.argument("dest", type=click.Path(file_okay=False))
def status(dest: str) -> None:
    """Summarise the run in DEST from its journal: finished, running or interrupted."""
    from pathlib import Path

    from bulkfetch.journal import read_status, render_status

    try:
        click.echo(render_status(read_status(Path(dest))))
    except UsageError as exc:
        raise _usage(exc) from None


@cli.command(context_settings=CONTEXT)
@click.option("--files", type=click.IntRange(min=1), default=200_000, show_default=True,
              help="Files the local reference server poses as.")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes. [default: cores]")
@click.argument("dest", required=False, default="bulkfetch-demo")
def demo(files: int, workers: int | None, dest: str) -> None:
    """Start a local reference server, download everything it lists into DEST with the live
    display, verify every file, and stop the server. DEST defaults to ./bulkfetch-demo and is
    replaced on each run."""
    from bulkfetch.demo import run_demo

    try:
        sys.exit(run_demo(files, dest, workers))
    except UsageError as exc:
        raise _usage(exc) from None
