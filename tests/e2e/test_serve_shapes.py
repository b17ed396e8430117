"""`bulkfetch serve --shape` seen from a plain HTTP client over loopback: every shape's pages
walked to the end with http.client, every name and every body's MD5 checked against the
synthetic data set, the fault switches on those pages and files, --require-bearer's 401s,
--lie-md5 and a second server that --redirect-files-to sends the file GETs to."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import urllib.parse
from collections.abc import Callable

import pytest

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.shapes import HF_REPO, LISTING_PATHS
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

SHAPES = ("gcs", "link", "drf", "hf-tree")
TOKEN = "e2e-T0ken.with~odd+chars/=="
LINK = re.compile(r'<([^>]*)>; rel="([a-z]+)"')


class Client:
    """One keep-alive connection; with `retry`, 5xx and dropped connections are tried again
    (the fault switches' answers), as any client of a flaky API must."""

    def __init__(self, url: str, headers: dict[str, str] | None = None,
                 retry: bool = False) -> None:
        parts = urllib.parse.urlsplit(url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        self.headers = headers or {}
        self.retry = retry

    def get(self, target: str, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for _ in range(100):
            try:
                self.conn.request(method, target, headers={**self.headers, **(headers or {})})
                response = self.conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()  # the next request connects again
                if not self.retry:
                    raise
                continue
            if self.retry and response.status in (429, 500, 503):
                continue
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body
        raise AssertionError(f"{target}: no answer in 100 attempts")

    def local(self, url: str) -> str:
        """An absolute URL of this server as a target: it must name this server."""
        parts = urllib.parse.urlsplit(url)
        assert f"{parts.scheme}://{parts.netloc}" == self.origin, url
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def walk(self, shape: str) -> tuple[list[dict], int]:
        """Every item of every page, following the shape's own pagination; and the pages."""
        target: str | None = LISTING_PATHS[shape]
        items: list[dict] = []
        pages = 0
        while target is not None:
            status, headers, body = self.get(target)
            assert status == 200, (target, body)
            assert headers["content-type"].startswith("application/json")
            page = json.loads(body)
            pages += 1
            if shape == "gcs":
                items += page.get("items", [])
                token = page.get("nextPageToken")
                target = None if token is None else \
                    f"{LISTING_PATHS[shape]}?pageToken={urllib.parse.quote(token)}"
            elif shape == "drf":
                items += page["results"]
                target = None if page["next"] is None else self.local(page["next"])
            else:
                items += page
                rels = {rel: url for url, rel in LINK.findall(headers.get("link", ""))}
                target = self.local(rels["next"]) if "next" in rels else None
            assert pages < 10_000
        return items, pages

    def download(self, shape: str, item: dict) -> str:
        if shape == "gcs":
            return self.local(item["mediaLink"])
        if shape == "link":
            return self.local(item["browser_download_url"])
        if shape == "drf":
            return self.local(item["url"])
        return f"/{HF_REPO}/resolve/main/{urllib.parse.quote(item['path'])}"


def stated(shape: str, item: dict) -> tuple[str, int, str]:
    """(name, size, hex digest) as the listing states them: MD5, or SHA-256 for hf-tree."""
    if shape == "gcs":
        return item["name"], int(item["size"]), base64.b64decode(item["md5Hash"]).hex()
    if shape == "hf-tree":
        assert item["type"] == "file" and item["lfs"]["size"] == item["size"]
        return item["path"], item["size"], item["lfs"]["oid"]
    if shape == "link":
        assert item["digest"].startswith("sha256:")
    return item["name"], item["size"], item["md5"]


def digest(shape: str, body: bytes) -> str:
    return (hashlib.sha256 if shape == "hf-tree" else hashlib.md5)(body).hexdigest()


def check_everything(server: ReferenceServer, shape: str, dataset: SyntheticDataSet,
                     client: Client) -> int:
    """Walk the listing, fetch every file; every name once, in order, every body right.
    Returns the number of pages."""
    items, pages = client.walk(shape)
    names = [dataset.name(i) for i in range(dataset.files)]
    assert [stated(shape, item)[0] for item in items] == names
    for index, item in enumerate(items):
        expected = dataset.body(index)
        name, size, said = stated(shape, item)
        assert (size, said) == (len(expected), digest(shape, expected)), name
        status, headers, body = client.get(client.download(shape, item))
        assert status == 200, (name, body)
        assert hashlib.md5(body).digest() == hashlib.md5(expected).digest(), name
        assert headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'
    return pages


def list_requests(server: ReferenceServer, shape: str) -> list[str]:
    path = LISTING_PATHS[shape].rstrip("/")
    return [r.target for r in server.requests() if r.target.split("?")[0].rstrip("/") == path]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_lists_every_name_once_and_serves_every_body(
        reference_server: Callable[..., ReferenceServer], shape: str) -> None:
    nested = shape in ("gcs", "hf-tree")  # names with '/': %2F in GCS object paths
    args = ["--files", "1100", "--page-size", "250", "--file-size", "uniform:0:5000",
            "--seed", "7", "--shape", shape, *(["--nested"] if nested else [])]
    server = reference_server(*args, access_log=True)
    assert f"{shape}: {server.url}{LISTING_PATHS[shape]}" in server.banner
    dataset = SyntheticDataSet(1100, 250, 7, parse_size_spec("uniform:0:5000"), nested)
    pages = check_everything(server, shape, dataset, Client(server.url))
    assert pages == 5
    assert len(list_requests(server, shape)) == 5  # the access log shows every page asked


@pytest.mark.parametrize("shape", SHAPES)
def test_fault_switches_hit_pages_and_files_and_a_retrying_client_gets_everything(
        reference_server: Callable[..., ReferenceServer], shape: str) -> None:
    server = reference_server("--files", "600", "--page-size", "50", "--shape", shape,
                              "--fail-rate", "0.1", "--reset-rate", "0.05", "--seed", "3",
                              access_log=True)
    dataset = SyntheticDataSet(600, 50, 3, parse_size_spec("100"))
    pages = check_everything(server, shape, dataset, Client(server.url, retry=True))
    assert pages == 12
    path = LISTING_PATHS[shape].rstrip("/")
    logged = server.requests()
    log = [r for r in logged if r.target.split("?")[0].rstrip("/") == path]
    faulted = [r for r in log if r.fault != "none"]
    assert faulted and {r.fault for r in faulted} <= {"fail", "reset"}
    # every list request is logged: the pages, and each retried after a fault
    assert len(log) == pages + len(faulted)
    files = [r for r in logged if r.target.split("?")[0].rstrip("/") != path]
    assert len(files) > 600 and {r.fault for r in files} == {"none", "fail", "reset"}


@pytest.mark.parametrize("shape", [*SHAPES, "seed"])
def test_without_the_bearer_token_every_request_is_401(
        reference_server: Callable[..., ReferenceServer], shape: str) -> None:
    server = reference_server("--files", "120", "--page-size", "50", "--shape", shape,
                              "--require-bearer", TOKEN, access_log=True)
    assert TOKEN not in server.banner and "bearer token required" in server.banner
    bare = Client(server.url)
    listing = LISTING_PATHS.get(shape, "/list")
    for target in (listing, "/get/f0000000007", "/list"):
        status, headers, body = bare.get(target)
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="bulkfetch"'
        assert "Bearer" in json.loads(body)["error"]
        status, headers, _ = bare.get(target, headers={"Authorization": "Bearer wrong"})
        assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
    authorized = Client(server.url, {"Authorization": f"Bearer {TOKEN}"})
    if shape == "seed":
        assert authorized.get("/list")[0] == 200
        assert authorized.get("/get/f0000000007")[0] == 200
    else:
        dataset = SyntheticDataSet(120, 50, 0, parse_size_spec("100"))
        assert check_everything(server, shape, dataset, authorized) == 3
    logged = server.requests()
    assert {r.status for r in logged if not r.auth} == {401}
    assert any(r.auth and r.status == 200 for r in logged)
    assert TOKEN not in server.log_path.read_text()  # type: ignore[union-attr]


def test_lie_md5_misstates_exactly_that_file_and_serves_it_as_it_is(
        reference_server: Callable[..., ReferenceServer]) -> None:
    liar = "f0000000042"
    server = reference_server("--files", "100", "--page-size", "30", "--shape", "drf",
                              "--lie-md5", liar)
    dataset = SyntheticDataSet(100, 30, 0, parse_size_spec("100"))
    client = Client(server.url)
    items, _ = client.walk("drf")
    wrong = [item["name"] for item, index in zip(items, range(100), strict=True)
             if item["md5"] != hashlib.md5(dataset.body(index)).hexdigest()]
    assert wrong == [liar]
    liar_item = next(item for item in items if item["name"] == liar)
    assert client.get(client.local(liar_item["url"]))[2] == dataset.body(42)


@pytest.mark.parametrize("shape", ["link", "hf-tree", "seed"])
def test_file_gets_redirect_to_a_second_server_that_needs_no_token(
        reference_server: Callable[..., ReferenceServer], shape: str) -> None:
    flags = ["--files", "80", "--page-size", "30", "--shape", shape]
    files = reference_server(*flags, access_log=True)
    listing = reference_server(*flags, "--require-bearer", TOKEN, "--redirect-files-to",
                               files.url, access_log=True)
    assert f"files redirected to {files.url}" in listing.banner
    client = Client(listing.url, {"Authorization": f"Bearer {TOKEN}"})
    other = Client(files.url)  # what a careful client does: no credentials to another host
    dataset = SyntheticDataSet(80, 30, 0, parse_size_spec("100"))
    if shape == "seed":
        targets = [f"/get/{dataset.name(i)}" for i in range(80)]
    else:
        items, pages = client.walk(shape)
        assert pages == 3 and len(items) == 80
        targets = [client.download(shape, item) for item in items]
    for index, target in enumerate(targets):
        assert Client(listing.url).get(target)[0] == 401
        status, headers, _ = client.get(target)
        assert status == 302 and headers["location"] == files.url + target
        status, _, body = other.get(other.local(headers["location"]))
        assert status == 200 and body == dataset.body(index)
    assert {r.status for r in listing.requests() if r.target in targets} <= {302, 401}
    served = files.requests()
    assert len(served) == 80 and not any(r.auth for r in served)
