"""engine/multipart.py: what a response says of an object uploaded in parts, the layout a
`HEAD ?partNumber=1` gives, and the digests of its parts, as S3 computes them (here, the
way s3kit's uploads to moto and SeaweedFS are checked: each part hashed, then the
concatenated part digests)."""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from bulkfetch.engine.digests import (
    BY_DIGEST,
    BY_MD5,
    checked_way,
    mismatch,
    new_hasher,
    strongest,
)
from bulkfetch.engine.multipart import PartClaims, PartsHasher, claims, parse_name, part_size

MIB = 1 << 20
BODY = bytes(range(256)) * (49 * 1024 + 3)  # 12.25 MiB and 768 bytes: 3 parts of 5 MiB


def cut(body: bytes, size: int) -> list[bytes]:
    return [body[at:at + size] for at in range(0, len(body), size)] or [b""]


def etag(body: bytes, size: int) -> str:
    parts = cut(body, size)
    inner = b"".join(hashlib.md5(part).digest() for part in parts)
    return f'"{hashlib.md5(inner).hexdigest()}-{len(parts)}"'


def crc32_composite(body: bytes, size: int) -> str:
    parts = cut(body, size)
    inner = b"".join(zlib.crc32(part).to_bytes(4, "big") for part in parts)
    return base64.b64encode(zlib.crc32(inner).to_bytes(4, "big")).decode() + f"-{len(parts)}"


def sha256_composite(body: bytes, size: int) -> str:
    parts = cut(body, size)
    inner = b"".join(hashlib.sha256(part).digest() for part in parts)
    return base64.b64encode(hashlib.sha256(inner).digest()).decode() + f"-{len(parts)}"


def hashed(name: str, body: bytes, chunk: int) -> bytes:
    hasher = new_hasher(name)
    for at in range(0, len(body), chunk):
        hasher.update(body[at:at + chunk])
    return hasher.digest()


def test_claims_read_the_etag_and_a_composite_checksum() -> None:
    found = claims({"etag": etag(BODY, 5 * MIB), "x-amz-checksum-type": "COMPOSITE",
                    "x-amz-checksum-crc32": crc32_composite(BODY, 5 * MIB),
                    "x-amz-checksum-sha256": sha256_composite(BODY, 5 * MIB)})
    assert found is not None and found.count == 3
    assert sorted(found.digests) == ["crc32", "md5", "sha256"]
    assert found.digests["md5"].hex() == etag(BODY, 5 * MIB).strip('"')[:32]


@pytest.mark.parametrize("headers", [
    {"etag": '"' + "a" * 32 + '"'},  # one part: an MD5, checked as such elsewhere
    {"etag": 'W/"' + "a" * 32 + '-3"'},  # weak
    {"etag": '"' + "a" * 32 + '-1"'},  # one part: no layout to ask for
    {"etag": '"' + "a" * 32 + '-10001"'},  # more parts than S3 allows
    {"etag": '"' + "a" * 31 + '-3"'},
    {"etag": '"1700000000-5a3"'},  # nginx's mtime-size
    {},
])
def test_no_claims_without_an_etag_of_two_or_more_parts(headers: dict[str, str]) -> None:
    assert claims(headers) is None


def test_a_checksum_of_another_part_count_or_not_composite_is_not_claimed() -> None:
    tag = etag(BODY, 5 * MIB)
    crc = crc32_composite(BODY, 5 * MIB)
    assert sorted(claims({"etag": tag, "x-amz-checksum-crc32": crc}).digests) == \
        ["crc32", "md5"]  # "-3": composite by its form
    assert sorted(claims({"etag": tag, "x-amz-checksum-crc32": crc[:-1] + "4"}).digests) == \
        ["md5"]
    # moto's HEAD: the "-N" left off, the type given
    bare = crc.partition("-")[0]
    assert sorted(claims({"etag": tag, "x-amz-checksum-crc32": bare,
                          "x-amz-checksum-type": "COMPOSITE"}).digests) == ["crc32", "md5"]
    assert sorted(claims({"etag": tag, "x-amz-checksum-crc32": bare,
                          "x-amz-checksum-type": "FULL_OBJECT"}).digests) == ["md5"]
    assert sorted(claims({"etag": tag, "x-amz-checksum-crc32": "not base64!-3"}).digests) == \
        ["md5"]


