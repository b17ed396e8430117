"""A small listing API for the JSON-source end-to-end tests, independent of `bulkfetch serve`:
two loopback HTTP servers (http.server, a thread each).

The API host needs `Authorization: Bearer <token>` and `X-Api-Key: <key>` on every request
(401 otherwise) and serves:
  GET /api/files/[?page=N | ?limit=L&offset=O]   Django REST framework pagination
      -> {"count", "next" (absolute URL or null), "previous", "results": [{"name", "size",
          "md5" (hex), "url": "/media/NAME" (relative)}]}; /api/files (no slash): 301 to it
  GET /files[?page=N]                            GitHub-style, Link: <...>; rel="next"
      -> [{"name", "size", "digest": "sha256:HEX", "browser_download_url": absolute}]
  GET /media/NAME, GET /raw/NAME                 302 to the blob host (odd indexes of /raw/
                                                 are served here, without a redirect)
The blob host (another port: another origin) serves GET /blob/NAME to anyone, and both
record every request's headers, so a test sees what crossed the redirect.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

TOKEN = "tok-SECRET-7f3a9c1e5b"
API_KEY = "key-SECRET-42d8e6a0"


def file_name(index: int) -> str:
    return f"dir{index % 3}/file {index:05d}.dat"  # nested, and a space to quote


def body_of(index: int) -> bytes:
    seed = hashlib.sha256(file_name(index).encode()).digest()
    return (seed * 200)[: 1 + (index * 97) % 5000]


@dataclass
class Seen:
    host: str  # "api" | "blob"
    path: str  # path and query
    headers: dict[str, str]


@dataclass
class ApiServer:
    files: int = 120
    page_size: int = 20
    lie: int | None = None  # this index's listed MD5 / SHA-256 is wrong
    list_delay: float = 0.0  # seconds before each list page is answered
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.names = [file_name(i) for i in range(self.files)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("api"))
        self.blob = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("blob"))
        for server in (self.api, self.blob):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self.api, self.blob):
            server.shutdown()
            server.server_close()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api.server_address[1]}"

    @property
    def blob_url(self) -> str:
        return f"http://127.0.0.1:{self.blob.server_address[1]}"

    def expected(self) -> dict[str, str]:
        """name -> MD5 of its body."""
        return {name: hashlib.md5(body_of(i)).hexdigest() for i, name in enumerate(self.names)}

    def requests(self, host: str, prefix: str = "") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.host == host and s.path.startswith(prefix)]

    # -- answers --------------------------------------------------------------------------------
    def _md5(self, index: int) -> str:
        digest = hashlib.md5(body_of(index)).hexdigest()
        return "0" * 32 if index == self.lie else digest

    def _sha256(self, index: int) -> str:
        digest = hashlib.sha256(body_of(index)).hexdigest()
        return "f" * 64 if index == self.lie else digest

    def drf(self, query: dict[str, list[str]]) -> dict[str, object]:
        base = f"{self.api_url}/api/files/"
        if "offset" in query or "limit" in query:
            limit = int(query.get("limit", [self.page_size])[0])
            offset = int(query.get("offset", ["0"])[0])
            chosen = range(offset, min(offset + limit, self.files))
            more = offset + limit < self.files
            following = f"{base}?limit={limit}&offset={offset + limit}" if more else None
        else:
            page = int(query.get("page", ["1"])[0])
            start = (page - 1) * self.page_size
            chosen = range(start, min(start + self.page_size, self.files))
            following = f"{base}?page={page + 1}" if start + self.page_size < self.files \
                else None
        return {"count": self.files, "next": following, "previous": None,
                "results": [{"name": self.names[i], "size": len(body_of(i)), "md5": self._md5(i),
                             "url": "/media/" + quote(self.names[i])} for i in chosen]}

    def link(self, query: dict[str, list[str]]) -> tuple[list[object], str | None]:
        page = int(query.get("page", ["1"])[0])
        start = (page - 1) * self.page_size
        chosen = range(start, min(start + self.page_size, self.files))
        last = -(-self.files // self.page_size)
        links = [f'<{self.api_url}/files?page={last}>; rel="last"']
        if page < last:
            links.insert(0, f'<{self.api_url}/files?page={page + 1}>; rel="next"')
        return ([{"name": self.names[i], "size": len(body_of(i)),
                  "digest": "sha256:" + self._sha256(i),
                  "browser_download_url": f"{self.api_url}/raw/{quote(self.names[i])}"}
                 for i in chosen], ", ".join(links))

    def _handler(self, host: str) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with server.lock:
                    server.seen.append(Seen(host, self.path, dict(self.headers.items())))
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                if host == "blob":
                    self._file(unquote(parts.path.removeprefix("/blob/")))
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}" or \
                        self.headers.get("X-Api-Key") != API_KEY:
                    self._send(401, b'{"detail": "Authentication credentials were not '
                                    b'provided."}', "application/json")
                    return
                if parts.path == "/api/files":  # Django's APPEND_SLASH
                    self._send(301, b"", "text/plain", [("Location", "/api/files/")])
                elif parts.path == "/api/files/":
                    time.sleep(server.list_delay)
                    self._send(200, json.dumps(server.drf(query)).encode(), "application/json")
                elif parts.path == "/files":
                    time.sleep(server.list_delay)
                    items, links = server.link(query)
                    self._send(200, json.dumps(items).encode(), "application/json",
                               [("Link", links)] if links else [])
                elif parts.path.startswith(("/media/", "/raw/")):
                    name = unquote(parts.path.split("/", 2)[2])
                    index = server.index.get(name)
                    if parts.path.startswith("/raw/") and index is not None and index % 2:
                        self._file(name)
                        return
                    self._send(302, b"", "text/plain",
                               [("Location", f"{server.blob_url}/blob/{quote(name)}")])
                else:
                    self._send(404, b"{}", "application/json")

            def _file(self, name: str) -> None:
                index = server.index.get(name)
                if index is None:
                    self._send(404, b"", "text/plain")
                    return
                body = body_of(index)
                etag = f'"{hashlib.md5(body).hexdigest()}"'
                self._send(200, body, "application/octet-stream", [("ETag", etag)])

            def _send(self, status: int, body: bytes, content_type: str,
                      extra: Sequence[tuple[str, str]] = ()) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in extra:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler
