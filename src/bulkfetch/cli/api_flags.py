"""The flags of `get` that describe a JSON listing API other than the seed API (its shape,
its pagination) and the headers its requests carry. They only name things: the shape is
resolved in bulkfetch.sources.apis, the headers read in bulkfetch.sources.headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

_PATH = "PATH"
_OPTIONS = [
    click.option("--api", default=None,
                 type=click.Choice(["seed", "gcs", "github-releases", "drf", "hf-tree",
                                    "index"]),
                 help="index: crawl a web server's directory listings (nginx autoindex, "
                      "Apache, lighttpd, Caddy, python -m http.server) under URL; a URL "
                      "ending in '/' that answers one is crawled without it. A known JSON "
                      "listing API's shape: gcs (Cloud Storage JSON API, URL "
                      ".../storage/v1/b/BUCKET/o), github-releases (URL .../releases/ID/"
                      "assets), drf (Django REST framework {count, next, results}), hf-tree "
                      "(URL https://huggingface.co/api/models/ORG/REPO/tree/REV), seed. "
                      "Flags given explicitly override it."),
    click.option("--api-file", default=None, type=click.Path(dir_okay=False),
                 metavar="FILE.toml",
                 help="A listing API's shape from a TOML file (over --api), keys named as "
                      "these flags: list_path, get_template, items, name, size, md5, sha256, "
                      "url, total, next (JMESPath strings), paginate, next_param, page_param, "
                      "limit_param (strings), page_size, first_page (integers), "
                      "allow_cross_host_pages (true/false), description (ignored). See "
                      "README.md."),
    click.option("--items", default=None, metavar=_PATH,
                 help="JMESPath to the page's list of items, e.g. items, results, "
                      "[?type=='file'] (@: the page is the list). Any of these flags turns "
                      "the generic JSON listing on; the URL is then the listing's own "
                      "(no --list-path added unless given)."),
    click.option("--name", "name_path", default=None, metavar=_PATH,
                 help="JMESPath to an item's name, the file's path under DEST [default: @, "
                      "the item itself]."),
    click.option("--size", "size_path", default=None, metavar=_PATH,
                 help="JMESPath to an item's size in bytes (a number or decimal string): a "
                      "body of another size fails as changed since it was listed."),
    click.option("--md5", "md5_path", default=None, metavar=_PATH,
                 help="JMESPath to an item's MD5 (hex or base64, as GCS's md5Hash): each "
                      "body is checked against it."),
    click.option("--sha256", "sha256_path", default=None, metavar=_PATH,
                 help="JMESPath to an item's SHA-256 (hex, base64 or sha256:HEX), checked "
                      "when no --md5 is listed for the item."),
    click.option("--url", "url_path", default=None, metavar=_PATH,
                 help="JMESPath to an item's own URL (absolute, or relative to the page); "
                      "an item without one is fetched by --get-template."),
    click.option("--total", "total_path", default=None, metavar=_PATH,
                 help="JMESPath to the whole listing's number of files (DRF's count), for "
                      "the progress display."),
    click.option("--paginate", default=None,
                 type=click.Choice(["token", "url", "link", "offset", "page", "none"]),
                 help="How the next page is asked for: token (--next holds a token, sent as "
                      "--next-param), url (--next holds the next page's URL), link (the "
                      "Link: <...>; rel=\"next\" header), offset or page (--page-param, "
                      "--limit-param, --page-size), none. [default: token with --next and "
                      "--next-param, url with --next alone, page with --page-param, else "
                      "link]"),
    click.option("--next", "next_path", default=None, metavar=_PATH,
                 help="JMESPath to the next page's token or URL (null or absent: the last "
                      "page)."),
    click.option("--next-param", default=None, metavar="NAME",
                 help="Query parameter that carries --next's token (GCS: pageToken)."),
    click.option("--page-param", default=None, metavar="NAME",
                 help="offset/page: the query parameter holding the offset or page number."),
    click.option("--limit-param", default=None, metavar="NAME",
                 help="offset/page: the query parameter holding --page-size."),
    click.option("--page-size", type=click.IntRange(min=1), default=None,
                 help="offset/page: items a page holds; a shorter page is the last (page: "
                      "so is a 404 after the first page, as Django REST framework "
                      "answers past the end)."),
    click.option("--first-page", type=int, default=None,
                 help="page: the first page's number [default: 1; offset: 0]."),
    click.option("--allow-cross-host-pages", is_flag=True, default=None,
                 help="url/link: follow a next page on another host than the listing's "
                      "(headers are still sent to the listing's host only)."),
]
_HEADER_OPTIONS = [
    click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'",
                 help="Send this header with listing and file requests, only to the "
                      "listing's host and the files' hosts, never across a redirect to "
                      "another host (repeatable). Values are masked in every output; prefer "
                      "--header-file or --bearer-env for secrets."),
    click.option("--header-file", default=None, type=click.Path(dir_okay=False),
                 metavar="FILE",
                 help="Headers as 'Name: value' lines (# comments allowed; '-' reads stdin), "
                      "sent as --header's: a token stays out of the process list and shell "
                      "history."),
    click.option("--bearer-env", default=None, metavar="VAR",
                 help="Send 'Authorization: Bearer <token>' with the token from environment "
                      "variable VAR (as --header)."),
    click.option("--netrc", is_flag=True,
                 help="Log in with ~/.netrc's entry for the host (libcurl's netrc; it sends "
                      "a host's credentials to that host only)."),
]


def api_options(command: F) -> F:
    """Decorate `get` with the listing-shape and header flags."""
    for option in reversed(_OPTIONS + _HEADER_OPTIONS):
        command = option(command)
    return command


def header_options(command: F) -> F:
    """Decorate `ls` with the header flags (for a directory tree's listings)."""
    for option in reversed(_HEADER_OPTIONS):
        command = option(command)
    return command
