"""bulkfetch.s3.signer: the SigV4 headers of an object GET are the ones botocore computes
for the same request at the same second, and the reference server's check (written
separately) accepts them."""

from __future__ import annotations

import calendar
import time

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bulkfetch.s3.settings import S3Credentials, S3Settings
from bulkfetch.s3.signer import ObjectSigner, derive_key
from bulkfetch.server.sigv4 import ServerCredentials, verify

ACCESS, SECRET, TOKEN = "AKIDCLIENT", "s3cr3t/with:colons+plus", "FQoG+token/=="
KEYS = ["plain.bin", "with space.txt", "a+b=c.txt", "100%.txt", "~tilde~name~",
        "ünïcödé/日本語 ファイル.bin", "deep/a/b/c/d/e/f/g/h.bin", "a//double/slash",
        "punct;,!*'()$@&[]?#.txt"]
NOW = calendar.timegm((2026, 11, 24, 18, 30, 5, 0, 0, 0))


def headers_of(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return found


def botocore_authorization(url: str, host: str, when: float, token: str | None,
                           method: str = "GET") -> str:
    """What botocore signs for a METHOD of `url` with the same headers at `when`."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    headers = {"Host": host, "x-amz-checksum-mode": "ENABLED",
               "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD", "X-Amz-Date": stamp}
    if token:
        headers["X-Amz-Security-Token"] = token
    request = AWSRequest(method=method, url=url, headers=headers)
    request.context["timestamp"] = stamp
    auth = S3SigV4Auth(Credentials(ACCESS, SECRET, token), "s3", "eu-west-3")
    canonical = auth.canonical_request(request)
    return (f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, "
            f"SignedHeaders={auth.signed_headers(auth.headers_to_sign(request))}, "
            f"Signature={auth.signature(auth.string_to_sign(request, canonical), request)}")


def test_derived_key_is_awss_published_example() -> None:
    """AWS's "Examples of how to derive a signing key" (IAM, 2012-02-15)."""
    key = derive_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1",
                     "iam")
    assert key.hex() == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"


@pytest.mark.parametrize("token", [None, TOKEN])
@pytest.mark.parametrize("endpoint,addressing,prefix", [
    ("http://127.0.0.1:9000", "path", ""),
    ("http://127.0.0.1:9000", "path", "some prefix+/"),
    ("https://Store.Example.com:443/s3%2Fgate~way", "path", "p/"),
    ("http://[::1]:8333", "path", ""),
    ("https://s3.eu-west-3.amazonaws.com", "auto", "data/"),
])
def test_same_signature_as_botocore(endpoint: str, addressing: str, prefix: str,
                                    token: str | None) -> None:
    credentials = S3Credentials(ACCESS, SECRET, token)
    settings = S3Settings(endpoint, "eu-west-3", credentials, addressing)
    base = settings.object_url("my-bucket", prefix + "x")[:-1]
    signer = ObjectSigner(credentials, "eu-west-3", base, clock=lambda: NOW)
    server = ServerCredentials(ACCESS, SECRET, token)
    for key in KEYS:
        url = settings.object_url("my-bucket", prefix + key)
        sent = headers_of(signer.headers(url))
        assert sent["authorization"] == botocore_authorization(url, sent["host"], NOW, token)
        target = url.split("/", 3)[3]
        assert verify("GET", "/" + target, sent, server, now=NOW) is None
        wrong = ServerCredentials(ACCESS, SECRET + "x", token)
        assert verify("GET", "/" + target, sent, wrong, now=NOW) is not None


@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_head_with_a_query_is_signed_as_botocore_signs_it(token: str | None) -> None:
    """headers_for(): the layout probe, `HEAD key?partNumber=1` (engine/multipart.py)."""
    credentials = S3Credentials(ACCESS, SECRET, token)
    settings = S3Settings("http://127.0.0.1:9000", "eu-west-3", credentials, "path")
    signer = ObjectSigner(credentials, "eu-west-3", "http://127.0.0.1:9000/my-bucket/",
                          clock=lambda: NOW)
    server = ServerCredentials(ACCESS, SECRET, token)
    for key in KEYS:
        url = settings.object_url("my-bucket", key) + "?partNumber=1"
        sent = headers_of(signer.headers_for("HEAD", url))
        assert sent["authorization"] == botocore_authorization(url, sent["host"], NOW, token,
                                                                "HEAD")
        assert sent["authorization"] != headers_of(signer.headers(url))["authorization"]
        path, _, query = url.split("/", 3)[3].partition("?")  # (the target as sent)
        assert verify("HEAD", f"/{path}?{query}", sent, server, now=NOW) is None


def test_host_is_what_the_url_names_without_a_default_port() -> None:
    credentials = S3Credentials(ACCESS, SECRET)
    for base, host in [("http://h.example:80/b/", "h.example"),
                       ("https://H.Example:443/b/", "h.example"),
                       ("http://h.example:8080/b/", "h.example:8080"),
                       ("https://bucket.s3.amazonaws.com/", "bucket.s3.amazonaws.com")]:
        assert ObjectSigner(credentials, "us-east-1", base).host == host


def test_the_date_and_key_follow_the_clock() -> None:
    """A run across midnight signs with the new day's scope and key; a wrong-day signature
    is refused."""
    now = [NOW]
    credentials = S3Credentials(ACCESS, SECRET)
    signer = ObjectSigner(credentials, "eu-west-3", "http://127.0.0.1:9000/b/",
                          clock=lambda: now[0])
    url = "http://127.0.0.1:9000/b/k"
    first = headers_of(signer.headers(url))
    assert first["x-amz-date"] == "20261124T183005Z"
    midnight = calendar.timegm((2026, 11, 25, 0, 0, 1, 0, 0, 0))
    now[0] = midnight
    second = headers_of(signer.headers(url))
    assert second["x-amz-date"] == "20261125T000001Z"
    assert "/20261125/eu-west-3/s3/aws4_request" in second["authorization"]
    assert second["authorization"] == botocore_authorization(url, "127.0.0.1:9000",
                                                              midnight, None)
    server = ServerCredentials(ACCESS, SECRET)
    assert verify("GET", "/b/k", second, server, now=midnight) is None
    assert verify("GET", "/b/k", first, server, now=midnight) is not None  # 5.5 h skew


def test_no_secret_in_what_is_sent_or_shown() -> None:
    credentials = S3Credentials(ACCESS, SECRET, TOKEN)
    signer = ObjectSigner(credentials, "us-east-1", "http://127.0.0.1:9000/b/")
    lines = signer.headers("http://127.0.0.1:9000/b/k")
    assert not any(SECRET in line for line in lines)
    assert SECRET not in repr(signer) and TOKEN in "".join(lines)  # the token is sent
