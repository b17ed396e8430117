"""`bulkfetch ls` of a remote source: the keys under s3://BUCKET[/PREFIX], listed in parallel key
ranges (listing/range_lister.py), or the files of a web server's directory tree under an
http(s):// URL, directories listed at once (listing/tree_lister.py). One name a line, as
the listing comes back (pipe to `sort` for order)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from bulkfetch.listing.lister import ListerThread


def list_bucket(url: str, long_format: bool, flags: dict[str, Any],
                shown: Callable[[str], str]) -> None:
    """Print the names under s3://BUCKET/PREFIX; with `long_format`, size TAB name."""
    from bulkfetch.config import RetryPolicy, S3Options, Timeouts
    from bulkfetch.errors import UsageError
    from bulkfetch.listing.range_lister import RangeLister
    from bulkfetch.net.tls import resolve_tls
    from bulkfetch.sources.s3 import S3Source

    if flags["max_depth"] is not None:
        raise click.UsageError("--max-depth applies to a web server's directory listing, "
                               f"not to {url!r}")
    try:
        tls = resolve_tls(flags["ca_bundle"], flags["insecure"])
        options = S3Options(flags["endpoint_url"], flags["region"], flags["profile"],
                            flags["no_sign_request"], flags["addressing_style"],
                            tuple(flags["include"]), tuple(flags["exclude"]),
                            flags["list_concurrency"] or S3Options.list_concurrency)
        source = S3Source(url, options, Timeouts(), tls=tls)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    _warn_insecure(tls.insecure)
    _print(RangeLister(source, RetryPolicy(), [], [], 0, True, ahead=256,
                       concurrency=options.list_concurrency), long_format, shown)


def list_tree(url: str, long_format: bool, flags: dict[str, Any], auth: dict[str, Any],
              shown: Callable[[str], str]) -> None:
    """Print the files of the directory tree under `url` (paths relative to it); with
    `long_format`, size TAB name (-1: the listing gives no exact size). `auth`: the header
    flags (sources/headers.py build_auth's arguments)."""
    from bulkfetch.config import CrawlOptions, RetryPolicy, Timeouts
    from bulkfetch.errors import UsageError
    from bulkfetch.listing.tree_lister import TreeLister
    from bulkfetch.net.tls import resolve_tls
    from bulkfetch.sources.crawl import IndexSource
    from bulkfetch.sources.headers import build_auth

    s3_only = [f"--{name.replace('_', '-')}" for name in
               ("endpoint_url", "region", "profile", "no_sign_request")
               if flags[name] not in (None, False)]
    if s3_only or flags["addressing_style"] != "auto":
        raise click.UsageError(f"{', '.join(s3_only) or '--addressing-style'} apply to an "
                               f"s3:// URL, not to {url!r}")
    try:
        tls = resolve_tls(flags["ca_bundle"], flags["insecure"])
        crawl = CrawlOptions(flags["max_depth"], tuple(flags["include"]),
                             tuple(flags["exclude"]),
                             flags["list_concurrency"] or CrawlOptions.list_concurrency)
        source = IndexSource(url, crawl, Timeouts(), 16 << 20, tls, build_auth(**auth))
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    _warn_insecure(tls.insecure)
    _print(TreeLister(source, RetryPolicy(), [], [], 0, True, ahead=256,
                      concurrency=crawl.list_concurrency), long_format, shown)


def _warn_insecure(insecure: bool) -> None:
    if insecure:
        from bulkfetch.net.tls import INSECURE_WARNING

        click.echo(INSECURE_WARNING, err=True)


def _print(lister: ListerThread, long_format: bool, shown: Callable[[str], str]) -> None:
    from bulkfetch.listing.lister import ListingFailed, ListingFinished
    from bulkfetch.util.names import all_plain

    lister.start()
    # Written a megabyte at a time: each write lets the GIL go to the listing threads, and
    # getting it back costs up to a switch interval (5 ms), so a write a line (click's
    # stream is line-buffered) or a page made the printing, not the listing, the limit.
    sys.stdout.flush()
    out = open(sys.stdout.fileno(), "w", encoding="utf-8",  # noqa: SIM115
               buffering=1 if sys.stdout.isatty() else 1 << 20, errors="surrogateescape",
               closefd=False)
    failed = 0
    try:
        while True:
            event = lister.out.get()
            if isinstance(event, ListingFinished):
                break
            if isinstance(event, ListingFailed):
                click.echo(f"bulkfetch: {event.message}", err=True)
                raise SystemExit(2 if event.usage else 1)
            page = event.page
            items = page.items
            if not page.plain and any("\0" in item for item in items):
                # a refused item (a directory that could not be listed) is said, not listed
                for item in items:
                    name, _, reason = item.partition("\0\0")
                    if reason:
                        click.echo(f"bulkfetch: {shown(name)}: {reason}", err=True)
                        failed += 1
                items = tuple(item for item in items if "\0\0" not in item)
            # plain names (nothing to quote) are shown as they are
            names = items if page.plain or all_plain(items) else [
                shown(item.partition("\0")[0]) for item in items]
            sizes = page.sizes
            if long_format and sizes is not None and len(sizes) == len(names):
                out.write("".join(f"{size}\t{name}\n"
                                  for size, name in zip(sizes, names, strict=True)))
            elif long_format:
                out.write("".join(f"-1\t{name}\n" for name in names))
            else:
                out.write("\n".join(names) + "\n" if names else "")
    finally:
        lister.stop()
        out.flush()
    if failed:
        raise SystemExit(1)
