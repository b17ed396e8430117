"""s3kit's servers hold what its helpers put there, under the right names, as independent
clients (boto3's own calls, s5cmd) see it; SeaweedFS checks libcurl's SigV4 signatures."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import subprocess
import urllib.request
import zlib
from pathlib import Path
from urllib.parse import quote

import pycurl
import pytest
import s3kit
from s3kit import moto, put_multipart, put_objects, s3_client, seaweed  # noqa: F401

SHAPES = ["a b", "a+b", "a=b", "100%", "50%25", "til~de", "ünïcødé", "日本語", "😀",
          "a b+c=d%e~ü", "semi;colon", "comma,", "paren(1)", "quote'", "at@", "dollar$",
          "amp&", "hash#", "bang!", " lead", "trail "]
MULTIPART_KEY = "multi part/big+object=ü.bin"
MIB = 1 << 20


def awkward_objects(count: int = 200) -> dict[str, bytes]:
    """COUNT keys with spaces, +, =, %, ~, unicode and deep prefixes; one empty body."""
    objects = {}
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        depth = i % 7
        prefix = "".join(f"d{level} {shape}/" for level in range(depth))
        key = f"{prefix}{i:03d} {shape}.txt"
        size = (i * 37) % 3000
        seed = hashlib.sha256(key.encode()).digest()
        objects[key] = (seed * (size // 32 + 1))[:size]
    assert len(objects) == count and objects[next(iter(objects))] == b""
    return objects


def multipart_body() -> bytes:
    return hashlib.sha256(b"multipart").digest() * (5 * MIB // 32) + b"tail of the object"


def crc32_composite(data: bytes, part: int) -> str:
    parts = [zlib.crc32(data[i:i + part]).to_bytes(4, "big") for i in range(0, len(data), part)]
    return base64.b64encode(zlib.crc32(b"".join(parts)).to_bytes(4, "big")).decode() + \
        f"-{len(parts)}"


@pytest.fixture(scope="module", params=["moto", "seaweed"])
def filled(request: pytest.FixtureRequest) -> tuple[s3kit.S3Server, dict[str, bytes]]:
    """A server with bucket "kit": 200 awkward objects (put_objects) and one multipart
    object of two parts with a CRC32 checksum (put_multipart)."""
    server = request.getfixturevalue(request.param)
    client = s3_client(server)
    objects = awkward_objects()
    etags = put_objects(client, "kit", objects)
    assert etags == {key: hashlib.md5(body).hexdigest() for key, body in objects.items()}
    body = multipart_body()
    done = put_multipart(client, "kit", MULTIPART_KEY, body, 5 * MIB, "CRC32")
    assert done["ETag"].strip('"').endswith("-2")
    return server, {**objects, MULTIPART_KEY: body}


def test_boto3_lists_and_reads_every_object(filled):
    server, objects = filled
    client = s3_client(server)
    listed = {}
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket="kit", PaginationConfig={"PageSize": 50}):
        for item in page.get("Contents", []):
            assert item["Key"] not in listed
            listed[item["Key"]] = item["Size"]
    assert listed == {key: len(body) for key, body in objects.items()}
    for key, body in objects.items():
        assert client.get_object(Bucket="kit", Key=key)["Body"].read() == body, key


def test_multipart_object_carries_its_composite_crc32(filled):
    server, objects = filled
    client = s3_client(server)
    answer = client.get_object(Bucket="kit", Key=MULTIPART_KEY, ChecksumMode="ENABLED")
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    assert answer["Body"].read() == objects[MULTIPART_KEY]
    assert headers["x-amz-checksum-crc32"] == crc32_composite(objects[MULTIPART_KEY], 5 * MIB)
    assert headers["x-amz-checksum-type"] == "COMPOSITE"


def s5cmd(server: s3kit.S3Server, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([s3kit.s5cmd_binary(), "--endpoint-url", server.endpoint, *args],
                          env=server.env(), capture_output=True, timeout=120, check=False)


def test_s5cmd_lists_and_reads_every_object(filled):
    server, objects = filled
    run = s5cmd(server, "--json", "ls", "s3://kit/*")
    assert run.returncode == 0, run.stderr
    listed = {}
    for line in run.stdout.decode().splitlines():
        item = json.loads(line)
        listed[item["key"].removeprefix("s3://kit/")] = item.get("size", 0)  # 0: omitted
    assert listed == {key: len(body) for key, body in objects.items()}
    for key, body in objects.items():
        run = s5cmd(server, "cat", f"s3://kit/{key}")
        assert run.returncode == 0, (key, run.stderr)
        assert run.stdout == body, key


def signed_get(server: s3kit.S3Server, path: str,
               userpwd: str | None) -> tuple[int, bytes]:
    """GET endpoint + PATH with libcurl's SigV4 (no signature when USERPWD is None)."""
    handle = pycurl.Curl()
    body = io.BytesIO()
    try:
        handle.setopt(pycurl.URL, server.endpoint + path)
        handle.setopt(pycurl.WRITEDATA, body)
        handle.setopt(pycurl.HTTPHEADER, ["x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        if userpwd is not None:
            handle.setopt(pycurl.AWS_SIGV4, f"aws:amz:{server.region}:s3")
            handle.setopt(pycurl.USERPWD, userpwd)
        handle.perform()
        return handle.getinfo(pycurl.RESPONSE_CODE), body.getvalue()
    finally:
        handle.close()


def error_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]*)</Code>", body)
    return found.group(1).decode() if found else ""


SIGNING_KEYS = ["a b.txt", "a+b.txt", "a=b.txt", "100%.txt", "til~de.txt", "ünï/日本.txt",
                "a b+c=d%e~ü.txt", "semi;colon,comma!'()*@$&.txt", "deep/a/b/c/d/e.txt"]


def test_seaweedfs_checks_libcurl_signatures_for_awkward_keys(seaweed):
    put_objects(s3_client(seaweed), "signing", {key: key.encode() for key in SIGNING_KEYS})
    good = f"{seaweed.access_key}:{seaweed.secret_key}"
    wrong = f"{seaweed.access_key}:not-the-secret"
    for key in SIGNING_KEYS:
        path = "/signing/" + quote(key, safe="/~")  # percent-encoded exactly once
        assert signed_get(seaweed, path, good) == (200, key.encode()), key
        status, body = signed_get(seaweed, path, wrong)
        assert (status, error_code(body)) == (403, "SignatureDoesNotMatch"), key
        status, body = signed_get(seaweed, path, None)
        assert (status, error_code(body)) == (403, "AccessDenied"), key
        listing = f"/signing?list-type=2&prefix={quote(key, safe='~')}"
        status, body = signed_get(seaweed, listing, good)
        assert status == 200 and b"<KeyCount>1</KeyCount>" in body, key


def test_moto_checks_no_signature_by_default(moto):
    put_objects(s3_client(moto), "nosig", {"a b+c.txt": b"x"})
    assert signed_get(moto, "/nosig/a%20b%2Bc.txt", f"{moto.access_key}:wrong") == (200, b"x")


def test_moto_with_auth_checks_signatures(tmp_path: Path):
    with s3kit.moto_server(tmp_path, auth=True) as server:
        put_objects(s3_client(server), "auth", {"plain.txt": b"x"})
        good = f"{server.access_key}:{server.secret_key}"
        assert signed_get(server, "/auth/plain.txt", good) == (200, b"x")
        status, body = signed_get(server, "/auth/plain.txt", f"{server.access_key}:wrong")
        assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")
    with pytest.raises(OSError):
        urllib.request.urlopen(server.endpoint + "/", timeout=2)  # stopped