def test_part_size_must_cut_the_object_into_its_count() -> None:
    total = len(BODY)
    head = {"content-length": str(5 * MIB), "x-amz-mp-parts-count": "3"}
    assert part_size(head, total, 3) == 5 * MIB
    assert part_size(head, total, 4) is None  # another count than the ETag's
    assert part_size({**head, "x-amz-mp-parts-count": "4"}, total, 4) is None  # 15 MiB < 4 parts
    assert part_size({**head, "content-length": str(4 * MIB)}, total, 3) is None  # 12 < total
    assert part_size({**head, "content-length": str(7 * MIB)}, total, 3) is None  # 14 >= total
    assert part_size({"content-length": str(5 * MIB)}, total, 3) is None  # not answered
    assert part_size({**head, "content-length": "0"}, total, 3) is None


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1001, 99_999])
@pytest.mark.parametrize("size", [1000, 4096, 6173])
def test_parts_digests_are_s3s_for_any_chunking(chunk: int, size: int) -> None:
    """(Parts far under S3's 5 MiB: the arithmetic is the same, and byte by byte is quick.)"""
    body = BODY[:12_345]
    assert hashed(f"md5-parts/{size}", body, chunk).hex() == etag(body, size).strip('"')[:32]
    assert base64.b64encode(hashed(f"crc32-parts/{size}", body, chunk)).decode() == \
        crc32_composite(body, size).partition("-")[0]
    assert base64.b64encode(hashed(f"sha256-parts/{size}", body, chunk)).decode() == \
        sha256_composite(body, size).partition("-")[0]


def test_a_body_of_whole_parts_has_no_empty_last_part() -> None:
    body = BODY[: 10 * MIB]
    assert hashed(f"md5-parts/{5 * MIB}", body, 1 << 20).hex() == \
        etag(body, 5 * MIB).strip('"')[:32]
    assert etag(body, 5 * MIB).endswith('-2"')


def test_names_carry_the_part_size() -> None:
    found = PartClaims(3, {"md5": b"m", "crc32": b"c"})
    assert found.named(5 * MIB) == {"md5-parts/5242880": b"m", "crc32-parts/5242880": b"c"}
    assert parse_name("md5-parts/5242880") == ("md5", 5 * MIB)
    for name in ("md5", "sha256", "md5-parts/", "md5-parts/0", "md5-parts/x"):
        assert parse_name(name) is None
    assert isinstance(new_hasher("crc32-parts/8"), PartsHasher)


def test_a_whole_body_checksum_is_preferred_then_the_cheaper_parts_one() -> None:
    parts = {"md5-parts/8": b"m", "crc32-parts/8": b"c"}
    assert strongest(parts)[0] == "crc32-parts/8"  # no second MD5 pass
    assert strongest({**parts, "crc32": b"w"})[0] == "crc32"
    assert strongest({"md5-parts/8": b"m"})[0] == "md5-parts/8"
    assert checked_way({"md5-parts/8": b"m"}) == BY_MD5  # the ETag
    assert checked_way(parts) == BY_DIGEST


def test_a_wrong_part_is_named_as_the_parts_check() -> None:
    size = 5 * MIB
    stated = PartClaims(3, {"md5": bytes.fromhex(etag(BODY, size).strip('"')[:32]),
                            "crc32": base64.b64decode(crc32_composite(BODY, size)[:-2])}
                        ).named(size)
    broken = bytearray(BODY)
    broken[6 * MIB] ^= 1
    for name, said in [(f"md5-parts/{size}", "MD5 of each part of the body does not match "
                        "the server's multipart ETag"),
                       (f"crc32-parts/{size}", "CRC32 of each part of the body does not "
                        "match the server's composite checksum")]:
        good, bad = new_hasher(name), new_hasher(name)
        good.update(BODY)
        bad.update(bytes(broken))
        assert mismatch(stated, hashlib.md5(), good, "the body") is None
        assert mismatch(stated, hashlib.md5(), bad, "the body") == said
