"""`bulkfetch hash`: checksums of local files, a check against a checksum file, or a
re-verification of a download (tar or dir); the engine is bulkfetch.hashing.files.

stdout carries exactly what md5sum/sha256sum/b3sum would write (or `md5sum -c`), as bytes, so
it can be fed back to them; everything else goes to stderr: errors, md5sum's WARNING lines,
the summary, and on a terminal a live bar by bytes. Exit status: 0 all well, 1 a mismatch or
an unreadable file, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

import click
from rich.filesize import decimal

from bulkfetch.cli.progress import BAR_WIDTH, RateWindow, hms
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.hashing.files import (
    HashOptions,
    HashProgress,
    check_entries,
    hash_paths,
    require_algorithm,
    verify_members,
)
from bulkfetch.util.checksum_lines import (
    ALGORITHMS,
    CheckEntry,
    ChecksumReader,
    check_line,
    check_warnings,
    sum_line,
)
from bulkfetch.util.redact import safe_name, safe_text

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live

    from bulkfetch.dataset import MemberInfo

__all__ = ["hash_command"]

# The same settings as the commands in main.py (not imported: main.py imports this module).
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
PROG = "bulkfetch hash"


def _error(message: str) -> None:
    click.echo(f"{PROG}: {message}", err=True)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _Bar:
    """A live bar by bytes on a terminal's stderr: hashed against listed so far (the total
    grows while the paths are still being walked), the rate now and on average, the ETA."""

    def __init__(self, progress: HashProgress, *, redirect_stdout: bool) -> None:
        from rich.console import Console
        from rich.live import Live

        self._progress = progress
        self._window = RateWindow()
        self._live: Live = Live(self, console=Console(stderr=True), refresh_per_second=4,
                                transient=False, redirect_stdout=redirect_stdout,
                                redirect_stderr=False)

    def __enter__(self) -> _Bar:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def __rich__(self) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        p = self._progress
        done = p.read_bytes()
        now = time.monotonic()
        self._window.add(now, p.files_done, p.files_done, done)
        rates = self._window.rates()
        rate_now = rates[2] if rates is not None else 0.0
        elapsed = now - p.started
        total = max(p.listed_bytes, done, 1)
        eta = "--:--:--"  # no ETA while the total still grows
        if p.listing_done and rate_now > 0:
            eta = hms((total - done) / rate_now)
        head = Table.grid(padding=(0, 2))
        head.add_column(width=BAR_WIDTH, no_wrap=True)
        head.add_column(no_wrap=True, overflow="ellipsis")
        head.add_row(ProgressBar(total=total, completed=min(done, total), width=BAR_WIDTH),
                     Text.assemble((f"{100 * done / total:.1f}%", "bold"), "  ",
                                   (decimal(done), "bold"), f" / {decimal(total)}",
                                   ("+" if not p.listing_done else "", "dim"),
                                   ("  ETA ", "dim"), (eta, "bold")))
        average = decimal(int(done / elapsed)) if elapsed > 0 else "-"
        line = Text.assemble(
            (f"{p.files_done:,}", "bold green"), f" / {p.listed_files:,}",
            ("+" if not p.listing_done else "", "dim"), " files · ",
            (f"{p.failed:,}", "bold red" if p.failed else "bold"), " failed · ",
            (f"{decimal(int(rate_now))}/s", "bold"), " now · ", f"{average}/s avg · ",
            ("elapsed ", "dim"), hms(elapsed), no_wrap=True, overflow="ellipsis")
        return Group(head, line)


class _Output:
    """stdout as bytes, exactly as md5sum writes it; while the bar is drawn on the same
    terminal, lines go through rich's stdout proxy so that they print above the bar."""

    def __init__(self, *, through_rich: bool) -> None:
        self._through_rich = through_rich
        self._binary = click.get_binary_stream("stdout")

    def write(self, line: bytes) -> None:
        if self._through_rich:
            sys.stdout.write(line.decode("utf-8", "backslashreplace"))
        else:
            self._binary.write(line)

    def flush(self) -> None:
        (sys.stdout if self._through_rich else self._binary).flush()


