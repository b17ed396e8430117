"""Pagination tokens: round trip, and every kind of bad token refused."""

from __future__ import annotations

import base64

import pytest

from bulkfetch.server.tokens import BadToken, TokenCodec

CURSORS = [b"\x00", (1).to_bytes(8, "big"), (10**7 - 1).to_bytes(8, "big"), b"d/sub/f\xc3\xa9",
           bytes(range(256))]


@pytest.mark.parametrize("cursor", CURSORS)
def test_round_trip(cursor: bytes) -> None:
    codec = TokenCodec("synthetic/1000/100/0/0")
    token = codec.encode(cursor)
    assert token.isascii() and "=" not in token and "+" not in token and "/" not in token
    assert codec.decode(token) == cursor
    # stable across instances (restarts) for the same identity
    assert TokenCodec("synthetic/1000/100/0/0").decode(token) == cursor
    assert TokenCodec("synthetic/1000/100/0/0").encode(cursor) == token


def test_tokens_differ_by_cursor() -> None:
    codec = TokenCodec("x")
    assert len({codec.encode(i.to_bytes(8, "big")) for i in range(1000)}) == 1000


def test_another_identity_is_refused() -> None:
    token = TokenCodec("synthetic/1000/100/0/0").encode(b"\x00" * 7 + b"\x01")
    for other in ("synthetic/1000/100/1/0", "synthetic/1000/10/0/0", "", "tree//data/100"):
        with pytest.raises(BadToken):
            TokenCodec(other).decode(token)


def forge(cursor: bytes) -> str:
    return base64.urlsafe_b64encode(cursor + b"\x00" * 10).rstrip(b"=").decode()


def test_forged_tokens_are_refused() -> None:
    codec = TokenCodec("id")
    good = codec.encode((5).to_bytes(8, "big"))
    raw = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4))
    # the same MAC on a different cursor, a zero MAC, and every single-bit flip
    swapped = base64.urlsafe_b64encode((6).to_bytes(8, "big") + raw[8:]).rstrip(b"=").decode()
    candidates = [swapped, forge((5).to_bytes(8, "big"))]
    for position in range(len(raw)):
        for bit in (1, 0x80):
            flipped = bytearray(raw)
            flipped[position] ^= bit
            candidates.append(base64.urlsafe_b64encode(bytes(flipped)).rstrip(b"=").decode())
    for token in candidates:
        assert token != good
        with pytest.raises(BadToken):
            codec.decode(token)


def test_truncated_and_extended_tokens_are_refused() -> None:
    codec = TokenCodec("id")
    good = codec.encode((5).to_bytes(8, "big"))
    for cut in range(len(good)):
        with pytest.raises(BadToken):
            codec.decode(good[:cut])
    for token in (good + "A", good + "AA", good + "AAAA", "A" + good):
        with pytest.raises(BadToken):
            codec.decode(token)


def test_only_the_mac_with_no_cursor_is_refused() -> None:
    codec = TokenCodec("id")
    mac_only = base64.urlsafe_b64encode(codec._mac(b"")).rstrip(b"=").decode()
    with pytest.raises(BadToken):
        codec.decode(mac_only)


def test_non_canonical_base64_is_refused() -> None:
    codec = TokenCodec("id")
    cursor = b"\x01" + (5).to_bytes(8, "big")  # 9 + 10 bytes: base64 needs padding
    good = codec.encode(cursor)
    assert len(good) % 4 == 2  # the last character carries 4 spare low bits
    raw = base64.urlsafe_b64decode(good + "==")
    padded = base64.urlsafe_b64encode(raw).decode()
    assert padded == good + "=="
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    alias = good[:-1] + alphabet[alphabet.index(good[-1]) ^ 1]
    assert base64.urlsafe_b64decode(alias + "==") == raw  # same bytes, other spelling
    standard = base64.b64encode(raw).decode().rstrip("=")
    variants = [
        padded,
        good + "=",
        alias,
        good[:5] + "\n" + good[5:],  # whitespace that a lax decoder skips
        good[:5] + "." + good[5:],  # a non-alphabet character a lax decoder skips
        good[:4] + "=" + good[4:],
    ]
    if standard != good:  # '+' and '/' instead of '-' and '_'
        variants.append(standard)
    for token in variants:
        with pytest.raises(BadToken):
            codec.decode(token)


def test_standard_alphabet_spelling_is_refused() -> None:
    codec = TokenCodec("id")
    for number in range(200):
        good = codec.encode(number.to_bytes(8, "big"))
        if "-" in good or "_" in good:
            break
    else:
        pytest.fail("no token with - or _ among 200")
    with pytest.raises(BadToken):
        codec.decode(good.replace("-", "+").replace("_", "/"))


@pytest.mark.parametrize(
    "token",
    ["", "=", "====", "A", "é", "AAAAAAAAAAAAAAAAAAAAAAAAAé", "\u0661\u0662\u0663\u0664",
     "A" * 8193, "%00", " ", "null"],
)
def test_junk_is_refused(token: str) -> None:
    with pytest.raises(BadToken):
        TokenCodec("id").decode(token)


def test_bad_token_is_a_value_error() -> None:
    assert issubclass(BadToken, ValueError)
