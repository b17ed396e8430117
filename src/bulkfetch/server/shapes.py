"""`bulkfetch serve --shape NAME`: the data set listed as four real listing APIs list files,
so every pagination style a client follows is tested end to end. No sockets here.

Each shape lists the same names (the synthetic data set in index order, any other data set
in its own order), states each file's size and digests (MD5, or SHA-256 where the API
states that), and serves the bytes from its own download URL, through the seed App's file
answers: ETag (quoted hex MD5), Range, conditional requests, faults. The seed API (/list,
/get/NAME) is still served beside it. The fault switches apply as they do to the seed API:
a list page is faulted as a list page (never redirected), a download as a file.

gcs: Google Cloud Storage's JSON API, objects.list and objects.get
(https://cloud.google.com/storage/docs/json_api/v1/objects/list,
https://cloud.google.com/storage/docs/json_api/v1/objects#resource,
https://cloud.google.com/storage/docs/json_api/v1/objects/get):

    GET /storage/v1/b/bulkfetch/o[?pageToken=T][&maxResults=N]
    -> {"kind": "storage#objects", "nextPageToken": "T2", "items": [OBJECT, ...]}
    OBJECT = {"kind": "storage#object", "id": "bulkfetch/NAME/GEN", "selfLink": URL,
              "mediaLink": URL, "name": NAME, "bucket": "bulkfetch", "generation": "GEN",
              "metageneration": "1", "contentType": "application/octet-stream",
              "storageClass": "STANDARD", "size": "100" (a string, as GCS sends uint64),
              "md5Hash": base64 of the MD5, "etag": "...", "timeCreated": RFC 3339,
              "updated": RFC 3339, "timeStorageClassUpdated": RFC 3339}
    GET /storage/v1/b/bulkfetch/o/NAME?alt=media          the bytes (NAME percent-encoded,
    GET /download/storage/v1/b/bulkfetch/o/NAME?alt=media  '/' as %2F); without alt=media,
                                                           OBJECT alone
    nextPageToken is left out on the last page and "items" on an empty one, as GCS does.
    maxResults defaults to --page-size and is capped by it (GCS's cap is 1,000). prefix,
    delimiter, startOffset, endOffset, matchGlob and versions are refused (400); crc32c is
    not stated. Errors: {"error": {"code", "message", "errors": [...]}}.

link: GitHub's and GitLab's Link-header pagination
(https://docs.github.com/en/rest/using-the-rest-api/using-pagination-in-the-rest-api,
https://docs.github.com/en/rest/releases/assets,
https://docs.gitlab.com/api/rest/#pagination-link-header):

    GET /files[?page=N][&per_page=M]   (N from 1; M defaults to --page-size, capped by it)
    -> [{"id": N, "name": NAME, "path": NAME, "type": "file", "size": 100,
         "content_type": "application/octet-stream", "state": "uploaded",
         "digest": "sha256:HEX", "md5": "HEX", "download_url": URL,
         "browser_download_url": URL, "created_at": ISO 8601, "updated_at": ISO 8601}, ...]
    Link: <http://HOST/files?page=N-1&per_page=M>; rel="prev", <...page=N+1...>; rel="next",
          <...page=LAST...>; rel="last", <...page=1...>; rel="first"
    GET /raw/NAME                       the bytes
    URLs are absolute, as GitHub sends them; prev/first are left out on page 1, next/last on
    the last page; a page past the last is []. GitLab's X-Page, X-Per-Page, X-Total,
    X-Total-Pages, X-Next-Page and X-Prev-Page headers come too. "name" is the whole name
    (with --nested, directories included); "md5" is not GitHub's: it lets a client check an
    MD5 without splitting "digest".

drf: Django REST framework's PageNumberPagination and LimitOffsetPagination
(https://www.django-rest-framework.org/api-guide/pagination/):

    GET /api/files/[?page=N]             (N from 1, or "last"; 404 {"detail": "Invalid
                                          page."} past the last)
    GET /api/files/?limit=L&offset=O      (as soon as either is sent; L defaults to, and is
                                          capped by, --page-size)
    -> {"count": FILES, "next": URL or null, "previous": URL or null,
        "results": [{"name": NAME, "size": 100, "md5": "HEX", "url": URL}, ...]}
    GET /media/NAME                       the bytes
    next and previous are absolute, built as DRF builds them (the request's query with the
    page, or limit and offset, replaced; page 1 and offset 0 leave the parameter out).
    GET /api/files without the slash is 301 to it, as Django's APPEND_SLASH answers.

hf-tree: the Hugging Face Hub's repository tree, in server/hf_shape.py.

Tokens and cursors (gcs, hf-tree) are a position in the listing under TokenCodec's MAC,
bound to the data set and the shape; page numbers and offsets are positions too, so every
page can be asked for again, after a restart too. --stale-rate and --lie-md5 make a
listing misstate a file: another MD5 and SHA-256 (for "size", another size too) than the
file's answer carries, so a client that checks the listing fails exactly those files.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from bulkfetch.server.app import App, Response, json_response
from bulkfetch.server.dataset import DataSet, SyntheticDataSet, SyntheticNames, every_name
from bulkfetch.server.faults import Fault
from bulkfetch.server.s3list import Stale
from bulkfetch.server.tokens import BadToken, TokenCodec

# index and index-json: server/index_shape.py (its apps in INDEX_APPS, which imports this)
SHAPES = ("seed", "gcs", "link", "drf", "hf-tree", "index", "index-json")
GCS_BUCKET = "bulkfetch"
HF_REPO = "bulkfetch/synthetic"
HF_REVISION = "main"
# Where each shape's listing starts, for the banner and --help (HOST: where it listens)
LISTING_PATHS = {
    "gcs": f"/storage/v1/b/{GCS_BUCKET}/o",
    "link": "/files",
    "drf": "/api/files/",
    "hf-tree": f"/api/models/{HF_REPO}/tree/{HF_REVISION}",
    "index": "/archive/",
    "index-json": "/archive/",
}
GCS_UNSUPPORTED = ("prefix", "delimiter", "startOffset", "endOffset", "matchGlob", "versions",
                   "includeTrailingDelimiter", "includeFoldersAsPrefixes")
# A Host header goes into absolute URLs (and Link headers) only when it is a plain
# host[:port]: anything else could break out of a URL or a <...> of the Link header.
_PLAIN_HOST = re.compile(r"(?:[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")


@dataclass(frozen=True, slots=True)
class Stated:
    """What a listing states of one file (misstated for --stale-rate and --lie-md5 names)."""

    name: str
    size: int
    md5: bytes  # raw
    sha256: bytes | None  # raw; None where the shape does not state it
    modified: int  # Unix time


def listed_names(dataset: DataSet) -> Sequence[str]:
    """Every name `dataset` lists, in its listing order, addressable by position."""
    if isinstance(dataset, SyntheticDataSet):
        return SyntheticNames(dataset)
    return every_name(dataset)


def _iso(epoch: int, millis: bool = True,
         cache: dict[tuple[int, bool], str] = {}) -> str:  # noqa: B006  (a deliberate cache)
    # A data set has a few distinct times (one per version): formatted once each
    found = cache.get((epoch, millis))
    if found is None:
        if len(cache) > 4096:
            cache.clear()
        found = cache[epoch, millis] = time.strftime(
            "%Y-%m-%dT%H:%M:%S.000Z" if millis else "%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    return found


_UNRESERVED = re.compile(r"[A-Za-z0-9_.\-~]*")


def _quoted(name: str, safe: str = "") -> str:
    """`name` percent-encoded as UTF-8 (a --root name's undecodable bytes as they were)."""
    if _UNRESERVED.fullmatch(name):  # synthetic names: nothing to encode, no call to quote
        return name
    return quote(name, safe=safe, errors="surrogateescape")


def _positive(text: str | None) -> int | None:
    """A decimal integer >= 1 (ASCII digits only), else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    value = int(text)
    return value if value >= 1 else None


class ShapeApp:
    """One shape's routes over a seed App (whose data set, faults and file answers it
    shares); subclasses route and render."""

    shape = ""
    needs_sha256 = False  # whether items state the SHA-256 (hashed only where stated)

    def __init__(self, app: App, fallback_origin: str) -> None:
        self.app = app
        self.fallback_origin = fallback_origin  # http://HOST:PORT, for a request without Host
        # A position in the listing, MAC'd; another shape's (or data set's) token is refused
        self.tokens = TokenCodec(f"{app.dataset.identity}/shape:{self.shape}")
        faults = app.faults
        self.misstate: Stale | None = (faults.stale if faults is not None
                                          and faults.config.misstates else None)
        self._names: Sequence[str] | None = None

    @property
    def trickle_interval(self) -> float:
        return self.app.trickle_interval

    @property
    def names(self) -> Sequence[str]:
        if self._names is None:  # on first use: a --root tree is walked once, not at start
            self._names = listed_names(self.app.dataset)
        return self._names

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path = target.partition("?")[0]
        if path == "/list" or path.startswith("/get/"):  # the seed API, beside the shape
            return self.app.handle(method, target, headers)
        if method not in ("GET", "HEAD"):
            return self.error(405, f"method {method} not allowed", [("Allow", "GET, HEAD")])
        return self.route(method, target, headers)

    def refuse(self, fault: Fault, target: str) -> Response:
        return self.app.refuse(fault, target)

    # -- for the subclasses --------------------------------------------------------------
    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        raise NotImplementedError

    def file_target(self, target: str) -> bool:
        """Whether `target` asks for a file's bytes (what --redirect-files-to redirects)."""
        raise NotImplementedError

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        return json_response(status, {"error": message}, extra=extra)

    def origin(self, headers: dict[str, str]) -> str:
        """http://HOST[:PORT] as the client named this server: absolute URLs in listings
        point where the client already connects."""
        host = headers.get("host", "")
        return f"http://{host}" if _PLAIN_HOST.fullmatch(host) else self.fallback_origin

    def state(self, name: str) -> Stated | None:
        """What the listing states of `name` (None: no such file any more, a --root file
        removed since the names were read)."""
        entry = self.app.dataset.lookup(name)
        if entry is None:
            return None
        # SHA-256 first: a large body's MD5 (the ETag) comes along in the same pass
        sha256 = entry.sha256() if self.needs_sha256 else None
        md5 = bytes.fromhex(entry.etag().strip('"'))
        size = entry.size
        kind = self.misstate(name) if self.misstate is not None else None
        if kind is not None:  # as if the file changed after it was listed
            md5 = hashlib.md5(md5).digest()
            sha256 = None if sha256 is None else hashlib.sha256(sha256).digest()
            size += kind == "size"
        return Stated(name, size, md5, sha256, entry.last_modified)

    def stated(self, start: int, stop: int) -> list[Stated]:
        names = self.names
        found = (self.state(names[i]) for i in range(start, min(stop, len(names))))
        return [item for item in found if item is not None]

    def position(self, token: str) -> int:
        """The listing position a token names; BadToken for one not issued here."""
        cursor = self.tokens.decode(token)
        if len(cursor) != 8:
            raise BadToken(token)
        at = int.from_bytes(cursor, "big")
        if not 0 < at < len(self.names):
            raise BadToken(token)
        return at

    def token(self, position: int) -> str | None:
        return self.tokens.encode(position.to_bytes(8, "big")) \
            if position < len(self.names) else None

    def list_page(self, method: str, target: str, headers: dict[str, str],
                  build: Callable[[], Response]) -> Response:
        return self.app.list_answer(method, target, headers, build)

    def file(self, quoted_name: str, method: str, target: str,
             headers: dict[str, str]) -> Response:
        return self.app.file_answer(quoted_name, method, target, headers)


