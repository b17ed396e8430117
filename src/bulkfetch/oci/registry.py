"""A registry's small requests: manifests and config blobs, with auth and retries.

Layers go through the download engine (blobs.py); what is asked for here is a few KB
and decides what the engine fetches, so every answer is checked before use: the manifest's
bytes against the digest asked for and against `Docker-Content-Digest`, a config blob
against its descriptor.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

import pycurl

from bulkfetch.config import Timeouts, TlsOptions
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.net.curl import (
    RETRYABLE_CURL_ERRORS,
    header_value,
    new_handle,
    perform_get,
    retry_after_seconds,
    tls_failure,
)
from bulkfetch.oci.auth import AuthError, Authorizer, Credentials
from bulkfetch.oci.manifest import ACCEPT, MAX_MANIFEST, ManifestError, media_type
from bulkfetch.oci.reference import Digest, Reference, parse_digest

ATTEMPTS = 5  # per request: 429, 5xx and transport errors are retried
MAX_WAIT_S = 60.0  # the longest Retry-After we sit out


class RegistryError(BulkfetchError):
    """A registry answered something we cannot use (after retries)."""


@dataclass(frozen=True, slots=True)
class Fetched:
    media_type: str
    body: bytes
    digest: Digest
    pulls_left: str = ""  # Docker Hub's RateLimit-Remaining / RateLimit-Limit, when sent


def pulls_left(lines: list[bytes]) -> str:
    """'76 of 100 pulls left (per 21600 s)' from Docker Hub's ratelimit-* headers, or ''."""
    remaining = header_value(lines, b"ratelimit-remaining") or ""
    limit = header_value(lines, b"ratelimit-limit") or ""
    left, _, window = remaining.partition(";w=")
    most = limit.partition(";")[0]
    if not left.strip().isdigit():
        return ""
    text = f"{left.strip()} of {most.strip()} pulls left" if most.strip().isdigit() \
        else f"{left.strip()} pulls left"
    return text + (f" (per {window.strip()} s)" if window.strip().isdigit() else "")


class Registry:
    """One repository of one registry, as `ref` names it."""

    def __init__(self, ref: Reference, *, plain_http: bool = False,
                 credentials: Credentials | None = None, timeouts: Timeouts | None = None,
                 tls: TlsOptions | None = None) -> None:
        self.ref = ref
        self.base = ref.base_url(plain_http)
        self.timeouts = timeouts or Timeouts()
        self.tls = tls
        self.auth = Authorizer(credentials=credentials, timeouts=self.timeouts, tls=tls)
        self.scope = f"repository:{ref.repository}:pull"

    def blob_url(self, digest: Digest) -> str:
        return f"{self.base}/v2/{self.ref.repository}/blobs/{digest}"

    def _get(self, url: str, accept: str | None, limit: int, what: str,
             ) -> tuple[int, list[bytes], bytes]:
        """GET `url` with auth: a 401 is answered once per challenge, 429/5xx and transport
        errors are retried (Retry-After honoured up to MAX_WAIT_S)."""
        auth_rounds = 0
        for attempt in range(1, ATTEMPTS + 1):
            handle = new_handle(self.timeouts, self.tls)
            handle.setopt(pycurl.MAXFILESIZE_LARGE, limit)
            headers = [f"Accept: {accept}"] if accept else []
            try:
                handle.setopt(pycurl.HTTPHEADER, headers + self.auth.headers())
                status, lines, body = perform_get(handle, url)
            except AuthError as exc:
                raise UsageError(str(exc)) from None
            except pycurl.error as exc:
                code, message = exc.args[0], exc.args[-1]
                fatal = tls_failure(code, message, url, self.tls)
                if fatal is not None:
                    raise UsageError(f"{what}: {fatal}") from None
                if code == pycurl.E_FILESIZE_EXCEEDED:
                    raise RegistryError(f"{what}: more than {limit:,} bytes; a registry "
                                        "sending this is broken or hostile") from None
                if code not in RETRYABLE_CURL_ERRORS or attempt == ATTEMPTS:
                    raise RegistryError(f"{what}: {message} (curl error {code})") from None
                self._pause(attempt, None)
                continue
            finally:
                handle.close()
            if status == 401 and auth_rounds < 2:
                auth_rounds += 1
                challenge = header_value(lines, b"www-authenticate") or ""
                try:
                    self.auth.answer(challenge, self.scope, what)
                except AuthError as exc:
                    raise UsageError(str(exc)) from None
                continue
            if (status == 429 or status >= 500) and attempt < ATTEMPTS:
                self._pause(attempt, retry_after_seconds(header_value(lines, b"retry-after")))
                continue
            return status, lines, body
        raise RegistryError(f"{what}: no answer after {ATTEMPTS} attempts")

    @staticmethod
    def _pause(attempt: int, retry_after: float | None) -> None:
        wait = retry_after if retry_after is not None else \
            min(8.0, 0.25 * 2 ** attempt) * (0.5 + random.random())
        time.sleep(min(wait, MAX_WAIT_S))

    def manifest(self, reference: str) -> Fetched:
        """The manifest or index `reference` (tag or digest) names, checked: its bytes hash
        to the digest asked for, and to the Docker-Content-Digest the registry states."""
        what = f"{self.ref.registry}/{self.ref.repository}@{reference}" if ":" in reference \
            else f"{self.ref.registry}/{self.ref.repository}:{reference}"
        url = f"{self.base}/v2/{self.ref.repository}/manifests/{reference}"
        status, lines, body = self._get(url, ACCEPT, MAX_MANIFEST, what)
        if status == 404:
            raise UsageError(f"{what}: the registry has no such image (HTTP 404); check the "
                             "repository name and the tag")
        if status in (401, 403):
            raise UsageError(f"{what}: the registry refused access (HTTP {status})")
        if status != 200:
            raise RegistryError(f"{what}: HTTP {status} for the manifest")
        wanted = parse_digest(reference) if ":" in reference else None
        stated_text = header_value(lines, b"docker-content-digest")
        try:
            stated = parse_digest(stated_text, "Docker-Content-Digest") if stated_text \
                else None
        except ValueError as exc:
            raise RegistryError(f"{what}: {exc}") from None
        for expected, why in ((wanted, "the digest asked for"),
                              (stated, "its Docker-Content-Digest")):
            if expected is not None and _hex(expected, body) != expected.hex:
                raise RegistryError(f"{what}: the manifest's bytes do not match {why} "
                                    f"({expected}); the registry or something on the way "
                                    "altered it")
        digest = wanted or Digest("sha256", hashlib.sha256(body).hexdigest())
        try:
            kind = media_type(body, header_value(lines, b"content-type") or "")
        except ManifestError as exc:
            raise RegistryError(f"{what}: {exc}") from None
        return Fetched(kind, body, digest, pulls_left(lines))

    def small_blob(self, digest: Digest, size: int, what: str) -> bytes:
        """A small blob (an image config), checked against its digest and size."""
        status, _, body = self._get(self.blob_url(digest), None, max(size, 1), what)
        if status != 200:
            raise RegistryError(f"{what}: HTTP {status} for blob {digest}")
        if len(body) != size or _hex(digest, body) != digest.hex:
            raise RegistryError(f"{what}: blob {digest} does not match its digest and size "
                                f"({len(body)} bytes, {size} expected)")
        return body


def _hex(digest: Digest, body: bytes) -> str:
    return hashlib.new(digest.algorithm, body).hexdigest()
