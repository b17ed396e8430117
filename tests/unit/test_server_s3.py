"""The reference server's S3 face (server/s3list.py, server/s3app.py), without sockets: the
answers S3 documents, read as botocore reads them (keys in UTF-8 byte order, ListObjectsV2
and V1 paging, common prefixes, encoding-type=url, S3 XML errors, faults and SigV4)."""

from __future__ import annotations

import base64
import functools
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote, unquote_plus, urlencode, urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.handlers import decode_list_object_v2
from botocore.parsers import create_parser
from botocore.session import get_session

from bulkfetch.errors import UsageError
from bulkfetch.server import s3list
from bulkfetch.server.app import App, Response
from bulkfetch.server.dataset import DataSet, SyntheticDataSet
from bulkfetch.server.faults import FaultConfig
from bulkfetch.server.hostile import HostileNames
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.server.s3app import S3App
from bulkfetch.server.s3list import NAMESPACE, BadListRequest, ListRequest
from bulkfetch.server.tree import FileTree
from bulkfetch.util.sizes import parse_size_spec

NS = {"s": NAMESPACE}
BUCKET = "bkt"
TREE_NAMES = ["a b.txt", "a+b.txt", "a&b<c>.txt", "a-b", "a/1", "a/2", "b", "c/1", "d",
              "z", "é", "\uff21", "\U0001f600", "ü/ñ dir/x+y", "日本/語 ファイル", "sp ace/in+ner"]


def utf8_sorted(names: list[str]) -> list[str]:
    return sorted(names, key=lambda name: name.encode("utf-8", "surrogatepass"))


def synthetic(files: int = 60, nested: bool = False, sizes: str = "100") -> SyntheticDataSet:
    return SyntheticDataSet(files, 10, 0, parse_size_spec(sizes), nested=nested)


def make_tree(root: Path) -> FileTree:
    for number, name in enumerate(TREE_NAMES):
        path = root.joinpath(*name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"body {number} of {name}".encode() * (number + 1))
    return FileTree(str(root), 4)


def all_names(dataset: DataSet) -> list[str]:
    names, cursor = [], None
    while True:
        page, cursor = dataset.page(cursor)
        names += page
        if cursor is None:
            return names


def s3(dataset: DataSet) -> S3App:
    return S3App(App(dataset), BUCKET)


def ask(app: S3App, target: str, method: str = "GET", **headers: str) -> Response:
    return app.handle(method, target, headers)


def xml(response: Response) -> ET.Element:
    assert ("Content-Type", "application/xml") in response.headers
    return ET.fromstring(response.body)


def header(response: Response, name: str) -> str | None:
    return dict(response.headers).get(name)


def error(response: Response) -> tuple[int, str]:
    root = xml(response)
    assert root.tag == "Error" and root.findtext("RequestId")
    return response.status, root.findtext("Code", "")


def list_target(**params: str) -> str:
    """How botocore sends a query: every byte but A-Z a-z 0-9 -_.~ percent-encoded."""
    params = {name.replace("_", "-"): value for name, value in params.items()}
    return f"/{BUCKET}?" + urlencode(params, quote_via=quote, safe="-_.~")


def listing(app: S3App, **params: str) -> ET.Element:
    response = ask(app, list_target(**params))
    assert response.status == 200, response.body
    return xml(response)


def text(root: ET.Element, tag: str) -> str | None:
    return root.findtext(f"s:{tag}", namespaces=NS)


def entries(root: ET.Element, url: bool = False) -> tuple[list[str], list[str]]:
    decode = unquote_plus if url else str
    keys = [decode(e.text or "") for e in root.findall("s:Contents/s:Key", NS)]
    prefixes = [decode(e.text or "") for e in root.findall("s:CommonPrefixes/s:Prefix", NS)]
    return keys, prefixes


def model(names: list[str], prefix: str = "", delimiter: str = "") -> list[str]:
    """Every key and common prefix S3 lists, in order (common prefixes end with delimiter)."""
    out: list[str] = []
    for key in utf8_sorted(list(set(names))):
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        item = key if cut < 0 else key[: cut + len(delimiter)]
        if not out or out[-1] != item:
            out.append(item)
    return out


