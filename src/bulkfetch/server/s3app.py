"""`bulkfetch serve --s3`: the data set as one S3 bucket, path style.

GET /BUCKET?list-type=2&... is ListObjectsV2 (without list-type=2, ListObjects V1),
GET/HEAD /BUCKET/KEY is GetObject/HeadObject, HEAD /BUCKET is HeadBucket, GET / lists the
one bucket. Errors are S3's XML (NoSuchBucket, NoSuchKey, SlowDown, ...). The seed API
(/list, /get/NAME) is still served beside it, and the fault switches apply to both: a list
page is faulted like a seed list page, an object like a file. With credentials, every S3
request must carry a valid SigV4 signature (server/sigv4.py)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote
from xml.sax.saxutils import escape

from bulkfetch.server.app import JSON, App, Response
from bulkfetch.server.faults import Fault
from bulkfetch.server.s3list import (
    NAMESPACE,
    XML_HEAD,
    BadListRequest,
    Contents,
    ListRequest,
    list_keys,
    render_list,
    sorted_keys,
)

if TYPE_CHECKING:
    from bulkfetch.server.sigv4 import ServerCredentials

XML = "application/xml"
DEFAULT_BUCKET = "bulkfetch"
SEED_PATHS = ("list", "get")  # the seed API's first path segments: not bucket names

# The S3 error code for a status the seed app (or a fault) answered with.
_CODES = {400: ("InvalidRequest", "Invalid request (injected)."),
          401: ("AccessDenied", "Access Denied"),
          403: ("AccessDenied", "Access Denied"),
          404: ("NoSuchKey", "The specified key does not exist."),
          405: ("MethodNotAllowed", "The specified method is not allowed against this "
                                    "resource."),
          410: ("NoSuchKey", "The specified key does not exist."),
          429: ("SlowDown", "Please reduce your request rate."),
          500: ("InternalError", "We encountered an internal error. Please try again."),
          503: ("SlowDown", "Please reduce your request rate.")}
_KEPT_ON_ERROR = {"retry-after", "www-authenticate", "allow"}


def check_bucket_name(name: str) -> str | None:
    """Why `name` cannot be this server's bucket, or None."""
    if not 3 <= len(name) <= 63 or not all(c.islower() or c.isdigit() or c in ".-"
                                           for c in name if c.isascii()) \
            or not name.isascii() or not name[0].isalnum() or not name[-1].isalnum():
        return "3 to 63 lower-case letters, digits, '.' and '-', starting and ending " \
               "with a letter or digit"
    if name in SEED_PATHS:
        return f"/{name} is the seed API's path"
    return None


