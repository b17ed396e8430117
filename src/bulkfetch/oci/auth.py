"""How a registry lets us in: anonymous, HTTP Basic, or a bearer token from its issuer.

A registry answers 401 with a `WWW-Authenticate` challenge. `Basic` wants the user's
credentials on every request; `Bearer realm=...,service=...,scope=...` wants a token from the
realm (asked anonymously, or with the credentials as Basic), which expires. An Authorizer
holds what one repository needs and renews its token before it runs out; it is copied into
the worker processes (fork) and renews there too, so a pull of hours outlives a 5-minute token.

Credentials come from --username/--password-stdin or from the Docker config's `auths`
(`docker login` writes them there); credential helpers (credsStore, credHelpers) are not run.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pycurl

from bulkfetch.config import Timeouts, TlsOptions
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.net.curl import new_handle, perform_get

TOKEN_LIFETIME_DEFAULT_S = 60.0  # what the token spec says to assume when expires_in is absent
RENEW_AT = 0.75  # renew a token once this share of its lifetime has passed
MAX_TOKEN_RESPONSE = 1 << 20
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io",
             "registry-1.docker.io", "https://registry-1.docker.io")
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


class AuthError(BulkfetchError):
    """The registry or its token issuer refused us, or answered something unusable."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


def docker_config_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


def docker_config_credentials(registry: str, path: Path | None = None) -> Credentials | None:
    """The credentials `docker login REGISTRY` stored, if any. A config that exists but
    cannot be read is an error naming it (silently pulling anonymously would be a surprise)."""
    path = path or docker_config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the Docker config {path}: {exc.strerror}") from None
    try:
        auths = json.loads(text).get("auths") or {}
    except (ValueError, AttributeError):
        raise UsageError(f"the Docker config {path} is not a JSON object; fix or move it") \
            from None
    keys = _HUB_KEYS if registry in _HUB_KEYS else (
        registry, f"https://{registry}", f"http://{registry}")
    for key in keys:
        entry = auths.get(key) if isinstance(auths, dict) else None
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return Credentials(entry["username"], entry["password"])
        encoded = entry.get("auth")
        if isinstance(encoded, str) and encoded:
            try:
                user, colon, password = base64.b64decode(encoded, validate=True) \
                    .decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, colon, password = "", "", ""
            if not colon:
                raise UsageError(f"the Docker config {path}: the auth entry for {key!r} is "
                                 "not base64 of user:password; run docker login again")
            return Credentials(user, password)
    return None


def parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """(scheme in lower case, parameters) of a WWW-Authenticate header value."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    for match in _PARAM.finditer(rest):
        quoted, bare = match[2], match[3]
        params[match[1].lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None \
            else bare or ""
    return scheme.lower(), params


@dataclass
class Authorizer:
    """What the requests of one repository carry: nothing, Basic, or a bearer token that is
    renewed at RENEW_AT of its lifetime (and at once when the registry refuses it)."""

    kind: str = "none"  # "none" | "basic" | "bearer"
    credentials: Credentials | None = field(default=None, repr=False)
    realm: str = ""
    service: str = ""
    scope: str = ""
    timeouts: Timeouts = field(default_factory=Timeouts)
    tls: TlsOptions | None = None
    token: str = field(default="", repr=False)
    renew_at: float = 0.0  # time.monotonic() after which the token is renewed
    tokens_fetched: int = 0

    def headers(self) -> list[str]:
        if self.kind == "basic" and self.credentials is not None:
            return [f"Authorization: {self.credentials.basic()}"]
        if self.kind == "bearer":
            if not self.token or time.monotonic() >= self.renew_at:
                self.renew()
            return [f"Authorization: Bearer {self.token}"]
        return []

    def renew(self) -> None:
        self.token, lifetime = fetch_token(self.realm, self.service, self.scope,
                                           self.credentials, self.timeouts, self.tls)
        self.tokens_fetched += 1
        self.renew_at = time.monotonic() + lifetime * RENEW_AT

    def answer(self, challenge: str, scope: str, what: str) -> None:
        """Take a 401's challenge: become Basic or Bearer (renewing the token), or raise
        AuthError when we have nothing that could satisfy it."""
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self.credentials is None:
                raise AuthError(f"{what}: the registry wants a user name and password; give "
                                "--username and --password-stdin, or run docker login")
            if self.kind == "basic":
                raise AuthError(f"{what}: the registry refused the credentials of user "
                                f"{self.credentials.username!r}")
            self.kind = "basic"
            return
        if scheme != "bearer" or not params.get("realm"):
            raise AuthError(f"{what}: the registry asks for an authentication scheme "
                            f"bulkfetch does not speak ({challenge[:80]!r})")
        error = params.get("error", "")
        if self.kind == "bearer" and error not in ("invalid_token", "insufficient_scope") \
                and self.realm == params["realm"] and time.monotonic() < self.renew_at:
            raise AuthError(f"{what}: the registry refused a fresh token"
                            + (" for user " + repr(self.credentials.username)
                               if self.credentials else " (anonymous)")
                            + "; check the credentials and that the repository exists")
        self.kind, self.realm = "bearer", params["realm"]
        self.service = params.get("service", "")
        self.scope = params.get("scope") or scope
        self.renew()


def fetch_token(realm: str, service: str, scope: str, credentials: Credentials | None,
                timeouts: Timeouts, tls: TlsOptions | None) -> tuple[str, float]:
    """(token, lifetime in seconds) from the issuer at `realm`."""
    parts = urlsplit(realm)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise AuthError(f"the registry's token realm {realm!r} is not an http(s) URL")
    query = urlencode([(key, value) for key, value in
                       (("service", service), *(("scope", one) for one in scope.split()))
                       if value])
    url = realm + ("&" if parts.query else "?") + query if query else realm
    handle = new_handle(timeouts, tls)
    handle.setopt(pycurl.MAXFILESIZE_LARGE, MAX_TOKEN_RESPONSE)
    if credentials is not None:
        handle.setopt(pycurl.HTTPHEADER, [f"Authorization: {credentials.basic()}"])
    try:
        status, _, body = perform_get(handle, url)
    except pycurl.error as exc:
        raise AuthError(f"cannot reach the token issuer {realm}: {exc.args[-1]}") from None
    finally:
        handle.close()
    if status in (401, 403):
        who = f"user {credentials.username!r}" if credentials else "anonymous pulls"
        raise AuthError(f"the token issuer {realm} refused {who} (HTTP {status}); "
                        + ("check --username/--password-stdin or docker login"
                           if credentials else "give --username and --password-stdin, "
                                               "or run docker login"))
    if status != 200:
        raise AuthError(f"the token issuer {realm} answered HTTP {status}")
    try:
        answer = json.loads(body)
        token = answer.get("token") or answer.get("access_token")
    except (ValueError, AttributeError):
        token, answer = None, {}
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
        raise AuthError(f"the token issuer {realm} answered without a usable token")
    lifetime = answer.get("expires_in")
    if not isinstance(lifetime, (int, float)) or lifetime <= 0:
        lifetime = TOKEN_LIFETIME_DEFAULT_S
    return token, float(lifetime)