@contextlib.contextmanager
def _session(progress: HashProgress, quiet: bool) -> Iterator[_Output]:
    """The output, and the bar while the run lasts when stderr is a terminal and not
    --quiet. Ctrl-C -> exit 130; a reader of stdout that goes away -> exit 1, quietly."""
    stdout_tty = _is_terminal(sys.stdout)
    show_bar = not quiet and _is_terminal(sys.stderr)
    output = _Output(through_rich=show_bar and stdout_tty)
    try:
        with contextlib.ExitStack() as stack:
            if show_bar:
                stack.enter_context(_Bar(progress, redirect_stdout=stdout_tty))
            yield output
            output.flush()
    except KeyboardInterrupt:
        _error("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except UsageError as exc:
        raise click.UsageError(safe_text(str(exc), 1000)) from None
    except BulkfetchError as exc:
        raise click.ClickException(safe_text(str(exc), 1000)) from None


def _summary(progress: HashProgress, what: str, quiet: bool) -> None:
    if quiet:
        return
    elapsed = max(time.monotonic() - progress.started, 1e-9)
    read = progress.read_bytes()
    _error(f"{progress.files_done:,} {what}, {_size(read)} in "
           f"{elapsed:,.2f} s, {read / elapsed / 1e6:,.0f} MB/s; {progress.failed:,} failed")


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1000 else f"{decimal(n)} ({n:,} bytes)"


def _hash(paths: tuple[str, ...], options: HashOptions, quiet: bool) -> int:
    progress = HashProgress()
    with _session(progress, quiet) as out:
        for path, digest in hash_paths(paths, options, progress):
            if isinstance(digest, OSError):
                progress.failed += 1
                _error(f"{safe_name(path)}: {digest.strerror}")
            else:
                out.write(sum_line(digest, path, options.algo))
    _summary(progress, "files", quiet)
    return 1 if progress.failed else 0


def _open_check_file(check: str) -> BinaryIO:
    if check == "-":
        return click.get_binary_stream("stdin")
    try:
        return open(check, "rb")  # closed by the caller's ExitStack
    except OSError as exc:
        raise click.UsageError(f"--check {safe_name(check)}: {exc.strerror}") from None


def _check(check: str, algo: str | None, options: HashOptions, quiet: bool) -> int:
    """md5sum -c: a line per listed file (no OK lines with --quiet), its warnings at the end."""
    progress = HashProgress()
    unreadable = mismatched = 0
    with contextlib.ExitStack() as files:
        stream = files.enter_context(_open_check_file(check))
        reader = ChecksumReader(stream, algo)
        entries = iter(reader)
        first = next(entries, None)  # fixes the algorithm when --algo does not
        if first is not None:
            assert reader.algo is not None
            _require(reader.algo)
            with _session(progress, quiet) as out:
                for entry, digest in check_entries(itertools.chain([first], entries),
                                                   reader.algo, options, progress):
                    if isinstance(digest, OSError):
                        unreadable += 1
                        _error(f"{safe_name(entry.path)}: {digest.strerror}")
                        out.write(check_line(entry.path, "FAILED open or read"))
                    elif digest != entry.expected:
                        mismatched += 1
                        out.write(check_line(entry.path, "FAILED"))
                    elif not quiet:
                        out.write(check_line(entry.path, "OK"))
                    progress.failed = unreadable + mismatched
    if reader.entries == 0:
        _error(f"{safe_name(check)}: no properly formatted checksum lines found")
        return 1
    for line in check_warnings(reader.improper, unreadable, mismatched):
        _error(line)
    _summary(progress, "files checked", quiet)
    return 1 if unreadable or mismatched else 0


def _dest(dest: str, options: HashOptions, quiet: bool) -> int:
    """Every member of a tar destination against the MD5 its index recorded at download;
    a directory destination goes to _dest_directory()."""
    from bulkfetch.dataset import open_dataset

    try:
        dataset = open_dataset(dest)
    except UsageError as exc:
        raise click.UsageError(safe_text(str(exc), 1000)) from None
    progress = HashProgress()
    unreadable = mismatched = unrecorded = 0
    told: set[str] = set()  # one stderr line per distinct reason (a lost shard has many)

    def recorded(infos: Iterable[MemberInfo]) -> Iterator[MemberInfo]:
        # An index written before every tar member got an MD5 (bodies streamed beside a
        # pinned SHA-256) has empty ones: nothing to compare with, so not hashed, not FAILED.
        nonlocal unrecorded
        for info in infos:
            if info.md5:
                yield info
            else:
                unrecorded += 1

    with dataset:
        if dataset.kind != "tar":
            return _dest_directory(Path(dest), options, quiet)
        with _session(progress, quiet) as out:
            for info, digest in verify_members(recorded(dataset.infos()), Path(dest), options,
                                               progress):
                name = safe_name(info.name)
                if isinstance(digest, OSError):
                    unreadable += 1
                    out.write(f"{name}: FAILED open or read\n".encode())
                    if digest.strerror not in told and len(told) < 1000:
                        told.add(digest.strerror)
                        _error(safe_text(digest.strerror, 1000))
                elif digest != str(info.md5).lower():
                    mismatched += 1
                    out.write(f"{name}: FAILED\n".encode())
                progress.failed = unreadable + mismatched
    for line in check_warnings(0, unreadable, mismatched):
        _error(line.replace("listed file", "member"))
    if unrecorded:
        _error(f"WARNING: {unrecorded} member{'s' if unrecorded != 1 else ''} had no MD5 "
               "recorded (an index written by an older bulkfetch): their bytes were not "
               "checked")
    _summary(progress, "members verified", quiet)
    return 1 if unreadable or mismatched else 0


def _recorded_sums(dest: Path) -> list[Path]:
    """The checksum files the directory sink wrote in DEST, oldest first."""
    from bulkfetch.dest.journal import STATE_DIR
    from bulkfetch.dest.sums import SUMS_DIR, sums_files

    try:
        files = sums_files(dest)
    except OSError:
        files = []
    if not files:
        shown = safe_text(str(dest))
        fresh = (f"For fresh checksums run `bulkfetch hash {shown} > sums`, and later "
                 "`bulkfetch hash --check sums`")
        if not (dest / STATE_DIR).is_dir():
            raise click.UsageError(
                f"{shown} is not a directory bulkfetch downloaded into (it has no "
                f"{STATE_DIR}): --dest checks a download against what `bulkfetch get` "
                f"recorded. {fresh}")
        raise click.UsageError(
            f"{shown} has no checksums recorded ({SUMS_DIR}): it was downloaded with "
            "--no-verify or by a bulkfetch older than `hash --dest` for directories. "
            f"{fresh}")
    return files


def _latest_recorded(dest: Path) -> Iterator[tuple[str, str] | None]:
    """(path under DEST, MD5) of the latest line of each path in DEST's sums (a file fetched
    again by a rerun, --restart or --sync has a newer line: dest/sums.py), in path order; None
    for each line that is not an MD5 line. The lines go through a temporary SQLite database
    on disk, so memory stays flat."""
    import sqlite3

    from bulkfetch.dest.sums import KEPT_TABLE, load_latest

    db = sqlite3.connect("", isolation_level=None)  # "": a private temporary file
    try:
        db.execute(KEPT_TABLE)
        try:
            improper = load_latest(db, dest).improper
        except OSError as exc:
            raise click.UsageError(f"cannot read the checksums in {safe_text(str(dest))}: "
                                   f"{exc.strerror}") from None
        yield from (None for _ in range(improper))
        rows = db.execute("SELECT path, md5 FROM kept ORDER BY path")
        while batch := rows.fetchmany(1000):
            yield from batch
    finally:
        db.close()


def _dest_directory(dest: Path, options: HashOptions, quiet: bool) -> int:
    """Every file a directory download recorded (DEST/.bulkfetch/sums) against the MD5 of
    its latest line."""
    from bulkfetch.util.names import check_name

    progress = HashProgress()
    unreadable = mismatched = improper = 0

    _recorded_sums(dest)  # a usage error when there are none, before the display starts

    def entries() -> Iterator[CheckEntry]:
        nonlocal improper
        for found in _latest_recorded(dest):
            if found is None or check_name(found[0]) is not None:  # never outside DEST
                improper += 1
            else:
                yield CheckEntry(str(dest / found[0]), found[1])

    with _session(progress, quiet) as out:
        for entry, digest in check_entries(entries(), "md5", options, progress):
            shown = os.path.relpath(entry.path, dest)
            if isinstance(digest, OSError):
                unreadable += 1
                _error(f"{safe_name(shown)}: {digest.strerror}")
                out.write(check_line(shown, "FAILED open or read"))
            elif digest != entry.expected:
                mismatched += 1
                out.write(check_line(shown, "FAILED"))
            progress.failed = unreadable + mismatched
    for line in check_warnings(improper, unreadable, mismatched):
        _error(line)
    _summary(progress, "files verified", quiet)
    return 1 if unreadable or mismatched or improper else 0


def _require(algo: str) -> None:
    try:
        require_algorithm(algo)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None


@click.command("hash", context_settings=CONTEXT)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--algo", type=click.Choice(ALGORITHMS), default=None,
              help="Digest algorithm. [default: md5; with --check: from the file's digest "
                   "length (32 md5, 40 sha1, 64 sha256; give --algo blake3 for b3sum files)]")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes hashing files side by side (one file is read by one "
                   "worker; BLAKE3 also spreads one big file over all cores). [default: cores]")
