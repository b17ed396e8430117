"""The flags of a remote listing (s3://, a web server's directory tree) and of TLS, which
`get` and `ls` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

S3_FLAGS = ("endpoint_url", "region", "profile", "no_sign_request", "addressing_style",
            "include", "exclude", "list_concurrency", "max_depth")

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
                 help="s3:// and directory listings: take only names (keys under the "
                      "prefix, paths under the URL) matching a glob; repeatable; '*' also "
                      "matches '/'."),
    click.option("--exclude", multiple=True, metavar="GLOB",
                 help="s3:// and directory listings: skip names matching a glob (wins over "
                      "--include); repeatable."),
    click.option("--list-concurrency", type=click.IntRange(min=1), default=None,
                 help="Listing requests in flight. s3:// (default 32): the key space is "
                      "split into ranges listed at once (split again where one turns out "
                      "long). Directory listings (default 8): directories listed at once. "
                      "A `get` journals what it listed, so a rerun lists only what is "
                      "left."),
    click.option("--max-depth", type=click.IntRange(min=0), default=None,
                 help="Directory listings: crawl at most this many levels below URL (0: "
                      "URL's own files only) [default: all]."),
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