def walk_v2(app: S3App, max_keys: int, **params: str) -> list[str]:
    seen: list[str] = []
    token = None
    for _ in range(500):
        query = dict(params, list_type="2", max_keys=str(max_keys))
        if token is not None:
            query["continuation_token"] = token
        root = listing(app, **query)
        keys, prefixes = entries(root)
        assert int(text(root, "KeyCount") or -1) == len(keys) + len(prefixes) <= max_keys
        assert text(root, "MaxKeys") == str(max_keys)
        assert text(root, "ContinuationToken") == token
        seen += utf8_sorted(keys + prefixes)  # one page: keys and prefixes interleaved
        token = text(root, "NextContinuationToken")
        assert text(root, "IsTruncated") == ("true" if token else "false")
        if token is None:
            return seen
    raise AssertionError("the listing never ended")


# -- s3list ------------------------------------------------------------------------------
def test_from_query_defaults_and_versions() -> None:
    assert ListRequest.from_query({}) == ListRequest(version=1)
    v2 = ListRequest.from_query({"list-type": "2", "marker": "m", "start-after": "s",
                                 "continuation-token": "t", "encoding-type": "url",
                                 "max-keys": "5000", "prefix": "p", "delimiter": "/"})
    assert v2 == ListRequest(2, "p", "/", "s", "t", 1000, True)
    v1 = ListRequest.from_query({"marker": "m", "start-after": "s", "continuation-token": "t"})
    assert (v1.version, v1.after, v1.token, v1.max_keys) == (1, "m", None, 1000)


@pytest.mark.parametrize("query", [{"max_keys": v} for v in ("", "-1", "x", "1.5", "1e3", "٣")]
                         + [{"encoding_type": "base64"}])
def test_bad_list_parameters_are_invalid_argument(query: dict[str, str]) -> None:
    with pytest.raises(BadListRequest):
        ListRequest.from_query({k.replace("_", "-"): v for k, v in query.items()})
    response = ask(s3(synthetic()), list_target(list_type="2", **query))
    assert error(response) == (400, "InvalidArgument")


@pytest.mark.parametrize("marker", ["", "f0000000001", "ü/日本 +x&<", "a/", "\U0001f600"])
def test_tokens_round_trip(marker: str) -> None:
    token = s3list.encode_token(marker)
    assert token.isascii() and s3list.decode_token(token) == marker


@pytest.mark.parametrize("token", ["", "nope", "bf1:abc", "bf1:" + base64.urlsafe_b64encode(
    b"\xff\xfe").decode(), "bf1:!!!!", "bf1:ZjAw!!"])
def test_forged_tokens_are_refused(token: str) -> None:
    with pytest.raises(BadListRequest):
        s3list.decode_token(token)
    response = ask(s3(synthetic()), list_target(list_type="2", continuation_token=token))
    assert error(response) == (400, "InvalidArgument")


def test_sorted_keys_are_in_utf8_byte_order(tmp_path: Path) -> None:
    keys, _ = s3list.sorted_keys(make_tree(tmp_path))
    assert list(keys) == utf8_sorted(TREE_NAMES)
    assert list(keys).index("\uff21") < list(keys).index("\U0001f600")  # not UTF-16 order
    flat = synthetic(25)
    assert list(s3list.sorted_keys(flat)[0]) == [flat.name(i) for i in range(25)]


def test_list_keys_and_render_list_directly() -> None:
    keys = ["a/1", "a/2", "b", "c/1", "d"]
    request = ListRequest(2, delimiter="/", max_keys=2)
    listed = s3list.list_keys(keys, request)
    assert (list(listed.keys), listed.prefixes, listed.truncated) == (["b"], ["a/"], True)
    body = s3list.render_list("x", request, listed, lambda listed, url: "")
    root = ET.fromstring(body)
    assert text(root, "Name") == "x" and text(root, "KeyCount") == "2"
    assert s3list.decode_token(text(root, "NextContinuationToken") or "") == "b"


# -- ListObjectsV2 -----------------------------------------------------------------------
DATASETS = ["flat", "nested", "tree"]


@pytest.fixture(params=DATASETS)
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> DataSet:
    if request.param == "tree":
        return make_tree(tmp_path)
    if request.param == "large":  # bodies past one 64 KiB chunk
        return synthetic(4, sizes="uniform:60k:140k")
    return synthetic(nested=request.param == "nested")


