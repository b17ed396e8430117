"""SigV4 headers for object GETs, computed here rather than by libcurl.

libcurl's CURLOPT_AWS_SIGV4 derives the signing key again for every request (four
HMAC-SHA256s) and builds the canonical request through its generic header code: measured
at 14.5 us a request on a 100-byte object (benchmarks/results/2026-11-24-session14-s3.txt,
null sink: 22.2 us a file unsigned, 36.5 signed), two thirds of what the rest of a small
file costs. An object GET is the same request every time but for its path and the clock:
the key is derived once a day (it depends on the date, not the time), the canonical
request is one format string, and a request costs one SHA-256 and one HMAC (2.0 us here).
Listing requests keep libcurl's signer: there are a thousand keys to each of them.

What is signed: GET, the path as sent (the key percent-encoded once with only A-Z a-z
0-9 - _ . ~ and '/' left as they are, S3Settings.object_url), an empty query, and the
headers host, x-amz-checksum-mode, x-amz-content-sha256 (UNSIGNED-PAYLOAD: a GET has no
body) and x-amz-date, plus x-amz-security-token for temporary credentials. The Host header
is sent explicitly with the value signed, so what libcurl would write for it (port or no
port, case) cannot differ from it. A Range header (a part of a big file) is not signed;
S3 requires only host and the x-amz-* headers to be. headers_for() signs another method
and a query the same way (the `HEAD key?partNumber=1` of engine/multipart.py).
"""
from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from bulkfetch.s3.settings import S3Credentials

__all__ = ["ALGORITHM", "UNSIGNED_PAYLOAD", "ObjectSigner", "derive_key"]

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
CHECKSUM_MODE = "x-amz-checksum-mode: ENABLED"


def derive_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service),
    "aws4_request"): SigV4's key for one day, region and service."""
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, service, "aws4_request"):
        key = hmac.digest(key, part.encode("utf-8"), "sha256")
    return key


class ObjectSigner:
    """headers(url) -> the request headers that sign a GET of `url` now.

    Every URL has the origin of `base_url` (the source's object URL prefix). Its path is
    signed as sent, as libcurl and botocore sign S3 paths: S3Settings.object_url() has
    encoded the key once, the canonical way, and an endpoint's own path is taken as the
    user gave it. Object URLs hold no query (object_url() encodes a key's '?'); a URL
    given to headers_for() may, in canonical form. `clock` returns seconds since the epoch
    (tests pin it).
    """

    def __init__(self, credentials: S3Credentials, region: str, base_url: str,
                 clock: Callable[[], float] = time.time) -> None:
        parts = urlsplit(base_url)
        default_port = {"http": 80, "https": 443}.get(parts.scheme)
        host = (parts.hostname or "").lower()
        if ":" in host:  # IPv6
            host = f"[{host}]"
        port = parts.port
        self.host = host if port is None or port == default_port else f"{host}:{port}"
        self._origin_length = len(f"{parts.scheme}://{parts.netloc}")
        self._access_key = credentials.access_key
        self._secret = credentials.secret_key
        self._region = region
        self._clock = clock
        token = credentials.session_token
        self._signed = ("host;x-amz-checksum-mode;x-amz-content-sha256;x-amz-date"
                        + (";x-amz-security-token" if token else ""))
        token_line = f"x-amz-security-token:{token}\n" if token else ""
        # The canonical request around the path and the timestamp (% formatting: '{' may
        # be in a token, '%' cannot be in a header value we put here unescaped).
        self._headers_part = ("host:" + self.host.replace("%", "%%")
                              + "\nx-amz-checksum-mode:ENABLED\nx-amz-content-sha256:"
                              + UNSIGNED_PAYLOAD + "\nx-amz-date:%s\n"
                              + token_line.replace("%", "%%") + "\n" + self._signed
                              + "\n" + UNSIGNED_PAYLOAD)
        self._canonical = "GET\n%s\n\n" + self._headers_part
        self._fixed = ["Host: " + self.host, CHECKSUM_MODE,
                       "x-amz-content-sha256: " + UNSIGNED_PAYLOAD]
        if token:
            self._fixed.append("x-amz-security-token: " + token)
        self._second = -1
        self._day = ""
        self._timestamp = ""
        self._key = b""
        self._mac = hmac.new(b"", digestmod=hashlib.sha256)  # replaced by _tick()
        self._prefix = ""  # "AWS4-HMAC-SHA256\n<timestamp>\n<scope>\n"
        self._authorization = ""  # the Authorization header up to the signature

    def _tick(self, second: int) -> None:
        """The timestamp of `second`, and the key and scope of its day."""
        self._second = second
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
        day = stamp[:8]
        if day != self._day:
            self._day = day
            self._key = derive_key(self._secret, day, self._region)
            # keyed once a day: a copy per request skips hashing the key's two pads again
            # (0.83 against 1.36 us a signature here, session 23)
            self._mac = hmac.new(self._key, digestmod=hashlib.sha256)
        scope = f"{day}/{self._region}/s3/aws4_request"
        self._timestamp = stamp
        self._prefix = f"{ALGORITHM}\n{stamp}\n{scope}\n"
        self._authorization = (f"Authorization: {ALGORITHM} Credential={self._access_key}/"
                               f"{scope}, SignedHeaders={self._signed}, Signature=")

    def headers(self, url: str) -> list[str]:
        second = int(self._clock())
        if second != self._second:
            self._tick(second)
        canonical = self._canonical % (url[self._origin_length:], self._timestamp)
        return self._signed_headers(canonical)

    def headers_for(self, method: str, url: str) -> list[str]:
        """The headers that sign `method` of `url`, whose query (if any) is already in
        SigV4's canonical form: names and values encoded, in order ("partNumber=1")."""
        second = int(self._clock())
        if second != self._second:
            self._tick(second)
        path, _, query = url[self._origin_length:].partition("?")
        return self._signed_headers(f"{method}\n{path}\n{query}\n"
                                    + self._headers_part % self._timestamp)

    def _signed_headers(self, canonical: str) -> list[str]:
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        mac = self._mac.copy()
        mac.update((self._prefix + digest).encode())
        signature = mac.hexdigest()
        return [*self._fixed, "x-amz-date: " + self._timestamp, self._authorization + signature]
