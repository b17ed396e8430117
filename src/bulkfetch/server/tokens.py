"""Pagination tokens: opaque to clients, authenticated, and stable across restarts.

A token is base64url(cursor || MAC) where the MAC is keyed by the data set's identity, so a
token saved yesterday still works against the same data set, and a forged token, or one
from another data set, is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

_MAC_BYTES = 10


class BadToken(ValueError):
    """The token was not issued for this data set."""


class TokenCodec:
    def __init__(self, identity: str) -> None:
        self._key = hashlib.blake2b(identity.encode(), digest_size=32).digest()

    def _mac(self, cursor: bytes) -> bytes:
        return hashlib.blake2b(cursor, key=self._key, digest_size=_MAC_BYTES).digest()

    def encode(self, cursor: bytes) -> str:
        raw = cursor + self._mac(cursor)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, token: str) -> bytes:
        if not token or len(token) > 8192 or not token.isascii():
            raise BadToken(token)
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise BadToken(token) from None
        cursor = raw[:-_MAC_BYTES]
        # Comparing whole re-encodings also refuses non-canonical base64 spellings.
        if len(raw) <= _MAC_BYTES or not hmac.compare_digest(self.encode(cursor), token):
            raise BadToken(token)
        return cursor
