"""Remote names are untrusted input. check_name() says why a name cannot become a path under
DEST; local_parts() turns an accepted name into path components (optionally fanned out)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

NAME_MAX = 255  # bytes in one path component (ext4, xfs, btrfs)
PATH_MAX = 4000  # bytes in the whole relative path, leaving room for DEST itself
RESERVED = ".bulkfetch"  # bulkfetch's own state lives in DEST/.bulkfetch

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Components of letters, digits, '_', '-' and inner dots: safe everywhere, and URL-safe as is.
# Almost every real name is plain, so this one regex spares the full check per file.
_COMPONENT = r"[A-Za-z0-9_-](?:[A-Za-z0-9_.-]{0,253}[A-Za-z0-9_-])?"
_PLAIN_NAME = rf"{_COMPONENT}(?:/{_COMPONENT})*"
_PLAIN = re.compile(_PLAIN_NAME)
# A whole page at once: names joined by newlines, once no name is seen to contain one.
_PLAIN_LINES = re.compile(rf"{_PLAIN_NAME}(?:\n{_PLAIN_NAME})*")


def is_plain(name: str) -> bool:
    """True for names that need neither checking beyond length nor URL quoting."""
    return len(name) <= PATH_MAX and _PLAIN.fullmatch(name) is not None


def all_plain(names: Sequence[str]) -> bool:
    """is_plain() of every name, in one regex pass over the page (the common case)."""
    try:
        joined = "\n".join(names)
    except TypeError:  # not all strings: let the per-name path say why
        return False
    return (bool(names) and joined.count("\n") == len(names) - 1  # no name holds one
            and max(map(len, names)) <= PATH_MAX and _PLAIN_LINES.fullmatch(joined) is not None)


_DRIVE = re.compile(r"^[A-Za-z]:")


def check_name(name: str) -> str | None:
    """None when `name` is a safe relative path; otherwise the reason it is refused."""
    if is_plain(name):
        return None
    if not name:
        return "empty name"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if _CONTROL.search(name):
        return "name contains NUL or control characters"
    if "\\" in name:
        return "name contains a backslash (a Windows path separator)"
    if name.startswith("/"):
        return "absolute path"
    if name.startswith("~"):
        return "name starts with ~ (a home directory reference)"
    if _DRIVE.match(name):
        return "name starts with a drive letter"
    if len(encoded) > PATH_MAX:
        return f"name longer than {PATH_MAX} bytes"
    parts = name.split("/")
    if parts[0] == RESERVED:
        return f"name inside {RESERVED}/, which holds bulkfetch's own state"
    for part in parts:
        if part in ("", ".", ".."):
            return "empty, '.' or '..' path component"
        # Full-width dots and similar compatibility forms become '..' on some systems.
        if unicodedata.normalize("NFKC", part) in (".", ".."):
            return "path component that normalises to '.' or '..'"
        if len(part.encode("utf-8")) > NAME_MAX:
            return f"path component longer than {NAME_MAX} bytes"
        if part[-1] in ". ":
            return "path component ends with a dot or a space (not portable)"
    return None


def local_parts(name: str, fanout: int = 0) -> list[str]:
    """Path components under DEST for an accepted name; fanout adds hash-prefix levels."""
    parts = name.split("/")
    if fanout:
        digest = hashlib.md5(name.encode("utf-8")).hexdigest()
        parts = [digest[2 * i : 2 * i + 2] for i in range(fanout)] + parts
    return parts
