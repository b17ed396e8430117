"""Request headers a user gives (--header, --header-file, --bearer-env), and which hosts get
them.

Credentials go to the listing's host and the files' hosts only. libcurl itself strips only
Authorization and Cookie when a redirect changes host; any other custom header (X-Api-Key)
would follow the redirect. So a source with headers turns libcurl's redirects off and the
engine follows them (net/redirects.py), asking `HostHeaders` for each hop's headers by
its URL: the headers for an allowed origin, else the same names unset ("Name:", which
libcurl sends nothing for; never an empty list, which pycurl would take as "keep the
handle's last headers").
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from urllib.parse import urlsplit

import pycurl

from bulkfetch.config import RequestAuth
from bulkfetch.errors import UsageError
from bulkfetch.util.redact import register_secret

# RFC 9110 token characters: what a field name may hold.
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CACHE_LIMIT = 4096  # origins remembered per source (a hostile listing may name millions)


def parse_header(text: str, where: str) -> tuple[str, str]:
    """('Name', 'value') of a 'Name: value' line; UsageError naming `where` (never the
    value, which may be a token) when it is not one."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _FIELD_NAME.fullmatch(name):
        raise UsageError(f"{where}: give a header as 'Name: value' (a name of letters, digits "
                         "and -)")
    if not value:
        raise UsageError(f"{where}: the header {name} has no value")
    if any(ch in value for ch in "\r\n\0"):
        raise UsageError(f"{where}: the value of {name} holds a line break or NUL")
    return name, value


def read_header_file(path: str) -> list[tuple[str, str]]:
    """The headers of FILE ('-': standard input), one 'Name: value' a line (blank lines and
    # comments skipped), so a token stays out of the process list and the shell's history."""
    try:
        if path == "-":  # `secret-tool lookup ... | bulkfetch get --header-file - ...`
            lines = sys.stdin.buffer.read().decode("utf-8").splitlines()
        else:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--header-file {path}: cannot be read ({exc.__class__.__name__}: "
                         f"{getattr(exc, 'strerror', None) or exc})") from None
    found = []
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            found.append(parse_header(line, f"--header-file {path}, line {number}"))
    if not found:
        raise UsageError(f"--header-file {path}: no 'Name: value' line in it")
    return found


def bearer_from_env(variable: str) -> tuple[str, str]:
    """('Authorization', 'Bearer <token>') from the environment variable `variable`."""
    token = os.environ.get(variable, "").strip()
    if not token:
        raise UsageError(f"--bearer-env {variable}: the environment variable {variable} is "
                         "not set or empty; export it with the token (e.g. "
                         f"`read -s {variable}; export {variable}`) or drop --bearer-env")
    if any(ch in token for ch in "\r\n\0"):
        raise UsageError(f"--bearer-env {variable}: the token holds a line break or NUL")
    return "Authorization", f"Bearer {token}"


def build_auth(headers: Iterable[str] = (), header_file: str | None = None,
               bearer_env: str | None = None, netrc: bool = False) -> RequestAuth:
    """The run's RequestAuth; every value registered as a secret (util/redact.py), so no output
    shows it."""
    found: list[tuple[str, str]] = []
    origins: list[str] = []
    for number, text in enumerate(headers, 1):
        found.append(parse_header(text, f"--header #{number}"))
        origins.append("--header")
    if header_file is not None:
        found += read_header_file(header_file)
        origins.append(f"--header-file {header_file}")
    if bearer_env is not None:
        found.append(bearer_from_env(bearer_env))
        origins.append(f"--bearer-env {bearer_env}")
    names = [name.lower() for name, _ in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"the header {twice[0]} is given twice (by --header, --header-file "
                         "or --bearer-env): give it once")
    for _, value in found:
        register_secret(value)
        register_secret(value.partition(" ")[2])  # the token of "Bearer <token>"
    return RequestAuth(tuple(found), netrc, tuple(origins))


def origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port defaulted; None for anything else.
    Credentials stay within one origin: https -> http to the same host is another one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


class HostHeaders:
    """url -> the header lines a request to it carries: the configured ones for an allowed
    origin, else the same names unset."""

    def __init__(self, auth: RequestAuth, allowed: Iterable[str]) -> None:
        self.lines = [f"{name}: {value}" for name, value in auth.headers]
        self.unset = [f"{name}:" for name, _ in auth.headers]
        self.allowed = {origin for origin in map(origin_of, allowed) if origin is not None}
        # scheme://authority -> its lines: one slice and one lookup a transfer
        self._by_prefix: dict[str, list[str]] = {}

    def allow(self, url: str) -> None:
        """Requests to `url`'s origin carry the headers (a file's own URL, as listed)."""
        origin = origin_of(url)
        if origin is not None and origin not in self.allowed and \
                len(self.allowed) < _CACHE_LIMIT:
            self.allowed.add(origin)
            self._by_prefix.clear()

    def __call__(self, url: str) -> list[str]:
        start = url.find("//") + 2
        end = url.find("/", start)
        prefix = url[:end] if end >= 0 else url
        lines = self._by_prefix.get(prefix)
        if lines is None:
            lines = self.lines if origin_of(url) in self.allowed else self.unset
            if len(self._by_prefix) >= _CACHE_LIMIT:
                self._by_prefix.clear()
            self._by_prefix[prefix] = lines
        return lines


def auth_curl_options(auth: RequestAuth) -> list[tuple[int, object]]:
    """What every handle of a source with `auth` carries. With request headers libcurl
    follows no redirect (it would carry X-Api-Key to another host): the engine follows each
    hop with its own host's headers. --netrc: libcurl sends a host's entry to it alone."""
    options: list[tuple[int, object]] = []
    if auth.headers:
        options.append((pycurl.FOLLOWLOCATION, 0))
    if auth.netrc:
        options.append((pycurl.NETRC, pycurl.NETRC_OPTIONAL))
    return options
