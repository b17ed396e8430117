"""MD5 of bodies with the cheaper implementation for their size.

For a 100-byte body CPython's own MD5 (`_md5`) costs about half of OpenSSL's, whose context
setup and cleanup dominate at that size; from about 2 KB on, OpenSSL's assembly is faster.
Interpreters built without `_md5` use hashlib's for every size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

try:
    from _md5 import md5 as builtin_md5
except ImportError:  # pragma: no cover - depends on how Python was built
    builtin_md5 = hashlib.md5

SMALL_BODY = 2048
openssl_md5: Callable[[bytes], Any] = hashlib.md5


def md5_hex(body: bytes) -> str:
    return (builtin_md5 if len(body) < SMALL_BODY else openssl_md5)(body).hexdigest()
