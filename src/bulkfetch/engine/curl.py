"""libcurl (pycurl) handles configured once, and the error classification of transfers."""

from __future__ import annotations

import os
import re
import time

import pycurl

from bulkfetch import __version__
from bulkfetch.config import Timeouts

USER_AGENT = f"bulkfetch/{__version__}"
# libcurl error codes after which another attempt may succeed.
RETRYABLE_CURL_ERRORS = {
    pycurl.E_COULDNT_RESOLVE_HOST,
    pycurl.E_COULDNT_CONNECT,
    pycurl.E_OPERATION_TIMEDOUT,
    pycurl.E_PARTIAL_FILE,
    pycurl.E_GOT_NOTHING,
    pycurl.E_SEND_ERROR,
    pycurl.E_RECV_ERROR,
    pycurl.E_SSL_CONNECT_ERROR,
    pycurl.E_HTTP2,
    getattr(pycurl, "E_HTTP2_STREAM", 92),
}


# The variables libcurl reads to choose a proxy for http(s) URLs (it ignores HTTP_PROXY in
# upper case: a CGI environment lets a request header set it).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def proxy_configured() -> bool:
    """Whether the environment names a proxy libcurl would use."""
    return any(os.environ.get(name) for name in PROXY_VARIABLES)


def retryable_status(status: int) -> bool:
    return status in (408, 429) or 500 <= status <= 599


def new_handle(timeouts: Timeouts) -> pycurl.Curl:
    handle = pycurl.Curl()
    handle.setopt(pycurl.NOSIGNAL, 1)
    handle.setopt(pycurl.USERAGENT, USER_AGENT)
    handle.setopt(pycurl.CONNECTTIMEOUT_MS, int(timeouts.connect_s * 1000))
    # "Idle": slower than min_speed for idle_s seconds ends the attempt (a trickle too).
    handle.setopt(pycurl.LOW_SPEED_LIMIT, timeouts.min_speed)
    handle.setopt(pycurl.LOW_SPEED_TIME, max(1, round(timeouts.idle_s)))
    if timeouts.total_s is not None:
        handle.setopt(pycurl.TIMEOUT_MS, int(timeouts.total_s * 1000))
    handle.setopt(pycurl.FOLLOWLOCATION, 1)
    handle.setopt(pycurl.MAXREDIRS, 5)
    handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    handle.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    # Bodies are stored as sent: no Accept-Encoding, and no decoding of a Content-Encoding
    # the server sends anyway (a gzip bomb stays a few KiB).
    handle.setopt(pycurl.HTTP_CONTENT_DECODING, 0)
    handle.setopt(pycurl.TCP_NODELAY, 1)
    if not proxy_configured():
        # Without these, libcurl looks up five proxy variables in the environment for every
        # transfer, reused connection or not (1,500 instructions per file, 1.5% of a
        # worker). Set only when the lookup would find nothing: a proxy in the environment
        # is used exactly as libcurl would use it.
        handle.setopt(pycurl.PROXY, "")
        handle.setopt(pycurl.NOPROXY, "")
    return handle


_ERROR_CODE = re.compile(rb"<Code>([A-Za-z][A-Za-z0-9.]{0,63})</Code>")


def error_code(chunks: list[bytes]) -> str:
    """" " + the error code an S3-style error body names (<Error><Code>AccessDenied</Code>:
    why a 403 is one, in the store's words), or "" (any other body, or none)."""
    head = chunks[0][:2048] if chunks else b""
    found = _ERROR_CODE.search(head) if b"<Code>" in head else None
    return " " + found[1].decode("ascii") if found else ""


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds from now; both the delta-seconds and the HTTP-date form."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime  # rare: loading it is 7 ms of start-up

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def header_values(lines: list[bytes], *names: bytes) -> tuple[str | None, ...]:
    """The values of headers `names` (lower-case, without the colon) in raw header lines;
    the last one wins when a header repeats. One join and a search per name: this runs once
    per file, where a loop over the lines would cost several times more."""
    block = b"\r\n" + b"".join(lines)
    lowered = block.lower()
    found: list[str | None] = []
    for name in names:
        key = b"\n" + name + b":"
        at = lowered.rfind(key)
        if at < 0:
            found.append(None)
            continue
        start = at + len(key)
        end = block.find(b"\r\n", start)
        found.append(block[start : end if end >= 0 else None].strip().decode("latin-1"))
    return tuple(found)


def header_value(lines: list[bytes], name: bytes) -> str | None:
    return header_values(lines, name)[0]
