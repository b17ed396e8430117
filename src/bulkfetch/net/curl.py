"""libcurl (pycurl) handles configured once, and the error classification of transfers."""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pycurl

from bulkfetch._version import __version__
from bulkfetch.config import Timeouts, TlsOptions

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
# The server's certificate was refused: no retry or other file on that host fares better.
# (E_SSL_CONNECT_ERROR, 35, stays retryable: a handshake cut short by a reset or an
# overloaded server is one too, and its text does not tell the kinds apart reliably.)
CERTIFICATE_ERRORS = frozenset({
    pycurl.E_PEER_FAILED_VERIFICATION,  # 60: unknown CA, self-signed, expired, wrong name
    getattr(pycurl, "E_SSL_ISSUER_ERROR", 83),
    getattr(pycurl, "E_SSL_PINNEDPUBKEYNOTMATCH", 90),
    getattr(pycurl, "E_SSL_INVALIDCERTSTATUS", 91),
})
# What this side trusts or presents cannot be used (a CA bundle that went bad after the
# start check, a CRL file, a client certificate): no transfer anywhere would succeed.
TRUST_STORE_ERRORS = frozenset({
    getattr(pycurl, "E_SSL_CACERT_BADFILE", 77),
    getattr(pycurl, "E_SSL_CRL_BADFILE", 82),
    getattr(pycurl, "E_SSL_CERTPROBLEM", 58),
})
TLS_FATAL_ERRORS = CERTIFICATE_ERRORS | TRUST_STORE_ERRORS


class FatalTransferError(Exception):
    """A transfer failed in a way no retry and no other file escapes (a certificate libcurl
    refused): the run stops with exit status 2 instead of failing its files one by one."""


def host_port(url: str) -> str:
    """host:port of a URL (the scheme's port when none is given), for messages."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port or (443 if parts.scheme == 'https' else 80)}"


# libcurl's words before the reason itself, left out of messages.
_TLS_PREFIXES = ("SSL certificate OpenSSL verify result: ", "SSL certificate problem: ", "SSL: ")


def tls_failure(code: int, message: str, url: str, tls: TlsOptions | None) -> str | None:
    """The message that stops the run when libcurl's error `code` is one no retry fixes
    (TLS_FATAL_ERRORS): which certificate, libcurl's reason, how to trust it; else None."""
    if code not in TLS_FATAL_ERRORS:
        return None
    from bulkfetch.net.tls import HOW_TO_TRUST

    tls = tls or TlsOptions()
    reason = next((message[len(p):] for p in _TLS_PREFIXES if message.startswith(p)), message)
    if code in CERTIFICATE_ERRORS:
        trusting = f" (this run trusted {tls.ca_bundle}, from {tls.origin})" if tls.origin \
            else ""
        return (f"the TLS certificate of {host_port(url)} was refused: {reason} (curl error "
                f"{code}). {HOW_TO_TRUST}{trusting}")
    if tls.ca_bundle is not None and code == getattr(pycurl, "E_SSL_CACERT_BADFILE", 77):
        return (f"the CA certificates {tls.ca_bundle} ({tls.origin}) cannot be used for "
                f"{host_port(url)}: {reason} (curl error {code})")
    return f"TLS to {host_port(url)} cannot be set up on this side: {reason} (curl error {code})"


def unreachable(code: int, message: str, url: str) -> str | None:
    """What a failure before any answer means, for a message naming host and port and what
    to check: nothing listens there, the name does not resolve, the connection timed out,
    or the TLS handshake failed (an https:// URL on a plain HTTP port); None for any other
    failure. At a run's first request such a failure is the user's to fix: retrying asks
    the same place again."""
    where = host_port(url)
    through = " (or the proxy the environment names)" if proxy_configured() else ""
    if code in (pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_COULDNT_RESOLVE_PROXY):
        host = urlsplit(url).hostname or "?"
        return (f"cannot resolve the host {host!r}: {message} (curl error {code}). Check the "
                f"URL's host name{through}")
    if code == pycurl.E_COULDNT_CONNECT:
        return (f"nothing accepts connections at {where}{through}: {message} (curl error "
                f"{code}). Check that the server is running and that the URL's host and port "
                "are right")
    if code == pycurl.E_OPERATION_TIMEDOUT and message.startswith(
            ("Connection timed out", "Failed to connect")):
        tls = " (or the TLS handshake: if the server speaks plain HTTP there, give " \
            "http://)" if url.startswith("https://") else ""
        return (f"{where} did not accept the connection within --connect-timeout{through}"
                f"{tls}: {message} (curl error {code}). Check the URL's host and port, and "
                "any firewall on the way")
    if code == pycurl.E_SSL_CONNECT_ERROR and url.startswith("https://"):
        return (f"the TLS handshake with {where} failed: {message} (curl error {code}). If "
                "the server speaks plain HTTP on that port, give http://")
    return None


