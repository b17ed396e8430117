"""JMESPath expressions into a listing page (--items, --name, --size, ...), and what their
values must be.

Most shapes name a plain field ("items", "name", "lfs.oid"): those are read with dict
lookups, a column at a time, since the jmespath package's interpreter costs about 2 us per
field per item, more than parsing the JSON itself. Anything else (filters, functions,
projections) goes through jmespath, compiled once. Both give the same answers: a field of
something that is not an object is null.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from typing import Any

from bulkfetch.errors import UsageError

_FIELD = r"[A-Za-z_][A-Za-z0-9_]*"
_SIMPLE = re.compile(rf"{_FIELD}(\.{_FIELD})*")
# [?a.b == 'text']: a list's objects whose field equals a raw string (hf-tree's files)
_FILTER = re.compile(rf"\[\?\s*({_FIELD}(?:\.{_FIELD})*)\s*==\s*'([^'\\]*)'\s*\]")
_HEX = frozenset("0123456789abcdefABCDEF")

Path = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def compile_path(expression: str, flag: str) -> Path:
    """A function page-or-item -> value for the JMESPath `expression` (of `flag`, named in
    a UsageError when it does not parse)."""
    expression = expression.strip()
    if expression == "@":
        return _identity
    if _SIMPLE.fullmatch(expression):
        keys = expression.split(".")
        if len(keys) == 1:
            key = keys[0]
            return lambda value: value.get(key) if type(value) is dict else None
        return lambda value: _dig(value, keys)
    found = _FILTER.fullmatch(expression)
    if found:
        wanted, fields = found[2], found[1].split(".")
        return lambda value: [item for item in value if _dig(item, fields) == wanted] \
            if type(value) is list else None
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        compiled = jmespath.compile(expression)
    except JMESPathError as exc:
        raise UsageError(f"{flag} {expression!r} is not a JMESPath expression: "
                         f"{str(exc).splitlines()[0]}") from None
    return compiled.search


def _dig(value: Any, keys: list[str]) -> Any:
    for key in keys:
        if type(value) is not dict:
            return None
        value = value.get(key)
    return value


def column(path: Path, items: list[Any]) -> list[Any]:
    """`path` of every item, in order."""
    if path is _identity:
        return items
    return list(map(path, items))


def size_of(value: Any) -> int:
    """A listed size: a non-negative number or decimal string (GCS sends uint64 as a
    string); -1 when the listing gives none. ValueError for anything else."""
    if value is None:
        return -1
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    raise ValueError(f"a size of {str(value)[:40]!r}")


def hex_digests(values: list[Any], length: int, algorithm: str) -> list[str]:
    """digest_hex() of each value; a hex digest (the usual case) without a call per item."""
    found: list[str] = []
    append = found.append
    label = algorithm + ":"  # GitHub's "sha256:<hex>"
    labelled = len(label) + 2 * length
    b64 = 4 * -(-length // 3)  # base64 of `length` bytes, padded
    for value in values:
        if type(value) is str and len(value) == labelled and value.startswith(label):
            value = value[len(label):]
        if type(value) is str and len(value) == 2 * length:
            try:  # bytes.fromhex: hex digits in C (it skips spaces: hence the length)
                if len(bytes.fromhex(value)) == length:
                    append(value.lower())
                    continue
            except ValueError:
                pass
        elif type(value) is str and len(value) == b64:  # GCS's md5Hash
            try:
                raw = binascii.a2b_base64(value, strict_mode=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) == length:
                append(raw.hex())
                continue
        append(digest_hex(value, length, algorithm))
    return found


def digest_hex(value: Any, length: int, algorithm: str) -> str:
    """A listed digest of `length` bytes as lower-case hex: given as hex, as base64 (GCS's
    md5Hash) or as "<algorithm>:<hex>" (GitHub's asset digest); "" when none is given.
    ValueError for anything else."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{algorithm} {str(value)[:40]!r} is not a string")
    text = value.strip()
    label, colon, rest = text.partition(":")
    if colon and label.lower() == algorithm:
        text = rest
    if len(text) == 2 * length and _HEX.issuperset(text):
        return text.lower()
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != length:
        raise ValueError(f"{algorithm} {value[:80]!r} is neither hex nor base64 of "
                         f"{length} bytes")
    return raw.hex()