@pytest.mark.parametrize("max_keys", [1, 7, 1000])
@pytest.mark.parametrize("shape", ["flat", "delimiter", "prefix+delimiter"])
def test_continuation_covers_every_key_once(dataset: DataSet, max_keys: int,
                                            shape: str) -> None:
    names = all_names(dataset)
    middle = utf8_sorted(names)[len(names) // 2]
    prefix = middle[: len(middle) // 2] if shape == "prefix+delimiter" else ""
    delimiter = "" if shape == "flat" else "/"
    app = s3(dataset)
    found = walk_v2(app, max_keys, prefix=prefix, delimiter=delimiter)
    assert found == model(names, prefix, delimiter)
    assert len(found) == len(set(found))


def test_common_prefixes_count_toward_max_keys_and_are_not_repeated(tmp_path: Path) -> None:
    app = s3(make_tree(tmp_path))
    root = listing(app, list_type="2", delimiter="/", prefix="a", max_keys="3")
    assert entries(root) == (["a b.txt", "a&b<c>.txt", "a+b.txt"], [])
    root = listing(app, list_type="2", delimiter="/", prefix="a", start_after="a-b")
    assert entries(root) == ([], ["a/"])  # a start before the common prefix lists it
    for params in ({"start_after": "a/"}, {"continuation_token": s3list.encode_token("a/")}):
        root = listing(app, list_type="2", delimiter="/", prefix="a", **params)
        assert entries(root) == ([], []) and text(root, "IsTruncated") == "false"
    root = listing(app, list_type="2", delimiter="/", start_after="a-b", max_keys="2")
    assert entries(root) == (["b"], ["a/"]) and text(root, "KeyCount") == "2"
    assert s3list.decode_token(text(root, "NextContinuationToken") or "") == "b"
    root = listing(app, delimiter="/", marker="a-b", max_keys="1")  # V1: NextMarker too
    assert entries(root) == ([], ["a/"]) and text(root, "NextMarker") == "a/"
    assert entries(listing(app, delimiter="/", marker="a/", max_keys="1")) == (["b"], [])


def test_start_after(dataset: DataSet) -> None:
    names = model(all_names(dataset))
    app = s3(dataset)
    for after in (names[0], names[len(names) // 2], names[-1], names[3][:-1], "\U0010ffff"):
        root = listing(app, list_type="2", start_after=after)
        assert entries(root)[0] == [n for n in names if n.encode() > after.encode()]
        assert text(root, "StartAfter") == after


def test_max_keys_zero_and_cap() -> None:
    app = s3(synthetic(1500))
    root = listing(app, list_type="2", max_keys="0")
    assert entries(root) == ([], []) and text(root, "KeyCount") == "0"
    assert (text(root, "IsTruncated"), text(root, "NextContinuationToken")) == ("false", None)
    root = listing(app, list_type="2", max_keys="5000")
    assert (text(root, "MaxKeys"), text(root, "KeyCount")) == ("1000", "1000")
    assert text(root, "IsTruncated") == "true"
    rest = listing(app, list_type="2", continuation_token=text(root, "NextContinuationToken"))
    assert len(entries(rest)[0]) == 500 and text(rest, "IsTruncated") == "false"


@functools.cache
def botocore_list_v2_shape():  # type: ignore[no-untyped-def]
    return get_session().get_service_model("s3").operation_model("ListObjectsV2").output_shape


def test_encoding_type_url_as_s3_and_botocore_read_it(tmp_path: Path) -> None:
    app = s3(make_tree(tmp_path))
    raw = ask(app, list_target(list_type="2", encoding_type="url", start_after=" ")).body
    root = ET.fromstring(raw)
    keys = [e.text for e in root.findall("s:Contents/s:Key", NS)]
    assert {"a+b.txt", "a%2Bb.txt", "a%26b%3Cc%3E.txt", "%C3%BC/%C3%B1+dir/x%2By"} <= set(keys)
    assert text(root, "EncodingType") == "url" and text(root, "StartAfter") == "+"
    parsed = create_parser("rest-xml").parse(
        {"status_code": 200, "headers": {}, "body": raw}, botocore_list_v2_shape())
    decode_list_object_v2(parsed, {"encoding_type_auto_set": True})
    assert [c["Key"] for c in parsed["Contents"]] == utf8_sorted(TREE_NAMES)
    assert parsed["StartAfter"] == " " and parsed["KeyCount"] == len(TREE_NAMES)
    plain = ask(app, list_target(list_type="2", prefix="a&b<")).body
    assert b"<Key>a&amp;b&lt;c&gt;.txt</Key>" in plain and b"EncodingType" not in plain
    assert entries(ET.fromstring(plain)) == (["a&b<c>.txt"], [])
    root = listing(app, list_type="2", encoding_type="url", prefix="ü/", delimiter="/")
    assert entries(root, url=True) == ([], ["ü/ñ dir/"])
    assert (text(root, "Prefix"), text(root, "Delimiter")) == ("%C3%BC/", "/")


def test_hostile_names_list_with_encoding_type_url() -> None:
    dataset = HostileNames(synthetic(5))
    root = listing(s3(dataset), list_type="2", encoding_type="url")
    keys = [unquote_plus(e.text or "", errors="surrogatepass")
            for e in root.findall("s:Contents/s:Key", NS)]
    assert keys == utf8_sorted(list(set(all_names(dataset)) - {""}))


@pytest.mark.parametrize("dataset", [*DATASETS, "large"], indirect=True)
def test_listing_etag_and_size_match_get(dataset: DataSet) -> None:
    app = s3(dataset)
    contents = listing(app, list_type="2").findall("s:Contents", NS)
    assert contents
    for item in contents:
        got = ask(app, f"/{BUCKET}/{quote(item.findtext('s:Key', '', NS), safe='/~')}")
        assert got.status == 200
        assert header(got, "ETag") == item.findtext("s:ETag", namespaces=NS)
        size = len(got.body or b"".join(got.chunks or []))
        assert size == int(item.findtext("s:Size", "-1", NS))
        assert item.findtext("s:LastModified", namespaces=NS) == "2025-01-01T00:00:00.000Z" \
            or isinstance(dataset, FileTree)


# -- ListObjects V1 ----------------------------------------------------------------------
@pytest.mark.parametrize(("nested", "delimiter"), [(False, ""), (True, ""), (True, "/")])
def test_v1_marker_paging(nested: bool, delimiter: str) -> None:
    dataset = synthetic(nested=nested)
    app = s3(dataset)
    seen, marker = [], ""
    while True:
        root = listing(app, marker=marker, max_keys="7", delimiter=delimiter)
        assert text(root, "Marker") == marker and text(root, "KeyCount") is None
        keys, prefixes = entries(root)
        seen += utf8_sorted(keys + prefixes)
        if text(root, "IsTruncated") == "false":
            assert text(root, "NextMarker") is None
            break
        next_marker = text(root, "NextMarker")
        assert (next_marker is not None) == bool(delimiter)
        marker = next_marker or keys[-1]
    assert seen == model(all_names(dataset), "", delimiter)


# -- objects, buckets, methods -----------------------------------------------------------
def test_get_head_and_range(tmp_path: Path) -> None:
    app = s3(make_tree(tmp_path))
    body = (tmp_path / "ü" / "ñ dir" / "x+y").read_bytes()
    target = f"/{BUCKET}/" + quote("ü/ñ dir/x+y", safe="/~")
    got = ask(app, target)
    assert (got.status, got.body) == (200, body)
    head = ask(app, target, "HEAD")
    assert (head.status, head.body, head.content_length) == (200, b"", len(body))
    assert header(head, "ETag") == header(got, "ETag")
    part = ask(app, target, range="bytes=2-5")
    assert (part.status, part.body) == (206, body[2:6])
    assert header(part, "Content-Range") == f"bytes 2-5/{len(body)}"


def test_missing_key_and_bucket() -> None:
    app = s3(synthetic())
    missing = ask(app, f"/{BUCKET}/no%20such%2Bkey")
    assert error(missing) == (404, "NoSuchKey")
    assert xml(missing).findtext("Key") == "no such+key"
    for target in ("/other/f0000000001", "/other", "/other?list-type=2"):
        response = ask(app, target)
        assert error(response) == (404, "NoSuchBucket")
        assert xml(response).findtext("BucketName") == "other"


def test_bucket_requests_and_seed_api() -> None:
    dataset = synthetic(3)
    app = s3(dataset)
    head = ask(app, f"/{BUCKET}", "HEAD")
    assert (head.status, head.body) == (200, b"")
    buckets = xml(ask(app, "/"))
    assert buckets.tag == f"{{{NAMESPACE}}}ListAllMyBucketsResult"
    assert [e.text for e in buckets.findall("s:Buckets/s:Bucket/s:Name", NS)] == [BUCKET]
    location = xml(ask(app, f"/{BUCKET}?location"))
    assert location.tag == f"{{{NAMESPACE}}}LocationConstraint"
    v1 = xml(ask(app, f"/{BUCKET}"))
    assert entries(v1)[0] == ["f0000000000", "f0000000001", "f0000000002"]
    assert text(v1, "Marker") == "" and text(v1, "Name") == BUCKET
    page = ask(app, "/list")  # the seed API, answered beside the bucket
    assert page.status == 200 and b'"FileNames":["f0000000000"' in page.body
    assert ask(app, "/get/f0000000002").body == dataset.body(2)


@pytest.mark.parametrize("method", ["PUT", "POST", "DELETE", "PATCH"])
@pytest.mark.parametrize("target", [f"/{BUCKET}", f"/{BUCKET}/f0000000001", "/"])
def test_other_methods_are_not_allowed(method: str, target: str) -> None:
    response = ask(s3(synthetic()), target, method)
    assert error(response) == (405, "MethodNotAllowed")
    assert header(response, "Allow") == "GET, HEAD"


# -- faults and latency, built as `serve` builds them --------------------------------------
def built(**options: object) -> S3App:
    app = build_app(ServeOptions(files=40, page_size=10, s3_bucket=BUCKET, **options))
    assert isinstance(app, S3App)
    return app


def test_failures_are_s3_errors() -> None:
    app = built(faults=FaultConfig(fail_rate=1.0))
    statuses = set()
    for i in range(30):
        response = ask(app, f"/{BUCKET}/f{i:010d}")
        status, code = error(response)
        statuses.add(status)
        assert code == {500: "InternalError", 503: "SlowDown"}[status]
        assert (header(response, "Retry-After") is not None) == (status == 503)
    assert statuses == {500, 503}
    status, code = error(ask(app, list_target(list_type="2")))
    assert code == {500: "InternalError", 503: "SlowDown"}[status]


def test_denied_names_are_s3_errors() -> None:
    app = built(faults=FaultConfig(deny_rate=1.0))
    codes = {400: "InvalidRequest", 401: "AccessDenied", 403: "AccessDenied",
             404: "NoSuchKey", 410: "NoSuchKey"}
    for i in range(10):
        status, code = error(ask(app, f"/{BUCKET}/f{i:010d}"))
        assert code == codes[status]
    assert ask(app, list_target(list_type="2")).status == 200  # names, not listings


def test_list_latency_delays_list_pages_only() -> None:
    app = built(list_latency_ms=(20.0, 20.0))
    assert ask(app, list_target(list_type="2")).delay_s == pytest.approx(0.02)
    assert ask(app, f"/{BUCKET}").delay_s == pytest.approx(0.02)
    assert ask(app, f"/{BUCKET}/f0000000001").delay_s == 0.0
    assert ask(app, f"/{BUCKET}", "HEAD").delay_s == 0.0


# -- SigV4 -------------------------------------------------------------------------------
def signed(method: str, target: str, secret: str = "SECRET") -> tuple[str, str, dict[str, str]]:
    request = AWSRequest(method=method, url=f"http://127.0.0.1:9000{target}")
    S3SigV4Auth(Credentials("KEY", secret), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    headers = {name.lower(): str(value).strip() for name, value in prepared.headers.items()}
    headers.setdefault("host", parts.netloc)
    return prepared.method, parts.path + (f"?{parts.query}" if parts.query else ""), headers


@pytest.mark.parametrize("target", [f"/{BUCKET}/f0000000001", f"/{BUCKET}?list-type=2&"
                                    "prefix=f%2000&max-keys=3", "/"])
def test_signatures(target: str) -> None:
    app = built(s3_credentials="KEY:SECRET")
    assert error(ask(app, target)) == (403, "AccessDenied")
    assert app.handle(*signed("GET", target)).status == 200
    assert app.handle(*signed("HEAD", target)).status == 200
    assert error(app.handle(*signed("GET", target, "WRONG"))) == (403, "SignatureDoesNotMatch")


# -- ServeOptions ------------------------------------------------------------------------
@pytest.mark.parametrize("options", [
    *({"s3_bucket": name} for name in ("ab", "a" * 64, "Upper", "-abc", "abc-", "bad_name",
                                       "ünï", "a b", "list", "get")),
    {"s3_credentials": "KEY:SECRET"},
    {"s3_bucket": BUCKET, "s3_credentials": "no-colon"},
    {"s3_bucket": BUCKET, "huge_page": 5},
    {"s3_bucket": BUCKET, "bad_pages": frozenset({"empty"})},
])
def test_serve_options_refusals(options: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        ServeOptions(**options)  # type: ignore[arg-type]


def test_serve_options_good_buckets() -> None:
    for name in ("abc", "my.bucket-1", "a" * 63, "0lists"):
        assert isinstance(build_app(ServeOptions(files=1, s3_bucket=name)), S3App)