class S3App:
    """The S3 face of an App (whose data set, faults and file answers it shares)."""

    def __init__(self, app: App, bucket: str = DEFAULT_BUCKET,
                 credentials: ServerCredentials | None = None) -> None:
        self.app = app
        self.bucket = bucket
        self.credentials = credentials
        self._keys: tuple[Sequence[str], Contents] | None = None
        self._request_ids = itertools.count(1)
        self._pid = os.getpid()

    @property
    def trickle_interval(self) -> float:
        return self.app.trickle_interval

    @property
    def keys(self) -> tuple[Sequence[str], Contents]:
        """The sorted keys and what a listing says of each."""
        if self._keys is None:  # sorted on first use: a --root tree is walked once
            faults = self.app.faults
            stale = faults.stale if faults is not None and faults.config.misstates else None
            self._keys = sorted_keys(self.app.dataset, stale)
        return self._keys

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path, _, query = target.partition("?")
        bucket, slash, quoted_key = path[1:].partition("/")
        if bucket in SEED_PATHS and (slash or path == "/list"):
            return self.app.handle(method, target, headers)
        if method not in ("GET", "HEAD"):
            return self._error(405, "MethodNotAllowed", _CODES[405][1], path,
                               [("Allow", "GET, HEAD")])
        if self.credentials is not None:
            from bulkfetch.server.sigv4 import verify

            refused = verify(method, target, headers, self.credentials)
            if refused is not None:
                return self._error(refused.status, refused.code, refused.message, path)
        if not bucket:
            return self._list_buckets()
        if unquote(bucket) != self.bucket:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist",
                               path, bucket=unquote(bucket))
        if not quoted_key:
            if method == "HEAD":
                return Response(200, [("Content-Type", XML)])
            params = dict(parse_qsl(query, keep_blank_values=True))
            if "location" in params:
                return self._xml(f'<LocationConstraint xmlns="{NAMESPACE}"/>')
            answer = self.app.list_answer(method, target, headers,
                                          lambda: self._list(params, path))
            return self._s3_error(answer, path)
        answer = self.app.file_answer(quoted_key, method, target, headers)
        return self._s3_error(answer, path, key=unquote(quoted_key, errors="replace"))

    def refuse(self, fault: Fault, target: str) -> Response:
        """A request turned away by --max-concurrent or --max-rps: the seed API's answer on
        its paths, else S3's 503 SlowDown (S3 never answers 429), with Retry-After: 1."""
        path = target.partition("?")[0]
        bucket, slash, _ = path[1:].partition("/")
        if bucket in SEED_PATHS and (slash or path == "/list"):
            return self.app.refuse(fault, target)
        refused = self._error(503, "SlowDown", _CODES[503][1], path, [("Retry-After", "1")])
        refused.fault = fault
        return refused

    def _list(self, params: dict[str, str], path: str) -> Response:
        try:
            request = ListRequest.from_query(params)
            keys, contents = self.keys
            listed = list_keys(keys, request)
        except BadListRequest as exc:
            return self._error(400, "InvalidArgument", str(exc), path)
        return Response(200, [("Content-Type", XML)],
                        render_list(self.bucket, request, listed, contents))

    def _list_buckets(self) -> Response:
        return self._xml(
            f'<ListAllMyBucketsResult xmlns="{NAMESPACE}"><Owner><ID>bulkfetch</ID>'
            "<DisplayName>bulkfetch</DisplayName></Owner><Buckets><Bucket>"
            f"<Name>{escape(self.bucket)}</Name>"
            "<CreationDate>2025-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets>"
            "</ListAllMyBucketsResult>")

    @staticmethod
    def _xml(body: str) -> Response:
        return Response(200, [("Content-Type", XML)], XML_HEAD + body.encode("utf-8"))

    def _s3_error(self, answer: Response, path: str, key: str | None = None) -> Response:
        """`answer`, with a JSON error of the seed app (or of a fault) rewritten as S3's."""
        types = [value for name, value in answer.headers if name.lower() == "content-type"]
        if answer.status < 400 or types != [JSON]:
            return answer
        code, message = _CODES.get(answer.status, ("InternalError", _CODES[500][1]))
        if answer.status == 404 and key is None:
            code, message = "NoSuchBucket", "The specified bucket does not exist"
        kept = [(name, value) for name, value in answer.headers
                if name.lower() in _KEPT_ON_ERROR]
        error = self._error(answer.status, code, message, path, kept, key=key)
        error.delay_s, error.fault = answer.delay_s, answer.fault
        return error

    def _error(self, status: int, code: str, message: str, resource: str,
               extra: list[tuple[str, str]] | None = None, key: str | None = None,
               bucket: str | None = None) -> Response:
        named = f"<Key>{escape(key)}</Key>" if key is not None else ""
        if bucket is not None:
            named += f"<BucketName>{escape(bucket)}</BucketName>"
        request_id = f"{self._pid:X}{next(self._request_ids):012X}"
        body = (f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>{named}"
                f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
                "</Error>")
        return Response(status, [("Content-Type", XML), ("x-amz-request-id", request_id),
                                 *(extra or [])], XML_HEAD + body.encode("utf-8"))
