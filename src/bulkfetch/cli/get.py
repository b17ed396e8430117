"""`bulkfetch get`: its flags, the checks made before a run (a --report that could not be
written, a --concurrency the open-file limit cannot hold) and --sync --dry-run; the run
itself is cli_run.run_download()."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from bulkfetch.cli.api_flags import api_options
from bulkfetch.cli.s3_flags import s3_options, tls_options
from bulkfetch.config import MIN_LEASE_S
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.util.redact import safe_text

if TYPE_CHECKING:
    from bulkfetch.config import GetOptions

__all__ = ["get"]

# The same settings as the commands in main.py (not imported: main.py imports this module).
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _usage(exc: UsageError) -> click.UsageError:
    return click.UsageError(str(exc))


# Flags users reach for that `get` has no need of, and what to do instead (click would
# suggest the nearest flag it has: --runner for --resume).
NOT_FLAGS = {
    "--resume": "there is no --resume: rerunning the same command resumes (--restart starts "
                "over, --retry-failed tries the failed files again)",
    "--continue": "there is no --continue: rerunning the same command resumes",
}


class _Get(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if arg == "--":
                break
            advice = NOT_FLAGS.get(arg.partition("=")[0])
            if advice is not None:
                raise click.UsageError(advice, ctx)
        return super().parse_args(ctx, args)


@click.command(cls=_Get, context_settings=CONTEXT)
@click.argument("url_or_dest", metavar="URL")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--from-file", "from_file", type=click.Path(dir_okay=False), default=None,
              metavar="URLS.txt", help="Fetch the URLs listed in this file (one per line, "
                                       "streamed), or in the rows of a .csv, .tsv (with a "
                                       "header row), .jsonl or .parquet table; then give "
                                       "only DEST.")
@click.option("--url-col", default="url", show_default=True, metavar="COLUMN",
              help="With a --from-file table: the column holding each row's URL.")
@click.option("--name-col", default=None, metavar="COLUMN",
              help="With a --from-file table: the column holding each file's name "
                   "[default: the URL's path].")
@click.option("--name-template", default=None, metavar="TEMPLATE",
              help="With a --from-file table: each file's name from the row's {index} (from "
                   "0) and the URL's {ext}, e.g. '{index:09d}{ext}' (URLs that share a last "
                   "path component no longer collide).")
@click.option("--save-cols", default=None, metavar="COL,COL",
              help="With a --from-file table: store these columns of each row as JSON in a "
                   "file beside it, named by its sample key plus .json ('000042.jpg' gets "
                   "'000042.json'; in a tar shard, a member of the same sample).")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (with --runner ray: actors, at most one per CPU of "
                   "the cluster). [default: cores; with --runner ray: the cluster's CPUs]")
@click.option("--runner", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="Where the workers run: processes on this machine, or Ray actors across "
                   "a cluster's nodes (this process keeps the listing, journal and "
                   "display). With ray, DEST must be on storage every node mounts at the "
                   "same path. Needs bulkfetch[ray].")
@click.option("--ray-address", default=None, metavar="auto|HOST:PORT",
              help="With --runner ray: the cluster to join (auto: the one `ray start` "
                   "began on this machine). [default: RAY_ADDRESS, else a Ray started for "
                   "this run]")
@click.option("--lease", type=click.FloatRange(min=MIN_LEASE_S), default=None,
              metavar="SECONDS",
              help="A worker process or Ray actor that says nothing for this long (stopped, "
                   "a long GC pause, a hung mount, its node cut off) is stopped, its pages go "
                   "to the others, and a new one takes its place. Keep it above the longest "
                   "write or fsync DEST may take. [default: 30]")
@click.option("-c", "--concurrency", default="auto", show_default=True, metavar="N|auto",
              help="Transfers in flight per worker. auto: start at 4 (a resumed run: near "
                   "what the host took before) and measure: double while files/s rises (and "
                   "up to 64 while the worker wants a core all the time and each doubling "
                   "costs it less CPU a file), then follow "
                   "latency; back off on 429, 503 (at once when they ask for a pause), "
                   "timeouts, refused and redialled connections (up to --max-concurrency). "
                   "Over several hosts each host has its own limit, so one host's pushback "
                   "slows only that host. A request silent far longer than its host's answers "
                   "is asked again on another connection, the first answer wins. A number "
                   "fixes it and turns this off.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=4096,
              show_default=True,
              help="With --concurrency auto: at most this many per worker (and no more than "
                   "its open-file limit allows, raised toward the hard limit at start).")
@click.option("--per-host", "--max-connections-per-host", "per_host", type=click.IntRange(min=0),
              default=0, show_default=True,
              help="Connections per host per worker (0: only --concurrency limits).")
@click.option("--max-rps", type=click.FloatRange(min=0), default=0, show_default=True,
              metavar="N",
              help="Start at most N requests a second on each host, for the whole run (the "
                   "workers share N, more to those whose transfers wait on it); 0: no limit. "
                   "Whatever the limit, a 429 or "
                   "503 with Retry-After pauses every request to that host for that long.")
@click.option("--limit-rate", default="0", show_default=True, metavar="BYTES/S",
              help="Take at most this many body bytes a second from each host, for the "
                   "whole run (e.g. 5m; the workers share it, more to those whose "
                   "transfers wait on it); 0: no limit.")
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
@click.option("--no-verify", is_flag=True,
              help="Check sizes only: no body is hashed and no digest (ETag, Content-MD5, "
                   "Repr-Digest) checked, so no MD5 is recorded either (`hash --dest` and "
                   "`--sync` cannot vouch for such files). Saves the hashing CPU on big "
                   "files. Into a DEST whose earlier runs recorded MD5s, bodies are still "
                   "hashed, unchecked, to keep that record true.")
@click.option("--retries", type=click.IntRange(min=0), default=8, show_default=True,
              help="Retries per file (and per list page) after the first attempt.")
@click.option("--max-retry-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              metavar="SECONDS", help="Cap on a server's Retry-After.")
@click.option("--connect-timeout", type=click.FloatRange(min=0.001), default=10.0,
              show_default=True, metavar="SECONDS", help="Give up connecting after this long.")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=30.0, show_default=True,
              metavar="SECONDS",
              help="Give up on a transfer slower than --min-speed (or silent) this long.")
@click.option("--min-speed", type=click.IntRange(min=1), default=100, show_default=True,
              metavar="BYTES/S", help="Below this a transfer counts as idle (a trickle does).")
@click.option("--timeout", "total_timeout", type=click.FloatRange(min=0.001), default=None,
              metavar="SECONDS", help="Give up on any single request after this long.")
@click.option("--max-page-size", default="16m", show_default=True, metavar="BYTES",
              help="Refuse list pages larger than this (k/m/g suffixes).")
@click.option("--spool-above", default="1m", show_default=True, metavar="BYTES",
              help="Bodies larger than this are written to disk as they arrive (hashed on "
                   "the way) instead of being held in memory; 0 streams every body.")
@click.option("--split-above", default="64m", show_default=True, metavar="BYTES",
              help="A body at least this big, from a server that serves ranges (Accept-Ranges "
                   "and an ETag or Last-Modified), is fetched by ranges: in pieces over --parts "
                   "connections, resumable byte by byte after an interruption.")
@click.option("--parts", type=click.IntRange(min=1), default=8, show_default=True,
              help="Connections a big file is fetched over at once, taking its pieces (16 MiB "
                   "or more) in file order; each counts against --concurrency (1: one "
                   "connection).")
@click.option("--list-path", default=None,
              help="Listing endpoint, added to URL. [default: /list; with a JSON listing's "
                   "flags or --api: none, URL is the listing]")
@click.option("--names-key", default=None,
              help="JSON key of the names on a list page. [default: FileNames]")
@click.option("--next-key", default=None,
              help="JSON key of the next page's token. [default: NextMarker]")
@click.option("--marker-param", default=None,
              help="Query parameter that carries the token. [default: next-marker]")
@click.option("--get-template", default=None,
              help="Path of one file after URL; {name} is replaced by the URL-quoted name. "
                   "With {origin} (URL's scheme://host:port) and {seg[N]} (the Nth segment "
                   "of URL's path, from 0) it is a whole URL. [default: /get/{name}]")
@api_options
@tls_options
@s3_options
@click.option("--restart", is_flag=True,
              help="Forget DEST's journal and start over (files already there are kept). "
                   "With --sync: keep DEST in step with a source whose URL or options "
                   "changed, fetching only the files that differ.")
@click.option("--retry-failed", is_flag=True,
              help="Also re-attempt the files the journal lists as failed (resuming as usual).")
@click.option("--sync", is_flag=True,
              help="Keep a finished DEST in step with the source: list it again and fetch "
                   "only what is new or changed. A file whose listing states its size and "
                   "MD5 (S3), or its size and time, is compared with them; any other is "
                   "asked for with the validators its server sent (its MD5, or the "
                   "server's ETag, or its Last-Modified), so an unchanged file is answered 304 "
                   "and left as it is; one answered 200 with the same bytes is left as it "
                   "is too. An interrupted sync resumes.")
@click.option("--checksum", is_flag=True,
              help="With --sync: judge a file unchanged by its content only: by the "
                   "listing's MD5 where it states one, else by asking with the MD5 recorded "
                   "in DEST (a server whose ETags are MD5s answers 304) and comparing any "
                   "body that comes with DEST's copy; never by size and time alone.")
@click.option("--delete", is_flag=True,
              help="With --sync: once the source is listed to its end, remove the files "
                   "under DEST it no longer lists (never outside DEST, never its "
                   ".bulkfetch, never a name --include/--exclude leave out), and the "
                   "directories this empties. Removes nothing when the listing held no file. "
                   "Try --dry-run first.")
@click.option("--max-delete", default=None, metavar="N|P%",
              help="With --delete: if the pass would remove more than N files, or more "
                   "than P percent of the files in DEST, remove none and exit 2 (a listing "
                   "cut short by a server looks like a source that lost its files). "
                   "Default: no limit.")
@click.option("--dry-run", is_flag=True,
              help="With --sync: list the source, print the files --delete would remove and "
                   "how many listed files DEST lacks; fetch and remove nothing.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress display and no summary; a run that stops on an error still "
                   "says why.")
@click.option("--plain", is_flag=True, help="Plain status lines even on a terminal.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE.json", help="Write counts, rates, options and failures here.")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve the run's numbers for Prometheus at http://HOST:PORT/metrics "
                   "(files, bytes, failures by reason, retries, in flight by host, the "
                   "concurrency limit, a request latency histogram, listing progress; port "
                   "0: any free one) and keep them in DEST/.bulkfetch/metrics.prom. Needs "
                   "bulkfetch[metrics].")
def get(url_or_dest: str, dest: str | None, from_file: str | None, quiet: bool, plain: bool,
        report_path: str | None, **flags: object) -> None:
    """Download every file URL lists into DEST; rerun the same command to resume.

    URL is a server speaking the seed API (GET /list, /list?next-marker=T, /get/NAME); or
    any paginated JSON listing API, described by a preset (--api gcs, github-releases,
    drf, hf-tree), a TOML file (--api-file) or flags (--items, --name, --size, --md5,
    --url, --next, --paginate ...; JMESPath into each page), with --header, --header-file,
    --bearer-env or --netrc for its credentials, e.g. `bulkfetch get --api gcs
    https://storage.example/storage/v1/b/BUCKET/o DEST`; or s3://BUCKET[/PREFIX] for
    the keys under PREFIX of an S3-compatible store, each stored under its key relative to
    PREFIX (credentials as the AWS tools find them). Exit status: 0 all done, 1 some files
    failed, 2 usage error (a listing that answers 401/403 too), 130 interrupted (resumable).
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
    if report_path:
        _require_report_directory(report_path)
    flags["verify"] = not flags.pop("no_verify")
    if not flags["allow_cross_host_pages"]:  # not given: the preset's, if it says
        flags["allow_cross_host_pages"] = None
    save_cols = flags.pop("save_cols")
    flags["save_cols"] = tuple(c.strip() for c in str(save_cols).split(",") if c.strip()) \
        if save_cols is not None else ()
    from bulkfetch.util.sizes import parse_bytes

    for flag in ("shard_size", "max_page_size", "spool_above", "split_above", "limit_rate"):
        try:
            flags[flag] = parse_bytes(str(flags[flag]))
        except UsageError as exc:
            raise _usage(UsageError(f"--{flag.replace('_', '-')}: {exc}")) from None
    try:
        options = build_options(source, target, from_file=from_file is not None,
                                **flags)  # type: ignore[arg-type]
    except UsageError as exc:
        raise _usage(exc) from None
    _warn_above_open_files(options)
    if options.crawl is not None and flags["api"] != "index" and not quiet:
        click.echo(f"bulkfetch: {safe_text(source)} answers a directory listing: crawling the "
                   "tree under it (as --api index)", err=True)
    if options.tls.insecure:  # said even with --quiet: the data is not protected
        from bulkfetch.net.tls import INSECURE_WARNING

        click.echo(INSECURE_WARNING, err=True)
    if options.sync.dry_run:
        sys.exit(_dry_run(options, quiet))
    from bulkfetch.cli.run import run_download

    report = run_download(options, quiet=quiet, plain=plain, report_path=report_path)
    sys.exit(report.exit_code)


