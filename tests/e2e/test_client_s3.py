"""bulkfetch.Client with s3://BUCKET/KEY URLs (issue 24) against `bulkfetch serve --s3`
checking every SigV4 signature: bodies byte-exact, signed; plain http URLs of another
server mixed in get no signing header (its access log); a wrong secret is each URL's 403;
a URL naming no object fails alone; settings that cannot be found raise at once."""

from __future__ import annotations

import hashlib
import os

import pytest
from getkit import expected_files

from bulkfetch import Client, FetchError, UsageError
from bulkfetch.testing import ReferenceServer

KEY, SECRET = "AKIDCLIENTS3TEST", "s3cr3t/with+odd=chars"
FILES = 600


@pytest.fixture(scope="module")
def s3() -> ReferenceServer:
    with ReferenceServer("--s3", "--files", str(FILES), "--s3-credentials",
                         f"{KEY}:{SECRET}", access_log=True) as server:
        yield server


@pytest.fixture(scope="module")
def plain() -> ReferenceServer:
    with ReferenceServer("--files", str(FILES), access_log=True) as server:
        yield server


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return monkeypatch


def test_signed_s3_urls_and_plain_urls_share_a_client(s3, plain, aws) -> None:  # type: ignore[no-untyped-def]
    want = expected_files(FILES)
    names = sorted(want)
    urls = [u for name in names for u in (f"s3://bulkfetch/{name}", f"{plain.url}/get/{name}")]
    with Client(endpoint_url=s3.url, region="eu-west-3") as client:
        got = list(client.get_many(urls, ordered=True))
    assert [url for url, _ in got] == urls
    for url, body in got:
        assert hashlib.md5(body).hexdigest() == want[url.rsplit("/", 1)[1]]  # type: ignore[arg-type]
    signed = [r for r in s3.requests() if r.target.startswith("/bulkfetch/f")]
    assert len(signed) >= FILES and all(r.auth and r.status == 200 for r in signed)
    gets = [r for r in plain.requests() if r.target.startswith("/get/")]
    assert len(gets) >= FILES and not any(r.auth for r in gets)  # no S3 header leaked


def test_a_wrong_secret_is_each_urls_403(s3, aws) -> None:  # type: ignore[no-untyped-def]
    aws.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with Client(endpoint_url=s3.url, retries=1) as client:
        got = list(client.get_many([f"s3://bulkfetch/{name}" for name in
                                    sorted(expected_files(FILES))[:5]], errors="return"))
    assert len(got) == 5
    assert all(isinstance(error, FetchError) and "HTTP 403" in error.reason
               for _, error in got)


def test_an_s3_url_naming_no_object_fails_alone(s3, aws) -> None:  # type: ignore[no-untyped-def]
    first = sorted(expected_files(FILES))[0]
    with Client(endpoint_url=s3.url) as client:
        got = dict(client.get_many([f"s3://bulkfetch/{first}", "s3://bulkfetch/",
                                    "s3://bulkfetch/dir/"], errors="return"))
    assert isinstance(got[f"s3://bulkfetch/{first}"], bytes)
    for url in ("s3://bulkfetch/", "s3://bulkfetch/dir/"):
        assert isinstance(got[url], FetchError) and "names no object" in got[url].reason


def test_settings_that_cannot_be_found_raise_at_once(aws, tmp_path) -> None:  # type: ignore[no-untyped-def]
    aws.setenv("AWS_PROFILE", "nowhere")
    with Client() as client, pytest.raises(UsageError, match="nowhere"):
        client.get("s3://bulkfetch/f0000000000")
