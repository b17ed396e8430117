"""What an HTTP response says about keeping it: RFC 9111's rules for a private cache, in
the part a bulk reader needs (the store is httpcache.py).

From the final response's header lines (libcurl hands over every response of a redirect
chain; the last block is the one that counts):

- `Cache-Control: no-store` -> not kept. `private` is fine: this is a private cache.
- `no-cache` -> kept, but every use is revalidated first (as if always stale).
- `max-age=N` -> fresh for N seconds less its `Age`. `s-maxage` is for shared caches and
  ignored. `must-revalidate` is recorded: this cache never serves a stale entry anyway.
- no max-age: `Expires` minus `Date` (the server's clock, so a skewed client clock does not
  matter; no Date: Expires minus now). An Expires that does not parse ("0") is the past.
- no freshness at all (none of the above, the usual static server: nginx, S3, the
  reference server): `ttl` seconds when the cache has a `ttl`, else stale at once (kept
  only if it has a validator, then every use is a conditional request).

An answer that is stale at once and has neither ETag nor Last-Modified is not kept: it
could never be used.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parsedate_to_datetime

__all__ = ["Freshness", "freshness", "response_headers"]

# Headers the cache reads (lower-case); any others in the response are ignored.
WANTED = frozenset({"cache-control", "expires", "date", "age", "etag", "last-modified",
                    "vary"})
# A validator goes back to the server in a request header: a value with a control
# character (CR, LF, NUL: header injection) or absurdly long is not used as one.
MAX_VALIDATOR = 1024


@dataclass(frozen=True, slots=True)
class Freshness:
    """What to keep of one response: `lifetime` seconds fresh from now (0: stale at once),
    and its validators ("" when absent)."""

    store: bool
    lifetime: float
    etag: str = ""
    last_modified: str = ""
    no_cache: bool = False
    must_revalidate: bool = False


def response_headers(lines: list[bytes]) -> dict[str, str]:
    """The final response's headers of interest (lower-case names; repeated ones joined by
    ", " as HTTP allows for lists), from libcurl's raw header lines, redirects included."""
    start = 0
    for at, line in enumerate(lines):
        if line.startswith(b"HTTP/"):
            start = at + 1
    found: dict[str, str] = {}
    for line in lines[start:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        key = name.strip().lower().decode("latin-1")
        if key in WANTED:
            text = value.strip().decode("latin-1")
            found[key] = f"{found[key]}, {text}" if key in found else text
    return found


def _directives(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split(","):
        name, _, argument = part.partition("=")
        name = name.strip().lower()
        if name:
            out.setdefault(name, argument.strip().strip('"'))  # the first one counts
    return out


def _seconds(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _http_date(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _validator(text: str | None) -> str:
    if not text or len(text) > MAX_VALIDATOR or not text.isprintable():
        return ""
    return text


def freshness(headers: dict[str, str], now: float, ttl: float | None) -> Freshness:
    """The rules above for one response's `headers` (response_headers()) received at `now`
    (Unix time) by a cache whose override is `ttl` seconds (None: no override)."""
    control = _directives(headers.get("cache-control", ""))
    if "no-store" in control or headers.get("vary", "").strip() == "*":
        return Freshness(False, 0.0)
    etag = _validator(headers.get("etag"))
    last_modified = _validator(headers.get("last-modified"))
    no_cache = "no-cache" in control
    lifetime: float | None = None
    max_age = _seconds(control.get("max-age", ""))
    if max_age is not None:
        lifetime = max_age - (_seconds(headers.get("age", "")) or 0)
    elif "expires" in headers:
        expires = _http_date(headers["expires"])
        date = _http_date(headers.get("date")) or now
        lifetime = -1.0 if expires is None else expires - date
    elif ttl is not None and not no_cache:
        lifetime = ttl
    lifetime = 0.0 if no_cache or lifetime is None else max(0.0, lifetime)
    keep = lifetime > 0 or bool(etag or last_modified)
    return Freshness(keep, lifetime, etag, last_modified, no_cache,
                     "must-revalidate" in control)