# -- gcs ---------------------------------------------------------------------------------
class GcsApp(ShapeApp):
    shape = "gcs"
    CONTENT_TYPE = "application/json; charset=UTF-8"
    _LIST = f"/storage/v1/b/{GCS_BUCKET}/o"
    _OBJECT = _LIST + "/"
    _DOWNLOAD = "/download" + _OBJECT

    def file_target(self, target: str) -> bool:
        path, _, query = target.partition("?")
        return (path.startswith(self._OBJECT) or path.startswith(self._DOWNLOAD)) and \
            ("alt", "media") in parse_qsl(query)

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        reason = {400: "invalid", 401: "required", 404: "notFound",
                  405: "methodNotAllowed"}.get(status, "backendError")
        return json_response(status, {"error": {"code": status, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": reason}]}},
            self.CONTENT_TYPE, extra)

    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path, _, query = target.partition("?")
        if path == self._LIST:
            return self.list_page(method, target, headers,
                                  lambda: self._list(query, self.origin(headers)))
        for prefix in (self._OBJECT, self._DOWNLOAD):
            if path.startswith(prefix):
                quoted = path[len(prefix):]
                # The object name is one path segment: its '/' must come as %2F, as the
                # JSON API requires
                if not quoted or "/" in quoted:
                    break
                if ("alt", "media") in parse_qsl(query):
                    return self.file(quoted, method, target, headers)
                return self._object(quoted, headers)
        segments = path.removeprefix("/download").split("/")  # '', storage, v1, b, BUCKET
        if segments[1:4] == ["storage", "v1", "b"] and len(segments) > 4 \
                and segments[4] != GCS_BUCKET:
            return self.error(404, "The specified bucket does not exist.")
        return self.error(404, "Not Found")

    def _list(self, query: str, origin: str) -> Response:
        params = dict(parse_qsl(query, keep_blank_values=True))
        for name in GCS_UNSUPPORTED:
            if params.get(name):
                return self.error(400, f"{name} is not supported by bulkfetch serve")
        limit = self.app.dataset.page_size
        if "maxResults" in params:
            asked = _positive(params["maxResults"])
            if asked is None:
                return self.error(400, f"Invalid value for maxResults: "
                                       f"{params['maxResults']!r}")
            limit = min(asked, limit)  # --page-size plays GCS's cap of 1,000
        start = 0
        token = params.get("pageToken")
        if token:
            try:
                start = self.position(token)
            except BadToken:
                return self.error(400, "Invalid page token.")
        page: dict[str, object] = {"kind": "storage#objects"}
        following = self.token(start + limit)
        if following is not None:
            page["nextPageToken"] = following
        items = [self._resource(item, origin) for item in self.stated(start, start + limit)]
        if items:  # GCS leaves "items" out of an empty page
            page["items"] = items
        return json_response(200, page, self.CONTENT_TYPE)

    def _object(self, quoted: str, headers: dict[str, str]) -> Response:
        name = unquote(quoted, errors="surrogateescape")
        item = self.state(name)
        if item is None:
            return self.error(404, f"No such object: {GCS_BUCKET}/{name}")
        return json_response(200, self._resource(item, self.origin(headers)), self.CONTENT_TYPE)

    @staticmethod
    def _resource(item: Stated, origin: str) -> dict[str, object]:
        quoted = _quoted(item.name)
        generation = str(item.modified * 1_000_000)  # GCS generations are microseconds
        stamp = _iso(item.modified)
        return {
            "kind": "storage#object",
            "id": f"{GCS_BUCKET}/{item.name}/{generation}",
            "selfLink": f"{origin}/storage/v1/b/{GCS_BUCKET}/o/{quoted}",
            "mediaLink": f"{origin}/download/storage/v1/b/{GCS_BUCKET}/o/{quoted}"
                         f"?generation={generation}&alt=media",
            "name": item.name,
            "bucket": GCS_BUCKET,
            "generation": generation,
            "metageneration": "1",
            "contentType": "application/octet-stream",
            "storageClass": "STANDARD",
            "size": str(item.size),
            "md5Hash": base64.b64encode(item.md5).decode("ascii"),
            # GCS's etag is opaque base64, not the MD5: a client must not read one as other
            "etag": base64.b64encode(item.md5[:6] + b"\x10\x01").decode("ascii"),
            "timeCreated": stamp,
            "updated": stamp,
            "timeStorageClassUpdated": stamp,
        }


# -- link --------------------------------------------------------------------------------
class LinkApp(ShapeApp):
    shape = "link"
    needs_sha256 = True
    CONTENT_TYPE = "application/json; charset=utf-8"
    _LIST = "/files"
    _RAW = "/raw/"

    def file_target(self, target: str) -> bool:
        return target.startswith(self._RAW)

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        return json_response(status, {"message": message}, self.CONTENT_TYPE, extra)

    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path, _, query = target.partition("?")
        if path == self._LIST:
            return self.list_page(method, target, headers,
                                  lambda: self._list(query, self.origin(headers)))
        if path.startswith(self._RAW) and len(path) > len(self._RAW):
            return self.file(path[len(self._RAW):], method, target, headers)
        return self.error(404, "Not Found")

    def _list(self, query: str, origin: str) -> Response:
        params = dict(parse_qsl(query, keep_blank_values=True))
        number = _positive(params.get("page", "1"))
        if number is None:
            return self.error(400, f"Invalid page: {params.get('page')!r}")
        cap = self.app.dataset.page_size
        per_page = _positive(params.get("per_page", str(cap)))
        if per_page is None:
            return self.error(400, f"Invalid per_page: {params.get('per_page')!r}")
        per_page = min(per_page, cap)  # --page-size plays GitHub's cap of 100
        total = len(self.names)
        last = max(1, -(-total // per_page))
        start = (number - 1) * per_page
        items = [self._item(item, start + i, origin)
                 for i, item in enumerate(self.stated(start, start + per_page))]

        def url(page: int) -> str:
            return f"{origin}{self._LIST}?page={page}&per_page={per_page}"

        links = []  # in GitHub's order: prev, next, last, first
        if number > 1:
            links.append(f'<{url(number - 1)}>; rel="prev"')
        if number < last:
            links += [f'<{url(number + 1)}>; rel="next"', f'<{url(last)}>; rel="last"']
        if number > 1:
            links.append(f'<{url(1)}>; rel="first"')
        extra = [("X-Page", str(number)), ("X-Per-Page", str(per_page)),
                 ("X-Total", str(total)), ("X-Total-Pages", str(last)),
                 ("X-Next-Page", str(number + 1) if number < last else ""),
                 ("X-Prev-Page", str(number - 1) if number > 1 else "")]
        if links:
            extra.insert(0, ("Link", ", ".join(links)))
        return json_response(200, items, self.CONTENT_TYPE, extra)

    def _item(self, item: Stated, position: int, origin: str) -> dict[str, object]:
        url = f"{origin}{self._RAW}{_quoted(item.name, safe='/')}"
        stamp = _iso(item.modified, millis=False)
        assert item.sha256 is not None
        return {"id": position + 1, "name": item.name, "path": item.name, "type": "file",
                "size": item.size, "content_type": "application/octet-stream",
                "state": "uploaded", "digest": "sha256:" + item.sha256.hex(),
                "md5": item.md5.hex(), "download_url": url, "browser_download_url": url,
                "created_at": stamp, "updated_at": stamp}


# -- drf ---------------------------------------------------------------------------------
def replace_query_param(query: str, key: str, value: int) -> str:
    """The query with `key` set to `value`, keys sorted: DRF's replace_query_param."""
    pairs = {k: v for k, v in _query_dict(query).items() if k != key}
    pairs[key] = [str(value)]
    return urlencode(sorted(pairs.items()), doseq=True)


def remove_query_param(query: str, key: str) -> str:
    """The query without `key`, keys sorted: DRF's remove_query_param."""
    pairs = {k: v for k, v in _query_dict(query).items() if k != key}
    return urlencode(sorted(pairs.items()), doseq=True)


def _query_dict(query: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        found.setdefault(key, []).append(value)
    return found


class DrfApp(ShapeApp):
    shape = "drf"
    _LIST = "/api/files/"
    _MEDIA = "/media/"

    def file_target(self, target: str) -> bool:
        return target.startswith(self._MEDIA)

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        return json_response(status, {"detail": message}, extra=extra)

    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path, mark, query = target.partition("?")
        if path == self._LIST:
            return self.list_page(method, target, headers,
                                  lambda: self._list(query, self.origin(headers)))
        if path == self._LIST.rstrip("/"):  # Django's APPEND_SLASH: a relative 301
            return json_response(301, {"detail": "Moved Permanently"},
                                 extra=[("Location", f"{self._LIST}{mark}{query}")])
        if path.startswith(self._MEDIA) and len(path) > len(self._MEDIA):
            return self.file(path[len(self._MEDIA):], method, target, headers)
        return self.error(404, "Not found.")

    def _url(self, origin: str, query: str) -> str:
        return f"{origin}{self._LIST}" + (f"?{query}" if query else "")

    def _list(self, query: str, origin: str) -> Response:
        params = dict(parse_qsl(query, keep_blank_values=True))
        total = len(self.names)
        size = self.app.dataset.page_size
        if "limit" in params or "offset" in params:
            return self._limit_offset(params, query, origin, total, size)
        last = max(1, -(-total // size))  # Django's Paginator: an empty first page exists
        raw = params.get("page", "1")
        number = last if raw == "last" else _positive(raw)
        if number is None or number > last:
            return self.error(404, "Invalid page.")
        start = (number - 1) * size
        following = (self._url(origin, replace_query_param(query, "page", number + 1))
                     if number < last else None)
        previous = None
        if number == 2:  # DRF leaves page=1 out
            previous = self._url(origin, remove_query_param(query, "page"))
        elif number > 2:
            previous = self._url(origin, replace_query_param(query, "page", number - 1))
        return self._page(total, following, previous, start, start + size, origin)

    def _limit_offset(self, params: dict[str, str], query: str, origin: str, total: int,
                      cap: int) -> Response:
        # As DRF: a limit that is not a positive integer is the default; an offset that is
        # not an integer >= 0 is 0 (LimitOffsetPagination.get_limit/get_offset)
        limit = min(_positive(params.get("limit")) or cap, cap)
        raw = params.get("offset", "0")
        offset = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else 0
        following = None
        if offset + limit < total:
            following = self._url(origin, replace_query_param(
                replace_query_param(query, "limit", limit), "offset", offset + limit))
        previous = None
        if offset > 0:
            with_limit = replace_query_param(query, "limit", limit)
            previous = self._url(origin, remove_query_param(with_limit, "offset")
                                 if offset - limit <= 0 else
                                 replace_query_param(with_limit, "offset", offset - limit))
        return self._page(total, following, previous, offset, offset + limit, origin)

    def _page(self, total: int, following: str | None, previous: str | None, start: int,
              stop: int, origin: str) -> Response:
        results = [{"name": item.name, "size": item.size, "md5": item.md5.hex(),
                    "url": f"{origin}{self._MEDIA}{_quoted(item.name, safe='/')}"}
                   for item in self.stated(start, stop)]
        return json_response(200, {"count": total, "next": following, "previous": previous,
                                   "results": results})


# hf-tree: server/hf_shape.py (HF_APPS)
SHAPE_APPS: dict[str, type[ShapeApp]] = {"gcs": GcsApp, "link": LinkApp, "drf": DrfApp}
