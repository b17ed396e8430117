"""The Source protocol: list one page by token; turn a listed item into (name, URL); declare
what else it can do (Abilities, sources/abilities.py)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from typing import Protocol
from urllib.parse import unquote_to_bytes

from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.listed import ListedPage


def unusable_name(item: str) -> str:
    """The name a listed item that resolve() refused is reported and journaled under: a
    table's item is "name NUL url" (sources/table.py), any other item stands for itself."""
    return item.partition("\0")[0] or item


def data_url_body(url: str) -> bytes:
    """The body a data: URL (RFC 2397) carries: base64 when it says `;base64`, else
    percent-encoded. Raises ValueError when it is not one."""
    head, comma, data = url.partition(",")
    if not comma or not head.startswith("data:"):
        raise ValueError("a data: URL without a comma")
    if head.endswith(";base64"):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"a data: URL whose base64 is broken: {exc}") from None
    return unquote_to_bytes(data)


class Source(Protocol):
    def describe(self) -> str: ...

    def list_page(self, token: str | None) -> ListedPage:
        """One attempt at the page `token` (None: the first). Raises ListingError."""
        ...

    def resolve(self, item: str) -> tuple[str, str]:
        """(name, url) of a listed item. Raises ValueError with the reason if unusable."""
        ...

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        """The URLs of a page's items when every item is a plain name (safe as a path and
        in a URL, so name == item), else None: the caller then resolves item by item."""
        ...

    def abilities(self) -> Abilities:
        """What the source can do beyond this protocol (Abilities() for nothing more). A
        caller asks once, when it builds its fetcher or lister."""
        ...
