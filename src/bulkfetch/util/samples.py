"""Samples: a destination's members grouped the way webdataset groups a tar stream.

A member's key is its name up to the first dot of its last path component, and the rest is
its extension (`a/b/000001.seg.png`: key `a/b/000001`, extension `seg.png`). Consecutive
members with the same key make one sample, a dict `{"__key__": key, extension: bytes, ...}`,
so a sample is whole only when its members are stored next to each other. Unlike
webdataset, nothing is dropped: a name with no extension (no dot after its first
character) is a sample of its own under the extension "", an extension is kept as stored
(not lower-cased), and a second member with the same key and extension starts a new sample
instead of raising.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

KEY = "__key__"


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) of a member name."""
    head, slash, leaf = name.rpartition("/")
    dot = leaf.find(".", 1)  # a leading dot belongs to the key, as in webdataset
    if dot < 0:
        return name, ""
    return head + slash + leaf[:dot], leaf[dot + 1:]


def group(items: Iterable[tuple[str, bytes]]) -> Iterator[dict[str, str | bytes]]:
    """Samples from (name, bytes) in storage order; memory holds one sample."""
    sample: dict[str, str | bytes] | None = None
    for name, body in items:
        key, extension = split_key(name)
        if extension == KEY:
            raise ValueError(f"{name!r}: its extension is the sample's key field {KEY!r}")
        if sample is None or sample[KEY] != key or extension in sample:
            if sample is not None:
                yield sample
            sample = {KEY: key}
        sample[extension] = body
    if sample is not None:
        yield sample
