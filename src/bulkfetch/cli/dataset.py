"""`bulkfetch ls`, `cat` and `extract`: reading a destination back, tar shards or a directory.

The commands are plain click commands; main.py registers them on the main group. Names are
untrusted (they came from a server, and an index can be tampered with): on stdout and stderr
they are always escaped with redact.safe_name, never written raw. Exit status: 0 all well,
1 some name missing or some file unreadable, corrupt or not written, 2 usage error.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.filesize import decimal

from bulkfetch.cli.api_flags import header_options
from bulkfetch.cli.remote_ls import list_bucket, list_tree
from bulkfetch.cli.s3_flags import s3_options, tls_options
from bulkfetch.dataset import Dataset, open_dataset
from bulkfetch.dataset.extract import ExtractResult
from bulkfetch.dataset.extract import extract as extract_files
from bulkfetch.errors import BulkfetchError, DataUnreadable, UsageError
from bulkfetch.util.names import PATH_MAX
from bulkfetch.util.redact import safe_name, safe_text

__all__ = ["cat", "extract", "ls"]

# The same settings as the commands in main.py (not imported: main.py imports this module).
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
NAME_LIMIT = 2 * PATH_MAX  # longer than any name a sink accepts: cut, with a note
SHOWN_FAILURES = 20  # failures extract lists one by one before only counting them
PROGRESS_INTERVAL_S = 2.0


def _shown(name: str) -> str:
    if name.isprintable() and "\\" not in name and len(name) <= NAME_LIMIT:
        return name  # the common case, without safe_name's slicing
    return safe_name(name, NAME_LIMIT)


@contextlib.contextmanager
def _bulkfetch_errors() -> Iterator[None]:
    """UsageError -> click usage error (exit 2); any other BulkfetchError -> message, exit 1."""
    try:
        yield
    except UsageError as exc:
        raise click.UsageError(safe_text(str(exc), 1000)) from None
    except BulkfetchError as exc:
        raise click.ClickException(safe_text(str(exc), 1000)) from None


@contextlib.contextmanager
def _stdout_may_close() -> Iterator[None]:
    """`bulkfetch ls DEST | head`: when the reader leaves, stop quietly as Unix tools do."""
    try:
        yield
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


@contextlib.contextmanager
def _opened(dest: str) -> Iterator[Dataset]:
    with _bulkfetch_errors():
        dataset = open_dataset(dest)
    with dataset, _bulkfetch_errors(), _stdout_may_close():
        yield dataset


@click.command(context_settings=CONTEXT)
@click.argument("dest", type=click.Path())
@click.argument("pattern", required=False)
@click.option("-l", "--long", "long_format", is_flag=True,
              help="Tab-separated size, MD5, shard and name (a directory destination is "
                   "read in full to compute the MD5s); for s3:// and a directory tree, "
                   "size and name (-1: no exact size listed).")
@s3_options
@tls_options
@header_options
def ls(dest: str, pattern: str | None, long_format: bool, headers: tuple[str, ...],
       header_file: str | None, bearer_env: str | None, netrc: bool,
       **s3_flags: Any) -> None:
    """List the names stored in DEST (tar shards or a directory), in storage order; or the
    names under s3://BUCKET[/PREFIX] (keys relative to PREFIX), listed in parallel key
    ranges and printed as the ranges come back (pipe to `sort` for key order); or the
    files of a web server's directory tree under an http(s):// URL (paths relative to it),
    directories listed at once, what `get URL DEST` would fetch (a tree behind credentials
    takes --header, --header-file, --bearer-env or --netrc, as get does).

    PATTERN is a glob on the whole name: '*' also matches '/', e.g. 'photos/*.jpg'. Names
    holding control characters or backslashes are shown as quoted Python strings.
    """
    auth = {"headers": headers, "header_file": header_file, "bearer_env": bearer_env,
            "netrc": netrc}
    if any(auth.values()) and not dest.lower().startswith(("http://", "https://")):
        raise click.UsageError("--header, --header-file, --bearer-env and --netrc apply to "
                               f"a directory tree's http(s):// URL; {dest!r} is not one")
    if dest.startswith("s3://"):
        if pattern is not None:
            s3_flags["include"] = (*s3_flags["include"], pattern)
        with _stdout_may_close():
            list_bucket(dest, long_format, s3_flags, _shown)
        return
    if dest.lower().startswith(("http://", "https://")):
        if pattern is not None:
            s3_flags["include"] = (*s3_flags["include"], pattern)
        with _stdout_may_close():
            list_tree(dest, long_format, s3_flags, auth, _shown)
        return
    if any(value not in (None, False, (), "auto") for value in s3_flags.values()):
        raise click.UsageError("--endpoint-url, --ca-bundle and the other s3:// flags apply "
                               f"to an s3:// URL; {dest!r} is a destination")
    with _opened(dest) as dataset:
        out = click.get_text_stream("stdout")
        if long_format:
            for info in dataset.infos(pattern):
                out.write(f"{info.size}\t{info.md5}\t{info.shard or '-'}\t{_shown(info.name)}\n")
        else:
            out.writelines(_shown(name) + "\n" for name in dataset.names(pattern))
        out.flush()


@click.command(context_settings=CONTEXT)
@click.argument("dest", type=click.Path())
@click.argument("names", nargs=-1, required=True)
def cat(dest: str, names: tuple[str, ...]) -> None:
    """Write the bytes stored under each NAME in DEST to stdout, in the order given.

    A tar destination is read at the member's offset (no scan) and checked against the MD5
    in its index. A missing or damaged NAME is reported on stderr and the others are still
    written; the exit status is then 1.
    """
    missing = 0
    with _opened(dest) as dataset:
        out = click.get_binary_stream("stdout")
        for name in names:
            try:
                body = dataset.get(name)
            except KeyError:
                click.echo(f"bulkfetch cat: {_shown(name)} is not in {safe_text(dest)}",
                           err=True)
                missing += 1
                continue
            except DataUnreadable as exc:
                click.echo(f"bulkfetch cat: {safe_text(str(exc), 1000)}", err=True)
                missing += 1
                continue
            out.write(body)
        out.flush()
    if missing:
        sys.exit(1)


class _ExtractReport:
    """What `extract` prints: the first failures, a count line now and then, the summary."""

    def __init__(self, *, quiet: bool, total: int | None, pattern: str | None) -> None:
        self.quiet = quiet
        self.total = total
        self.pattern = pattern
        self.started = time.monotonic()
        self.next_line = self.started + PROGRESS_INTERVAL_S

    def failure(self, name: str, reason: str, count: int) -> None:
        if count <= SHOWN_FAILURES:
            click.echo(f"failed: {_shown(name)}: {safe_text(reason, 1000)}", err=True)

    def progress(self, result: ExtractResult) -> None:
        now = time.monotonic()
        if self.quiet or now < self.next_line:
            return
        self.next_line = now + PROGRESS_INTERVAL_S
        of = f" of {self.total:,}" if self.total is not None else ""
        click.echo(f"[{now - self.started:,.0f} s] {result.files:,}{of} files, "
                   f"{decimal(result.bytes)}, {result.failed:,} failed", err=True)

    def summary(self, result: ExtractResult, out: str) -> None:
        if result.failed > SHOWN_FAILURES:
            click.echo(f"… and {result.failed - SHOWN_FAILURES:,} more failures", err=True)
        if result.stopped is not None:
            click.echo(f"stopped: {safe_text(result.stopped)}", err=True)
        if not self.quiet:
            click.echo(f"extracted {result.files:,} files ({_size(result.bytes)}) into "
                       f"{safe_text(out)}; {result.failed:,} failed", err=True)
        if self.pattern is not None and not result.files and not result.failed:
            click.echo(f"bulkfetch: no name matches --only {safe_text(self.pattern)} "
                       "('*' matches '/' too; `bulkfetch ls DEST` lists the names)", err=True)


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1000 else f"{decimal(n)}, {n:,} bytes"


@click.command(context_settings=CONTEXT)
@click.argument("dest", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--only", "pattern", default=None, metavar="PATTERN",
              help="Extract only names matching this glob ('*' also matches '/').")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines and no summary.")
def extract(dest: str, out: str, pattern: str | None, quiet: bool) -> None:
    """Write the files stored in DEST into the directory OUT as OUT/<name>.

    Every name is checked again (an index can be tampered with) and every file is written as
    the directory sink writes: never through a symlink, never outside OUT, complete files
    only. A tar destination's bytes are checked against its MD5s first. Existing files in OUT
    are replaced. Exit status: 0 all written, 1 some failed, 2 usage error.
    """
    with _opened(dest) as dataset:
        total = len(dataset) if dataset.kind == "tar" and pattern is None else None
        report = _ExtractReport(quiet=quiet, total=total, pattern=pattern)
        failures = 0

        def on_failure(name: str, reason: str) -> None:
            nonlocal failures
            failures += 1
            report.failure(name, reason, failures)

        result = extract_files(dataset, Path(out), pattern=pattern, on_failure=on_failure,
                         on_progress=report.progress)
        report.summary(result, out)
    sys.exit(result.exit_code)
