"""--include and --exclude: which names a listing takes (s3://, a directory tree)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence


def key_filter(include: Sequence[str], exclude: Sequence[str]) -> Callable[[str], bool] | None:
    """A name is taken when it matches an --include (or none is given) and no --exclude.
    Globs are fnmatch's, matched against the whole name: `*` also crosses '/'."""
    if not include and not exclude:
        return None

    def compiled(patterns: Sequence[str]) -> Callable[[str], object] | None:
        if not patterns:
            return None
        return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match

    wanted, unwanted = compiled(include), compiled(exclude)
    return lambda name: ((wanted is None or wanted(name) is not None)
                         and (unwanted is None or unwanted(name) is None))