# The variables libcurl reads to choose a proxy for http(s) URLs (it ignores HTTP_PROXY in
# upper case: a CGI environment lets a request header set it).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def proxy_configured() -> bool:
    """Whether the environment names a proxy libcurl would use."""
    return any(os.environ.get(name) for name in PROXY_VARIABLES)


def retryable_status(status: int) -> bool:
    return status in (408, 429) or 500 <= status <= 599


def attempt_failure(body: Any, error: tuple[int, str] | None, ok_status: int, url: str,
                    reauthorize: Callable[[str], bool] | None) -> tuple[str, bool]:
    """(reason, retryable) of a big body's attempt that went wrong (a spooling.SpooledBody
    or parts.Part: its error, started, status); ("", True) when it did not. A 401 is worth
    another attempt when `reauthorize(url)` says so (a registry's token, renewed)."""
    if body.error is not None:
        return str(body.error), False
    if error is not None and not (body.started and body.status != ok_status):
        # (a wrong status stopped the transfer itself: it is judged by the status)
        code, message = error
        return f"{message} (curl error {code})", code in RETRYABLE_CURL_ERRORS
    if body.status != ok_status:
        if body.status == 401 and reauthorize is not None:
            return "HTTP 401", reauthorize(url)
        return f"HTTP {body.status}", retryable_status(body.status)
    return "", True


def configure_tls(handle: pycurl.Curl, tls: TlsOptions) -> None:
    """Trust as the run says, set once per handle: nothing per transfer, and every handle
    of a run the same, so libcurl reuses any connection (and TLS session) for any of them,
    and keeps the CA store it parsed (CURLOPT_CA_CACHE_TIMEOUT) for the next handshake."""
    if tls.insecure:
        handle.setopt(pycurl.SSL_VERIFYPEER, 0)
        handle.setopt(pycurl.SSL_VERIFYHOST, 0)
    elif tls.ca_bundle is not None:
        if os.path.isdir(tls.ca_bundle):  # requests reads a directory so too
            handle.setopt(pycurl.CAPATH, tls.ca_bundle)
            handle.unsetopt(pycurl.CAINFO)  # only the directory, not the built-in file
        else:
            handle.setopt(pycurl.CAINFO, tls.ca_bundle)


def new_handle(timeouts: Timeouts, tls: TlsOptions | None = None) -> pycurl.Curl:
    """A handle with the run's options; `tls` None leaves libcurl's own trust store."""
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
    if tls is not None:
        configure_tls(handle, tls)
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


def last_response(headers: list[bytes]) -> list[bytes]:
    """The header lines of the last response (after a redirect or a 100 Continue)."""
    starts = [i for i, line in enumerate(headers) if line.startswith(b"HTTP/")]
    return headers[starts[-1] if starts else 0 :]


def perform_get(handle: pycurl.Curl, url: str) -> tuple[int, list[bytes], bytes]:
    """GET `url` on `handle` to its end: (status, the last response's header lines, body).
    pycurl.error goes to the caller, who knows what a failure means for it."""
    body, headers = io.BytesIO(), []
    handle.setopt(pycurl.URL, url)
    handle.setopt(pycurl.WRITEDATA, body)
    handle.setopt(pycurl.HEADERFUNCTION, headers.append)
    handle.perform()
    return int(handle.getinfo(pycurl.RESPONSE_CODE)), last_response(headers), body.getvalue()
