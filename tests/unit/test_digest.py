"""MD5 of bodies: both implementations agree with hashlib on every size around the switch."""

from __future__ import annotations

import hashlib
import os

import pytest

from bulkfetch.util.md5 import SMALL_BODY, builtin_md5, md5_hex, openssl_md5


@pytest.mark.parametrize("size", [0, 1, 100, SMALL_BODY - 1, SMALL_BODY, SMALL_BODY + 1,
                                  1 << 20])
def test_md5_hex_matches_hashlib(size: int) -> None:
    body = os.urandom(size)
    expected = hashlib.md5(body).hexdigest()
    assert md5_hex(body) == expected
    assert builtin_md5(body).hexdigest() == openssl_md5(body).hexdigest() == expected


def test_known_vector() -> None:
    assert md5_hex(b"abc") == "900150983cd24fb0d6963f7d28e17f72"
