"""A registry's blobs as a Source, so `bulkfetch pull` moves layers through the same engine
as `get`: ranges, byte-level resume, retries, Retry-After, adaptive concurrency.

The pull resolves manifests first (oci/pull.py) and hands the engine a BlobPlan: each blob's
name in the layout (blobs/ALG/HEX), its URL, and the size and digest its manifest gives,
which the fetcher checks in place of anything the server states (Source.pinned). Requests to
the registry carry its Authorization (a bearer token renewed in the worker as it ages);
anything else, a foreign layer's URL, carries none. A redirect to another host (a CDN, S3)
loses the header too: libcurl sends a custom Authorization only to the host it was set for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from bulkfetch.config import GetOptions
from bulkfetch.oci.auth import AuthError, Authorizer
from bulkfetch.sources.abilities import Abilities, Pinned
from bulkfetch.sources.base import Source
from bulkfetch.sources.listed import ListedPage
from bulkfetch.sources.registry import SourceKind, register

BLOBS_PER_PAGE = 1  # a page per blob: blobs spread over the workers as they finish


@dataclass(frozen=True, slots=True)
class BlobSpec:
    name: str  # blobs/ALG/HEX, the path in the layout
    url: str
    size: int
    algorithm: str  # hashlib name
    hex: str


@dataclass(frozen=True)
class BlobPlan:
    """A pull's blobs, handed to the engine whole (config.SourcePlan): read by BlobSource."""

    kind: ClassVar[str] = "oci-blobs"
    blobs: tuple[BlobSpec, ...]
    # (URL prefix, what requests under it carry), longest prefix first: one per repository
    auth: tuple[tuple[str, Authorizer], ...] = ()

    def identity(self) -> str:
        """What the journal's fingerprint records: which blobs, not how they are reached."""
        names = "\n".join(sorted(blob.name for blob in self.blobs))
        return "oci-blobs:" + hashlib.sha256(names.encode()).hexdigest()

    def summary(self) -> dict[str, object]:
        """For reports: no credentials, no tokens."""
        return {"blobs": len(self.blobs), "bytes": sum(blob.size for blob in self.blobs)}


class BlobSource:
    def __init__(self, plan: BlobPlan) -> None:
        self.plan = plan
        self.by_name = {blob.name: blob for blob in plan.blobs}
        self.pins = {blob.name: Pinned(blob.size, blob.algorithm, bytes.fromhex(blob.hex),
                                       "the manifest") for blob in plan.blobs}

    def describe(self) -> str:
        return f"{len(self.plan.blobs)} blobs"

    def list_page(self, token: str | None) -> ListedPage:
        start = int(token or 0)
        blobs = self.plan.blobs[start:start + BLOBS_PER_PAGE]
        end = start + len(blobs)
        return ListedPage(tuple(blob.name for blob in blobs),
                          str(end) if end < len(self.plan.blobs) else None,
                          total=len(self.plan.blobs),
                          sizes=tuple(blob.size for blob in blobs))

    def resolve(self, item: str) -> tuple[str, str]:
        blob = self.by_name.get(item)
        if blob is None:
            raise ValueError("not a blob of this pull")
        return blob.name, blob.url

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None  # names hold slashes: resolved one by one (a handful per pull)

    def abilities(self) -> Abilities:
        """Each blob is checked against its manifest's size and digest (pinned), whatever
        the registry states; requests to the registry carry its Authorization, renewed after
        a 401 (reauthorize)."""
        return Abilities(request_headers=self.headers if self.plan.auth else None,
                         pinned=self.pins.get, reauthorize=self.reauthorize)

    def _authorizer(self, url: str) -> Authorizer | None:
        for prefix, authorizer in self.plan.auth:
            if url.startswith(prefix):
                return authorizer
        return None

    def reauthorize(self, url: str) -> bool:
        """A 401 for `url`: its token expired early or was revoked. The next attempt renews
        it (a registry whose issuer keeps refusing fails by the retry limit)."""
        authorizer = self._authorizer(url)
        if authorizer is None or authorizer.kind != "bearer":
            return False
        authorizer.renew_at = 0.0
        return True

    def headers(self, url: str) -> list[str]:
        authorizer = self._authorizer(url)
        if authorizer is None:
            return []
        try:
            return authorizer.headers()
        except AuthError:  # the issuer is down: the old token, refused or not
            return [f"Authorization: Bearer {authorizer.token}"] if authorizer.token else []


def _open(options: GetOptions, listing: bool) -> Source:
    assert isinstance(options.plan, BlobPlan)
    return BlobSource(options.plan)


register(SourceKind(BlobPlan.kind, _open, "a pull's blobs"))
