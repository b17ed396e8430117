"""What wraps any handler of `bulkfetch serve`, whatever its shape (shapes.py) or the seed
App: --require-bearer (BearerGate) and --redirect-files-to (FileRedirect), and the checks
of their values. No sockets here."""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from bulkfetch.server.app import Response, json_response
from bulkfetch.server.faults import Fault
from bulkfetch.server.http import Handler


def seed_file_target(target: str) -> bool:
    return target.startswith("/get/")


class FileRedirect:
    """--redirect-files-to ORIGIN: every request for a file's bytes is answered 302 to the
    same target on ORIGIN (another `bulkfetch serve` of the same data set and shape), so a
    client's credentials across hosts can be tested; listings are answered here. Faults are
    left to the origin that serves the bytes: the redirect is what is under test."""

    def __init__(self, inner: Handler, origin: str, is_file: Callable[[str], bool]) -> None:
        self.inner = inner
        self.origin = origin.rstrip("/")
        self.is_file = is_file
        self.trickle_interval = inner.trickle_interval

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        if method in ("GET", "HEAD") and self.is_file(target):
            return json_response(302, {"error": "moved to another host (--redirect-files-to)"},
                                 extra=[("Location", self.origin + target)])
        return self.inner.handle(method, target, headers)

    def refuse(self, fault: Fault, target: str) -> Response:
        return self.inner.refuse(fault, target)


BEARER_REALM = 'Bearer realm="bulkfetch"'


class BearerGate:
    """--require-bearer TOKEN: a request without 'Authorization: Bearer TOKEN' is answered
    401 with a WWW-Authenticate challenge (RFC 6750 section 3: error="invalid_token" when a
    wrong token came), before anything else is decided for it."""

    def __init__(self, inner: Handler, token: str) -> None:
        self.inner = inner
        self.expected = token.encode("ascii")
        self.trickle_interval = inner.trickle_interval

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        sent = headers.get("authorization")
        if sent is not None:
            scheme, _, token = sent.strip().partition(" ")
            # The scheme is case-insensitive (RFC 9110 11.1); compare_digest: no timing hint
            if scheme.lower() == "bearer" and hmac.compare_digest(
                    token.strip().encode("utf-8", "surrogateescape"), self.expected):
                return self.inner.handle(method, target, headers)
            challenge = (f'{BEARER_REALM}, error="invalid_token", '
                         'error_description="the access token is not valid"')
            return json_response(401, {"error": "the bearer token is not valid"},
                                 extra=[("WWW-Authenticate", challenge)])
        return json_response(401, {"error": "this server needs 'Authorization: Bearer TOKEN'"},
                             extra=[("WWW-Authenticate", BEARER_REALM)])

    def refuse(self, fault: Fault, target: str) -> Response:
        return self.inner.refuse(fault, target)


TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def check_bearer_token(token: str) -> str | None:
    """Why `token` cannot be a bearer token (RFC 6750 section 2.1's b64token), or None."""
    if not TOKEN68.fullmatch(token):
        return ("a bearer token is letters, digits and -._~+/ (then '=' padding), with no "
                "spaces")
    return None


def check_origin(origin: str) -> str | None:
    """Why `origin` cannot be --redirect-files-to's http(s)://HOST:PORT, or None."""
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// origin with a host is needed"
    if parts.username is not None or parts.password is not None:
        return "no user or password in it"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "just the origin, e.g. http://127.0.0.1:8001 (files keep their own path)"
    return None
