"""What the generic JSON listing costs the lister per page (issue 25's speed bar: at most
1.5x the seed API's fast path per page of 1,000 items):

    python benchmarks/listing.py [--items 1000] [--pages 1000] [--rounds 5] [--no-server]

Parse rows: one page's JSON body, already in memory, turned into a ListedPage (json.loads
and the shape's extraction), the median over rounds of the mean of --pages parses:

- seed fast path:   FileServerSource (json.loads, the "".join type check, a tuple);
- json, seed page:  JsonApiSource reading the same body through --items FileNames --next
                    NextMarker --next-param next-marker (the bar: the same page, the
                    JMESPath machinery's cost alone);
- json, gcs / drf / github-releases / hf-tree pages: each preset on a page of its own
  shape, 1,000 items with their sizes and digests (more JSON per item, so more to parse;
  the ratio is to the seed page's, and shows what the richer pages cost). Beside each row:
  json.loads of that body alone, and the rest (the paths, sizes, digests, URLs).

Directory listing rows: an nginx autoindex page (bulkfetch serve's byte-for-byte copy of
nginx 1.22.1's, server/index_shape.py) of 48 entries (a directory of benchmarks/tree.py's
tree) and of --items entries, read by sources/autoindex.parse_listing: as it reads them
(each plain <pre> line by one regular expression) and through the tokenizer alone (the
line lane turned off), per page and per entry; and the same entries as nginx's JSON page.

Loopback rows (unless --no-server): list_page() over HTTP from `bulkfetch serve --page-size
ITEMS`, --pages pages each way, seed fast path against the JSON source on the same pages.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import statistics
import time
from collections.abc import Callable

from bulkfetch.config import ApiShape, SourceShape, Timeouts
from bulkfetch.sources.apis import resolve_shape
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.sources.jsonapi import JsonApiSource

BAR = 1.5


def names(count: int) -> list[str]:
    return [f"d{i % 97:02d}/f{i:010d}" for i in range(count)]


def seed_page(count: int) -> bytes:
    return json.dumps({"FileNames": names(count), "NextMarker": "token-2"}).encode()


def _digests(name: str) -> tuple[bytes, bytes]:
    return hashlib.md5(name.encode()).digest(), hashlib.sha256(name.encode()).digest()


def gcs_page(count: int) -> bytes:
    items = []
    for name in names(count):
        md5, _ = _digests(name)
        items.append({"kind": "storage#object", "name": name, "bucket": "b", "size": "1234",
                      "md5Hash": base64.b64encode(md5).decode(), "generation": "1",
                      "mediaLink": f"https://storage.example/download/storage/v1/b/b/o/"
                                   f"{name.replace('/', '%2F')}?generation=1&alt=media",
                      "contentType": "application/octet-stream"})
    return json.dumps({"kind": "storage#objects", "nextPageToken": "T2",
                       "items": items}).encode()


def drf_page(count: int) -> bytes:
    results = [{"name": name, "size": 1234, "md5": _digests(name)[0].hex(),
                "url": f"/media/{name}"} for name in names(count)]
    return json.dumps({"count": 10 ** 6, "next": "https://api.example/api/files/?page=2",
                       "previous": None, "results": results}).encode()


def github_page(count: int) -> bytes:
    return json.dumps([{"name": name, "size": 1234, "state": "uploaded",
                        "digest": "sha256:" + _digests(name)[1].hex(),
                        "browser_download_url": f"https://github.example/r/{name}"}
                       for name in names(count)]).encode()


def hf_page(count: int) -> bytes:
    return json.dumps([{"type": "file", "path": name, "size": 1234, "oid": "ab" * 20,
                        "lfs": {"oid": _digests(name)[1].hex(), "size": 1234,
                                "pointerSize": 133}} for name in names(count)]).encode()


def loads_only(body: bytes, pages: int, rounds: int) -> float:
    return per_page(lambda: json.loads(body), pages, rounds)


def per_page(parse: Callable[[], object], pages: int, rounds: int) -> float:
    """Median over rounds of the mean seconds of one parse."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(pages):
            parse()
        times.append((time.perf_counter() - started) / pages)
    return statistics.median(times)


def preset_source(api: str, url: str) -> JsonApiSource:
    shape, api_shape = resolve_shape(api, None, {}, generic=True)
    assert api_shape is not None
    return JsonApiSource(url, shape, api_shape)