def _require_report_directory(report_path: str) -> None:
    """A --report that could not be written is said before the download, not after it."""
    import os
    from pathlib import Path

    directory = Path(report_path).parent
    if not directory.is_dir():
        raise click.UsageError(f"--report {safe_text(report_path)}: the directory "
                               f"{safe_text(str(directory))} does not exist; create it or "
                               "give another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise click.UsageError(f"--report {safe_text(report_path)}: cannot write in "
                               f"{safe_text(str(directory))}; give another path")


def _warn_above_open_files(options: GetOptions) -> None:
    """A fixed --concurrency the open-file limit cannot hold is lowered in each worker
    (engine/fetcher.py); said here, once, even with --quiet."""
    from bulkfetch.engine.adaptive import open_file_ceiling

    if options.runner.kind != "local":  # Ray actors run under their nodes' own limits
        return
    wanted, ceiling = options.limits.concurrency, open_file_ceiling()
    if not options.limits.adaptive and wanted > ceiling:
        click.echo(f"bulkfetch: --concurrency {wanted} is more than the open-file limit "
                   f"allows: each worker keeps {ceiling} transfers in flight (raise the "
                   "limit with `ulimit -n`)", err=True)


def _dry_run(options: GetOptions, quiet: bool) -> int:
    """get --sync --dry-run: each file --delete would remove on stdout, counts on stderr."""
    from bulkfetch.runners.sync import dry_run
    from bulkfetch.util.redact import safe_name

    try:
        listed, missing, gone, refusal = dry_run(
            options, lambda path: click.echo(f"would delete {safe_name(path)}"))
    except UsageError as exc:
        raise _usage(exc) from None
    except BulkfetchError as exc:
        click.echo(f"bulkfetch: {exc}", err=True)
        return 1
    if not quiet:
        would = (f"--delete would remove {gone:,} files" if refusal is None else
                 f"--delete would refuse to remove the {gone:,} files ("
                 + ("an empty listing" if not listed else
                    f"more than --max-delete {options.sync.max_delete}") + ")")
        click.echo(f"bulkfetch: dry run: {listed:,} files listed, {missing:,} of them not in "
                   f"{options.dest}; {would}. Nothing was fetched or removed.", err=True)
    return 0