@click.option("--check", "check", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, metavar="FILE",
              help="Verify the files listed in FILE (written by md5sum, sha1sum, sha256sum, "
                   "b3sum or bulkfetch hash; '-' reads stdin) and print 'PATH: OK' or "
                   "'PATH: FAILED' as md5sum -c does.")
@click.option("--dest", "dest", type=click.Path(file_okay=False), default=None,
              metavar="DEST",
              help="Re-verify a finished `bulkfetch get` download: every tar member against "
                   "the MD5 its index recorded, every file of a directory against the MD5 "
                   "recorded in DEST/.bulkfetch/sums; prints the ones that fail.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress bar and no summary; with --check also no OK lines (as "
                   "md5sum --quiet). Errors and warnings are still printed.")
def hash_command(paths: tuple[str, ...], algo: str | None, workers: int | None,
                 check: str | None, dest: str | None, quiet: bool) -> None:
    """Print the checksum of every file in PATHs, as md5sum, sha1sum, sha256sum or b3sum would.

    Files are hashed in parallel worker processes and printed in the order given; a directory
    is walked recursively, names in byte order, without following symlinks to directories
    and leaving out the .bulkfetch directory a download keeps its state in; '-' is standard
    input.
    The output is byte for byte md5sum's (`md5sum -c` reads it) and b3sum's for blake3. A
    file that cannot be read is reported on stderr and the others go on. On a terminal a bar
    by bytes runs on stderr, and a summary follows.

    Exit status: 0 all well, 1 a file unreadable or a checksum mismatched, 2 usage error,
    130 interrupted.
    """
    modes = sum((bool(paths), check is not None, dest is not None))
    if modes != 1:
        raise click.UsageError("give PATHs to hash, or --check FILE, or --dest DEST (one of them)")
    options = HashOptions(algo=algo or "md5", **({"workers": workers} if workers else {}))
    if check is not None:
        sys.exit(_check(check, algo, options, quiet))
    if dest is not None:
        if algo not in (None, "md5"):
            raise click.UsageError("--dest checks the MD5s recorded at download: leave --algo "
                                   "out (or give md5)")
        sys.exit(_dest(dest, options, quiet))
    _require(options.algo)
    sys.exit(_hash(paths, options, quiet))