def parse_rows(count: int, pages: int, rounds: int) -> list[tuple[str, float, float]]:
    seed_body = seed_page(count)
    fast = FileServerSource("http://h:1", SourceShape(), Timeouts())
    generic = JsonApiSource("http://h:1", SourceShape(),
                            ApiShape(items="FileNames", next="NextMarker",
                                     next_param="next-marker"))
    # the same answer to both: a ListedPage of the same items and token
    assert fast._validate(json.loads(seed_body), [], "u").items == \
        generic.parse(json.loads(seed_body), None, generic.list_url).items
    seed_loads = loads_only(seed_body, pages, rounds)
    rows = [("seed fast path", per_page(
                lambda: fast._validate(json.loads(seed_body), [], "u"), pages, rounds),
             seed_loads),
            ("json, seed page", per_page(
                lambda: generic.parse(json.loads(seed_body), None, generic.list_url), pages,
                rounds), seed_loads)]
    hub_link = [b'Link: <https://hub.example/api/models/o/r/tree/main?cursor=x>; '
                b'rel="next"\r\n']
    github_link = [b'Link: <https://api.example/repos/o/r/releases/1/assets?page=2>; '
                   b'rel="next"\r\n']
    for api, url, body, headers in (
            ("gcs", "https://storage.example/storage/v1/b/b/o", gcs_page(count), []),
            ("drf", "https://api.example/api/files/", drf_page(count), []),
            ("github-releases", "https://api.example/repos/o/r/releases/1/assets",
             github_page(count), github_link),
            ("hf-tree", "https://hub.example/api/models/o/r/tree/main", hf_page(count),
             hub_link)):
        source = preset_source(api, url)
        page = source.parse(json.loads(body), None, url, headers)
        assert len(page.items) == count and page.md5s is not None
        rows.append((f"json, {api} page ({len(body) // count} B/item)", per_page(
            lambda source=source, body=body, url=url, headers=headers: source.parse(
                json.loads(body), None, url, headers), pages, rounds),
            loads_only(body, pages, rounds)))
    return rows


def directory_rows(count: int, pages: int, rounds: int) -> list[tuple[str, float, int]]:
    """(label, seconds a page, entries a page) of directory listing pages read."""
    from bulkfetch.server.index_shape import Listed, nginx_html, nginx_json
    from bulkfetch.sources import autoindex_html
    from bulkfetch.sources.autoindex import parse_listing

    url = "http://127.0.0.1:8080/tree/t000/"
    rows = []
    for entries in (48, count):
        listed = [Listed(f"f{i:06d}.bin", False, 1795952700 + i, 100 + i) for i in range(entries)]
        html = nginx_html("/tree/t000/", listed)
        lane = parse_listing(html, "text/html", url)
        def read(page: bytes = html, kind: str = "text/html") -> object:
            return parse_listing(page, kind, url)

        original = autoindex_html._plain_lines
        autoindex_html._plain_lines = lambda text, at, into: at
        try:
            assert read() == lane  # the same listing both ways
            alone = per_page(read, pages, rounds)
        finally:
            autoindex_html._plain_lines = original
        body = nginx_json(listed)
        rows += [(f"nginx html, {entries} entries", per_page(read, pages, rounds), entries),
                 (f"nginx html, {entries} entries, tokenizer alone", alone, entries),
                 (f"nginx json, {entries} entries", per_page(
                     lambda body=body: read(body, "application/json"), pages, rounds),
                  entries)]
    return rows


def loopback_rows(count: int, pages: int, rounds: int) -> list[tuple[str, float]]:
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--files", str(count * (pages + 1)), "--page-size", str(count)) \
            as server:
        fast = FileServerSource(server.url, SourceShape(), Timeouts())
        generic = JsonApiSource(server.url, SourceShape(),
                                ApiShape(items="FileNames", next="NextMarker",
                                         next_param="next-marker"))

        def walk(source: FileServerSource | JsonApiSource) -> Callable[[], None]:
            def run() -> None:
                token = None
                for _ in range(pages):
                    token = source.list_page(token).next_token
            return run

        walk(fast)()  # the server renders its pages once
        rows = []
        for label, source in (("seed fast path, over HTTP", fast),
                              ("json, seed page, over HTTP", generic)):
            rows.append((label, per_page(walk(source), 1, rounds) / pages))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-server", action="store_true")
    args = parser.parse_args()
    rows = parse_rows(args.items, args.pages, args.rounds)
    base = rows[0][1]
    print(f"listing parse, {args.items:,} items a page, median of {args.rounds} rounds of "
          f"{args.pages:,} pages")
    print(f"{'':44} {'us/page':>10} {'x seed':>8} {'json.loads us':>14} {'paths us':>9}")
    for label, seconds, loads in rows:
        print(f"{label:44} {seconds * 1e6:10.1f} {seconds / base:8.2f} {loads * 1e6:14.1f} "
              f"{(seconds - loads) * 1e6:9.1f}")
    same = rows[1][1] / base
    print(f"bar: the seed page through the JSON source <= {BAR}x the fast path: "
          f"{same:.2f}x {'PASS' if same <= BAR else 'FAIL'}")
    print(f"\ndirectory listing pages read (parse_listing), median of {args.rounds} rounds "
          f"of {args.pages:,} pages")
    print(f"{'':44} {'us/page':>10} {'us/entry':>9}")
    for label, seconds, entries in directory_rows(args.items, args.pages, args.rounds):
        print(f"{label:44} {seconds * 1e6:10.1f} {seconds * 1e6 / entries:9.2f}")
    if not args.no_server:
        loop = loopback_rows(args.items, min(args.pages, 300), args.rounds)
        print(f"\nlist_page() over loopback HTTP ({min(args.pages, 300)} pages each)")
        for label, seconds in loop:
            print(f"{label:44} {seconds * 1e6:10.1f} {seconds / loop[0][1]:8.2f}")


if __name__ == "__main__":
    main()
