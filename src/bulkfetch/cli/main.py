"""The command line: flags -> frozen options -> run. No logic of its own."""

from __future__ import annotations

import sys
from typing import ClassVar

import click

from bulkfetch._version import __version__
from bulkfetch.errors import UsageError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _usage(exc: UsageError) -> click.UsageError:
    return click.UsageError(str(exc))


class _LazyGroup(click.Group):
    """Commands in other modules are imported only when run (or listed by --help), so that
    `bulkfetch get` does not pay for importing the readers, nor `hash` or `ls` for building
    get's sixty flags."""

    LAZY: ClassVar[dict[str, str]] = {
        "get": "bulkfetch.cli.get:get",
        "ls": "bulkfetch.cli.dataset:ls",
        "cat": "bulkfetch.cli.dataset:cat",
        "extract": "bulkfetch.cli.dataset:extract",
        "hash": "bulkfetch.cli.hash:hash_command",
        "bench": "bulkfetch.bench.command:bench",
        "serve": "bulkfetch.server.command:serve",
        "pull": "bulkfetch.cli.pull:pull",
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


# Commands whose output is what they are run for: started with stdout closed (`>&-`), they
# stop at once with a usage error (as coreutils' `md5sum`/`cat` fail with a write error)
WRITES_TO_STDOUT = frozenset({"ls", "cat", "hash"})


@click.group(cls=_LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="bulkfetch")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Download millions to billions of files as fast as the hardware and the server allow."""
    if sys.stdout is None and ctx.invoked_subcommand in WRITES_TO_STDOUT:
        raise click.UsageError(f"stdout is closed: what `{ctx.invoked_subcommand}` writes has "
                               "nowhere to go. Redirect it to a file (or to /dev/null)")


def main() -> None:
    cli(prog_name="bulkfetch")


@cli.command(context_settings=CONTEXT)
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: state, the journal's totals, the first failures, and a "
                   "running run's live numbers (\"live\", else null).")
@click.option("--watch", is_flag=True,
              help="Show it again every --interval until the run ends (Ctrl-C stops "
                   "watching, not the run); with --json, one line per look.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              metavar="SECONDS", help="With --watch: how often to look.")
def status(dest: str, as_json: bool, watch: bool, interval: float) -> None:
    """Summarise the run in DEST: finished, running (with its numbers of the last second)
    or interrupted, and the partial big files a rerun resumes. Reads only: a running run is
    never disturbed."""
    from bulkfetch.cli.status import watch_status

    try:
        watch_status(dest, as_json=as_json, watch=watch, interval=interval)
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
    replaced on each run; a DEST that holds anything the demo did not make is refused."""
    from bulkfetch.cli.demo import run_demo

    try:
        sys.exit(run_demo(files, dest, workers))
    except UsageError as exc:
        raise _usage(exc) from None
