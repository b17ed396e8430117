"""The s3:// and TLS flags `get` and `ls` share, and `bulkfetch ls s3://BUCKET[/PREFIX]`: the bucket
listed in parallel key ranges (listing/range_lister.py), one name a line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

S3_FLAGS = ("endpoint_url", "region", "profile", "no_sign_request", "addressing_style",
            "include", "exclude", "list_concurrency")

_OPTIONS = [
    click.option("--endpoint-url", default=None, metavar="URL",
                 help="s3://: the store's endpoint, e.g. http://127.0.0.1:8333 [default: "
                      "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url, "
                      "else AWS: https://s3.REGION.amazonaws.com]."),
    click.option("--region", default=None,
                 help="s3://: the region requests are signed for [default: AWS_REGION, "
                      "AWS_DEFAULT_REGION, the profile's region, else us-east-1]."),
    click.option("--profile", default=None,
                 help="s3://: take credentials, region and endpoint from this profile of "
                      "~/.aws/credentials and ~/.aws/config [default: AWS_ACCESS_KEY_ID/"
                      "AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, else AWS_PROFILE or "
                      "'default']."),
    click.option("--no-sign-request", is_flag=True,
                 help="s3://: send unsigned requests (a public bucket); no credentials read."),
    click.option("--addressing-style", type=click.Choice(["auto", "path", "virtual"]),
                 default="auto", show_default=True,
                 help="s3://: path (ENDPOINT/BUCKET/KEY) or virtual-hosted "
                      "(BUCKET.ENDPOINT/KEY); auto: virtual-hosted on AWS for names that "
                      "allow it, path elsewhere."),
    click.option("--include", multiple=True, metavar="GLOB",
                 help="s3://: take only names (keys under the prefix) matching a glob; "
                      "repeatable; '*' also matches '/'."),
    click.option("--exclude", multiple=True, metavar="GLOB",
                 help="s3://: skip names matching a glob (wins over --include); repeatable."),
    click.option("--list-concurrency", type=click.IntRange(min=1), default=32,
                 show_default=True,
                 help="s3://: listing requests in flight. The key space is split into "
                      "ranges listed at once (split again where one turns out long); a "
                      "`get` journals each range, so a rerun lists only what is left."),
]


_TLS_OPTIONS = [
    click.option("--ca-bundle", default=None, metavar="FILE",
                 help="Trust the CA certificates in this PEM file (a private CA's, or a "
                      "self-signed server's own certificate) for every https:// request, "
                      "instead of the system's; a directory prepared by `openssl rehash` works "
                      "too. Without it, the first of REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and "
                      "SSL_CERT_FILE that is set is used. A refused certificate stops the run "
                      "(exit status 2); it is never retried."),
    click.option("--insecure", is_flag=True,
                 help="Do not verify TLS certificates or host names (a test server only: "
                      "anyone on the network path could read or alter the data); the CA "
                      "variables above are then ignored. Prints a warning when the run starts."),
]


def tls_options(function: F) -> F:
    """--ca-bundle and --insecure, as click options of `function`."""
    for option in reversed(_TLS_OPTIONS):
        function = option(function)
    return function


def s3_options(function: F) -> F:
    """The s3:// flags, as click options of `function` (in --help in this order)."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def list_bucket(url: str, long_format: bool, flags: dict[str, Any],
                shown: Callable[[str], str]) -> None:
    """Print the names under s3://BUCKET/PREFIX, in the order their ranges come back (use
    `sort` for key order); with `long_format`, size TAB name."""
    from bulkfetch.config import RetryPolicy, S3Options, Timeouts
    from bulkfetch.errors import UsageError
    from bulkfetch.listing.lister import ListingFailed, ListingFinished
    from bulkfetch.listing.range_lister import RangeLister
    from bulkfetch.net.tls import INSECURE_WARNING, resolve_tls
    from bulkfetch.sources.s3 import S3Source
    from bulkfetch.util.names import all_plain

    try:
        tls = resolve_tls(flags["ca_bundle"], flags["insecure"])
        options = S3Options(flags["endpoint_url"], flags["region"], flags["profile"],
                            flags["no_sign_request"], flags["addressing_style"],
                            tuple(flags["include"]), tuple(flags["exclude"]),
                            flags["list_concurrency"])
        source = S3Source(url, options, Timeouts(), tls=tls)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    if tls.insecure:
        click.echo(INSECURE_WARNING, err=True)
    lister = RangeLister(source, RetryPolicy(), [], [], 0, True, ahead=256,
                         concurrency=options.list_concurrency)
    lister.start()
    # Written a megabyte at a time: each write lets the GIL go to the listing threads, and
    # getting it back costs up to a switch interval (5 ms), so a write a line (click's
    # stream is line-buffered) or a page made the printing, not the listing, the limit.
    sys.stdout.flush()
    out = open(sys.stdout.fileno(), "w", encoding="utf-8",  # noqa: SIM115
               buffering=1 if sys.stdout.isatty() else 1 << 20, errors="surrogateescape",
               closefd=False)
    listed = 0
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
            # plain names (no refusal marked, nothing to quote) are shown as they are
            names = items if page.plain or all_plain(items) else [
                shown(item.partition("\0")[0]) for item in items]
            if long_format and page.sizes is not None:
                out.write("".join(f"{size}\t{name}\n"
                                  for size, name in zip(page.sizes, names, strict=True)))
            else:
                out.write("\n".join(names) + "\n" if names else "")
            listed += len(names)
    finally:
        lister.stop()
        out.flush()

