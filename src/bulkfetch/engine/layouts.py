"""What the fetcher's big bodies learn of the objects uploaded in parts they fetch
(engine/multipart.py): whether to ask an object's layout before its body, the size of its
parts once asked, and when a failed check of its parts says more about the layout assumed
than about the body."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bulkfetch.engine.digests import final_headers, stated_digests
from bulkfetch.engine.multipart import LayoutProbe, PartsHasher, claims, part_size
from bulkfetch.engine.parts import SplitPlan


class PartLayouts:
    """`request`: the source's layout_request (S3), None when nothing is to be asked (no
    such source, or --no-verify)."""

    def __init__(self, request: Callable[[str], tuple[str, list[str]]] | None) -> None:
        self.request = request
        self.sizes: dict[str, int] = {}  # name -> the size of its parts, for its streams
        # name -> the parts digest its last attempt computed, when it did not match
        self.seen: dict[str, bytes] = {}

    def probe_for(self, plan: SplitPlan | None, lines: list[bytes]) -> LayoutProbe | None:
        """The probe to ask first for the object whose first response is `lines`, when it
        was uploaded in parts and nothing else checks it whole (no MD5, no whole-object
        checksum); None to go on at once."""
        if self.request is None:
            return None
        headers = final_headers(lines)
        if plan.stated if plan is not None else stated_digests(headers):
            return None
        found = claims(headers)
        length = headers.get("content-length", "")
        if found is None or not length.isdigit():
            return None
        return LayoutProbe(plan, found, int(length))

    def settled(self, name: str, probe: LayoutProbe,
                error: tuple[int, str] | None) -> SplitPlan | None:
        """The plan to fetch `name` by once its probe ended: with its parts' digests when
        the answer gave a layout that fits (a store that does not answer partNumber, or a
        failed probe, leaves it checked by size: the body's own request meets any real
        trouble)."""
        size = None
        if error is None and probe.status in (200, 206) and probe.lines is not None:
            size = part_size(final_headers(probe.lines), probe.total, probe.claims.count)
        if size is None:
            return probe.plan
        self.sizes[name] = size
        if probe.plan is None:
            return None
        return replace(probe.plan, stated={**probe.plan.stated, **probe.claims.named(size)})

    def cut_otherwise(self, name: str, stated: dict[str, bytes], other: Any) -> bool:
        """Whether a body whose only check, the digest of its parts, failed is to be kept,
        checked by its size: the same digest failed twice, so the same bytes came both
        times, and the parts were not cut where part 1's size says (an upload in parts of
        more than one size). A body changed in transit comes right, or changed otherwise,
        the next time; one the store keeps wrong is kept, as it was before parts were
        checked."""
        if not isinstance(other, PartsHasher) or "md5" in stated:
            return False
        computed = other.digest()
        if computed == stated.get(other.name):
            return False  # (it is another check that failed)
        if self.seen.get(name) == computed:
            del self.seen[name]
            return True
        self.seen[name] = computed
        return False

    def forget(self, name: str) -> None:
        """`name` is stored (a resumed file's failed digest is in `seen` with no size)."""
        self.sizes.pop(name, None)
        self.seen.pop(name, None)
