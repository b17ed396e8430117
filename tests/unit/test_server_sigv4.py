"""bulkfetch.server.sigv4: the reference server's SigV4 check accepts what botocore and
libcurl sign (and AWS's published examples), and refuses everything else with S3's codes."""

from __future__ import annotations

import calendar
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, urlsplit

import pycurl
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.utils import percent_encode_sequence

from bulkfetch.errors import UsageError
from bulkfetch.server import sigv4
from bulkfetch.server.sigv4 import Refusal, ServerCredentials, parse_credentials, verify

CREDS = ServerCredentials("AKIDSERVER", "s3cr3t/with:colons+plus")
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
ENDPOINT = "http://127.0.0.1:9000"

Request = tuple[str, str, dict[str, str]]  # method, target, lower-case headers

KEYS = [
    "plain.bin",
    "with space.txt",
    "a+b=c.txt",
    "100%.txt",
    "~tilde~name~",
    "ünïcödé/日本語 ファイル.bin",
    "deep/a/b/c/d/e/f/g/h.bin",
    "mixed dir+/x=y%z~/ü  two  spaces",
    "a//double/slash",
    "punct;,!*'()$@&[].txt",
]


# -- turning a botocore request into what an HTTP server receives -------------------------
def received(request: AWSRequest) -> Request:
    """(method, request-target, headers) as the server's HTTP layer hands them over: the
    target as it is on the request line, header names lower-cased, values as sent (latin-1
    decoded, trimmed) and the Host header the HTTP client adds."""
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {name.lower(): str(value).strip() for name, value in prepared.headers.items()}
    headers.setdefault("host", parts.netloc)
    assert target.isascii()  # botocore sends the path and query percent-encoded
    return prepared.method, target, headers


def object_url(key: str, endpoint: str = ENDPOINT, bucket: str | None = "bucket") -> str:
    """How botocore puts a key in a URL (its serializer: percent_encode(key, safe='/~'))."""
    base = f"{endpoint}/{bucket}/" if bucket else f"{endpoint}/"
    return base + quote(key.encode("utf-8"), safe="/~")


def signed(method: str, url: str, headers: dict[str, str] | None = None,
           access_key: str = CREDS.access_key, secret_key: str = CREDS.secret_key,
           region: str = "us-east-1", sign_payload: bool = True) -> Request:
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    if not sign_payload:
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    S3SigV4Auth(Credentials(access_key, secret_key), "s3", region).add_auth(request)
    return received(request)


def presigned(method: str, url: str, expires: int = 60,
              secret_key: str = CREDS.secret_key) -> Request:
    request = AWSRequest(method=method, url=url)
    S3SigV4QueryAuth(Credentials(CREDS.access_key, secret_key), "s3", "eu-west-1",
                     expires=expires).add_auth(request)
    return received(request)


def is_refusal(found: Refusal | None, status: int, code: str) -> bool:
    return found is not None and (found.status, found.code) == (status, code)


# -- accepted: botocore -----------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("key", KEYS)
def test_botocore_object_requests_are_accepted(method: str, key: str) -> None:
    assert verify(*signed(method, object_url(key)), CREDS) is None


@pytest.mark.parametrize("key", KEYS)
def test_botocore_virtual_host_https_unsigned_payload_and_range(key: str) -> None:
    """UNSIGNED-PAYLOAD (botocore's choice over https); any region; Range signed."""
    url = object_url(key, "https://bucket.s3.ap-southeast-2.amazonaws.com", bucket=None)
    request = signed("GET", url, {"Range": "bytes=0-1023"}, region="ap-southeast-2",
                     sign_payload=False)
    assert request[2]["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert "range" in request[2]["authorization"]
    assert verify(*request, CREDS) is None


LIST_QUERY = {
    "list-type": "2",
    "prefix": "dir/a b+c=d%e~f/ünï 日本/",
    "delimiter": "/",
    "start-after": "dir/a b+c=d%e~f/ünï 日本/x y+z",
    "continuation-token": "1/AbC+dEf/gh==",
    "encoding-type": "url",
    "max-keys": "1000",
}


def test_botocore_list_request_is_accepted() -> None:
    # botocore's serializer appends percent_encode_sequence(query) to the URL
    url = f"{ENDPOINT}/bucket?{percent_encode_sequence(LIST_QUERY)}"
    request = signed("GET", url)
    assert "%20" in request[1] and "%2F" in request[1] and "%2B" in request[1]
    assert verify(*request, CREDS) is None


@pytest.mark.parametrize("query", ["uploads", "versions&prefix=a%20b", "location",
                                   "prefix=&list-type=2", "acl&versionId=3%2B4"])
def test_query_names_without_values_are_accepted(query: str) -> None:
    assert verify(*signed("GET", f"{ENDPOINT}/bucket/key?{query}"), CREDS) is None


def test_signed_header_values_are_trimmed_and_collapsed() -> None:
    request = signed("GET", object_url("k"), {"x-amz-meta-note": "  a   b \t c  "})
    assert verify(*request, CREDS) is None


def test_date_header_instead_of_x_amz_date() -> None:
    """A request dated by Date alone: botocore's own canonical request and key derivation,
    with the Date header signed and no x-amz-date."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    request = AWSRequest(method="GET", url=object_url("a b.txt"), headers={
        "Date": formatdate(now, usegmt=True), "X-Amz-Content-SHA256": EMPTY_SHA256})
    request.context["timestamp"] = stamp
    auth = S3SigV4Auth(Credentials(CREDS.access_key, CREDS.secret_key), "s3", "us-east-1")
    string_to_sign = auth.string_to_sign(request, auth.canonical_request(request))
    request.headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, "
        f"SignedHeaders={auth.signed_headers(auth.headers_to_sign(request))}, "
        f"Signature={auth.signature(string_to_sign, request)}")
    method, target, headers = received(request)
    assert "x-amz-date" not in headers and "date" in headers["authorization"]
    assert verify(method, target, headers, CREDS, now=now) is None
    assert is_refusal(verify(method, target, headers, CREDS, now=now + 3600),
                      403, "RequestTimeTooSkewed")


# -- accepted: AWS's published examples ---------------------------------------------------
AWS_CREDS = ServerCredentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
AWS_NOW = float(calendar.timegm((2013, 5, 24, 0, 0, 0)))
AWS_HOST = "examplebucket.s3.amazonaws.com"
AWS_SCOPE = "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"


def aws_headers(signed_headers: str, signature: str, **extra: str) -> dict[str, str]:
    return {"host": AWS_HOST, "x-amz-date": "20130524T000000Z",
            "x-amz-content-sha256": EMPTY_SHA256, **extra,
            "authorization": f"AWS4-HMAC-SHA256 Credential={AWS_SCOPE},"
                             f"SignedHeaders={signed_headers},Signature={signature}"}


GET_OBJECT = ("GET", "/test.txt", aws_headers(
    "host;range;x-amz-content-sha256;x-amz-date",
    "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41", range="bytes=0-9"))


@pytest.mark.parametrize(("method", "target", "headers"), [
    GET_OBJECT,  # "Signature Calculations for the Authorization Header": GET Object
    ("GET", "/?lifecycle", aws_headers(  # GET Bucket Lifecycle
        "host;x-amz-content-sha256;x-amz-date",
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543")),
    ("GET", "/?max-keys=2&prefix=J", aws_headers(  # Get Bucket (List Objects)
        "host;x-amz-content-sha256;x-amz-date",
        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")),
    ("GET", "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"  # query-string authentication
     "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
     "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
     "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404",
     {"host": AWS_HOST}),
])
def test_aws_documentation_examples(method: str, target: str, headers: dict[str, str]) -> None:
    assert verify(method, target, headers, AWS_CREDS, now=AWS_NOW) is None
    assert verify(method, target, headers, AWS_CREDS, now=AWS_NOW + 14 * 60) is None


def test_aws_example_signature_is_the_published_one() -> None:
    method, target, headers = GET_OBJECT
    string_to_sign = sigv4.string_to_sign(
        method, sigv4.canonical_uri(target), "", headers,
        ["host", "range", "x-amz-content-sha256", "x-amz-date"], EMPTY_SHA256,
        "20130524T000000Z", "20130524/us-east-1/s3/aws4_request")
    assert string_to_sign is not None
    assert sigv4.signature(AWS_CREDS.secret_key, "20130524", "us-east-1", string_to_sign) == (
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


# -- accepted: libcurl, as the bulkfetch client signs -------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    seen: list[Request]

    def _answer(self) -> None:
        target = self.requestline.split(" ")[1]  # the raw request-target (latin-1 str)
        headers = {name.lower(): value.strip() for name, value in self.headers.items()}
        self.seen.append((self.command, target, headers))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[Request]]]:
    seen: list[Request] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def curl(url: str, *, head: bool = False, headers: list[str] | None = None,
         userpwd: str = f"{CREDS.access_key}:{CREDS.secret_key}") -> None:
    handle = pycurl.Curl()
    try:
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.AWS_SIGV4, "aws:amz:us-east-1:s3")
        handle.setopt(pycurl.USERPWD, userpwd)
        handle.setopt(pycurl.HTTPHEADER, headers or [])
        handle.setopt(pycurl.NOBODY, head)
        handle.setopt(pycurl.WRITEFUNCTION, len)
        handle.perform()
        assert handle.getinfo(pycurl.RESPONSE_CODE) == 200
    finally:
        handle.close()


CURL_KEYS = ["a b+c.bin", "dir one/ünï 日本+x/y z+.txt", "100% + 50%=x~.bin"]


@pytest.mark.parametrize("head", [False, True])
@pytest.mark.parametrize("key", CURL_KEYS)
def test_libcurl_signed_requests_are_accepted(recorder: tuple[str, list[Request]], key: str,
                                              head: bool) -> None:
    endpoint, seen = recorder
    # the bulkfetch client: quote(key, safe="/-_.~") and x-amz-content-sha256 UNSIGNED
    url = f"{endpoint}/bucket/" + quote(key.encode("utf-8"), safe="/-_.~")
    curl(url, head=head, headers=["x-amz-content-sha256: UNSIGNED-PAYLOAD"])
    curl(url, head=head, headers=["Range: bytes=5-9"])  # libcurl's own payload hash
    assert len(seen) == 2
    for method, target, headers in seen:
        assert method == ("HEAD" if head else "GET")
        assert target.startswith("/bucket/") and "%20" in target
        assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDSERVER/")
        assert verify(method, target, headers, CREDS) is None
        assert is_refusal(verify(method, target, headers, ServerCredentials(
            CREDS.access_key, "other")), 403, "SignatureDoesNotMatch")


def test_libcurl_list_request_is_accepted(recorder: tuple[str, list[Request]]) -> None:
    endpoint, seen = recorder
    query = "&".join(f"{name}={quote(value.encode('utf-8'), safe='-_.~')}"
                     for name, value in sorted(LIST_QUERY.items()))
    curl(f"{endpoint}/bucket?{query}", headers=["x-amz-content-sha256: UNSIGNED-PAYLOAD"])
    [(method, target, headers)] = seen
    assert target == f"/bucket?{query}"
    assert verify(method, target, headers, CREDS) is None


# -- presigned URLs -----------------------------------------------------------------------
@pytest.mark.parametrize("key", ["with space.txt", "ünï/日本 a+b=c%~.bin"])
def test_presigned_urls(key: str) -> None:
    method, target, headers = presigned("GET", object_url(key), expires=60)
    assert "X-Amz-Signature=" in target and "authorization" not in headers
    now = time.time()
    assert verify(method, target, headers, CREDS, now=now) is None
    assert is_refusal(verify(method, target, headers, CREDS, now=now + 120),
                      403, "AccessDenied")
    assert verify(method, target, headers, CREDS, now=now + 120).message == (  # type: ignore[union-attr]
        "Request has expired")
    assert is_refusal(verify(method, target, headers, CREDS, now=now - 3600),
                      403, "AccessDenied")
    assert is_refusal(verify(method, target.replace("/bucket/", "/bucket/x"), headers,
                             CREDS, now=now), 403, "SignatureDoesNotMatch")
    assert is_refusal(verify(method, target + "&extra=1", headers, CREDS, now=now),
                      403, "SignatureDoesNotMatch")
    assert is_refusal(verify(*presigned("GET", object_url(key), secret_key="nope"), CREDS),
                      403, "SignatureDoesNotMatch")
    both = {**headers, "authorization": "AWS4-HMAC-SHA256 Credential=x"}
    assert is_refusal(verify(method, target, both, CREDS), 400, "InvalidArgument")


@pytest.mark.parametrize("drop", ["X-Amz-Expires", "X-Amz-Date", "X-Amz-SignedHeaders",
                                  "X-Amz-Algorithm"])
def test_presigned_url_missing_a_parameter(drop: str) -> None:
    method, target, headers = presigned("GET", object_url("k"))
    path, _, query = target.partition("?")
    kept = "&".join(p for p in query.split("&") if not p.startswith(drop + "="))
    assert is_refusal(verify(method, f"{path}?{kept}", headers, CREDS),
                      400, "AuthorizationQueryParametersError")


def test_presigned_url_expires_beyond_a_week() -> None:
    method, target, headers = presigned("GET", object_url("k"), expires=604801)
    assert is_refusal(verify(method, target, headers, CREDS),
                      400, "AuthorizationQueryParametersError")


def test_sigv2_is_not_supported() -> None:
    assert is_refusal(verify("GET", "/b/k", {"host": "h", "authorization": "AWS AKID:c2ln"},
                             CREDS), 400, "InvalidRequest")
    assert is_refusal(verify("GET", "/b/k?AWSAccessKeyId=AKID&Expires=1&Signature=x",
                             {"host": "h"}, CREDS), 400, "InvalidRequest")


# -- refusals -----------------------------------------------------------------------------
def test_wrong_secret() -> None:
    request = signed("GET", object_url("a b+c.txt"), secret_key="not the secret")
    assert verify(*request, CREDS) == Refusal(
        403, "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.")


def test_unknown_access_key() -> None:
    found = verify(*signed("GET", object_url("k"), access_key="AKIDOTHER"), CREDS)
    assert is_refusal(found, 403, "InvalidAccessKeyId")
    assert "does not exist in our records" in found.message  # type: ignore[union-attr]


@pytest.mark.parametrize("tamper", [
    lambda t: t.replace("space", "spade"),
    lambda t: t.replace("%20", "+"),  # '+' is a plus sign, not a space
    lambda t: t.replace("/bucket/", "/bucket//"),  # double slashes are not merged
    lambda t: t.replace("/bucket/", "/bucket/./"),  # nor '.' segments removed
    lambda t: t.replace("/bucket/", "/other/"),
    lambda t: t + "?x-id=GetObject",
])
def test_tampered_path(tamper: object) -> None:
    method, target, headers = signed("GET", object_url("with space.txt"))
    changed = tamper(target)  # type: ignore[operator]
    assert changed != target
    assert is_refusal(verify(method, changed, headers, CREDS), 403, "SignatureDoesNotMatch")


def test_equivalent_percent_encodings_of_the_path_are_accepted() -> None:
    """S3 decodes and re-encodes each segment: %7E and ~, %41 and A, %c3 and %C3 are the
    same; %2F stays an encoded '/' (it does not split a segment)."""
    method, target, headers = signed("GET", object_url("~A b/ü"))
    assert target.endswith("/~A%20b/%C3%BC")
    assert verify(method, target.replace("~A", "%7E%41"), headers, CREDS) is None
    assert verify(method, target.replace("%C3%BC", "%c3%bc"), headers, CREDS) is None
    assert is_refusal(verify(method, target.replace("b/", "b%2F"), headers, CREDS),
                      403, "SignatureDoesNotMatch")


@pytest.mark.parametrize("tamper", [
    lambda t: t.replace("max-keys=1000", "max-keys=1001"),
    lambda t: t.replace("delimiter=%2F", "delimiter=%2C"),
    lambda t: t + "&fetch-owner=true",
    lambda t: t.replace("&delimiter=%2F", ""),
    lambda t: t.replace("%2B", "+"),  # '+' in a query is a space (parse_qsl reads it so)
])
def test_tampered_query(tamper: object) -> None:
    method, target, headers = signed(
        "GET", f"{ENDPOINT}/bucket?{percent_encode_sequence(LIST_QUERY)}")
    changed = tamper(target)  # type: ignore[operator]
    assert changed != target
    assert is_refusal(verify(method, changed, headers, CREDS), 403, "SignatureDoesNotMatch")


def test_equivalent_queries_are_accepted() -> None:
    """Order does not matter, nor the spelling of a byte (%7E, ~), and '+' is a space."""
    method, target, headers = signed(
        "GET", f"{ENDPOINT}/bucket?{percent_encode_sequence(LIST_QUERY)}")
    path, _, query = target.partition("?")
    assert "%20" in query and "~" in query
    for changed in ("&".join(reversed(query.split("&"))), query.replace("%20", "+"),
                    query.replace("~", "%7e"), query.replace("list-type", "list%2Dtype")):
        assert changed != query
        assert verify(method, f"{path}?{changed}", headers, CREDS) is None


@pytest.mark.parametrize(("name", "value"), [
    ("range", "bytes=0-2048"),
    ("host", "127.0.0.1:9001"),
    ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
])
def test_tampered_signed_header(name: str, value: str) -> None:
    method, target, headers = signed("GET", object_url("k"), {"Range": "bytes=0-1023"})
    headers[name] = value
    assert is_refusal(verify(method, target, headers, CREDS), 403, "SignatureDoesNotMatch")


def test_tampered_x_amz_date() -> None:
    method, target, headers = signed("GET", object_url("k"))
    stamp = headers["x-amz-date"]
    other = stamp[:13] + ("01" if stamp[13:15] == "00" else "00") + "Z"  # same minute
    for value, code in ((other, "SignatureDoesNotMatch"), ("20200101T000000Z", None)):
        found = verify(method, target, {**headers, "x-amz-date": value}, CREDS)
        if code:
            assert is_refusal(found, 403, code)
        else:  # another day than the credential's scope
            assert is_refusal(found, 400, "AuthorizationHeaderMalformed")


def test_signed_header_absent_from_the_request() -> None:
    method, target, headers = signed("GET", object_url("k"), {"Range": "bytes=0-1023"})
    del headers["range"]
    assert is_refusal(verify(method, target, headers, CREDS), 403, "SignatureDoesNotMatch")


def test_unsigned_headers_ignored_but_unsigned_x_amz_headers_refused() -> None:
    method, target, headers = signed("GET", object_url("k"))
    assert verify(method, target, {**headers, "user-agent": "x", "range": "bytes=1-"},
                  CREDS) is None
    found = verify(method, target, {**headers, "x-amz-meta-extra": "1"}, CREDS)
    assert is_refusal(found, 403, "AccessDenied")
    assert "not signed" in found.message  # type: ignore[union-attr]


def test_host_must_be_signed() -> None:
    method, target, headers = GET_OBJECT
    headers = {**headers, "authorization": headers["authorization"].replace(
        "SignedHeaders=host;", "SignedHeaders=")}
    assert is_refusal(verify(method, target, headers, AWS_CREDS, now=AWS_NOW),
                      403, "AccessDenied")


def test_missing_authorization() -> None:
    method, target, headers = signed("GET", object_url("k"))
    del headers["authorization"]
    assert verify(method, target, headers, CREDS) == Refusal(403, "AccessDenied",
                                                             "Access Denied")


@pytest.mark.parametrize("offset", [-16 * 60, 16 * 60, 86400])
def test_skewed_clock(offset: float) -> None:
    request = signed("GET", object_url("k"))
    now = time.time()
    found = verify(*request, CREDS, now=now + offset)
    assert is_refusal(found, 403, "RequestTimeTooSkewed")
    assert found.message == (  # type: ignore[union-attr]
        "The difference between the request time and the current time is too large.")
    assert verify(*request, CREDS, now=now + (14 * 60 if offset > 0 else -14 * 60)) is None


def test_missing_or_bad_date() -> None:
    method, target, headers = GET_OBJECT
    without = {k: v for k, v in headers.items() if k != "x-amz-date"}
    for dated in (without, {**headers, "x-amz-date": "2013-05-24T00:00:00Z"},
                  {**without, "date": "yesterday"}):
        found = verify(method, target, dated, AWS_CREDS, now=AWS_NOW)
        assert is_refusal(found, 403, "AccessDenied")
        assert "Date" in found.message  # type: ignore[union-attr]


def test_credential_date_must_be_the_request_date() -> None:
    method, target, headers = GET_OBJECT
    headers = {**headers, "x-amz-date": "20130523T235959Z"}
    assert is_refusal(verify(method, target, headers, AWS_CREDS, now=AWS_NOW),
                      400, "AuthorizationHeaderMalformed")


GOOD_AUTH = GET_OBJECT[2]["authorization"]


@pytest.mark.parametrize("authorization", [
    "AWS4-HMAC-SHA256",
    "AWS4-HMAC-SHA256 ",
    GOOD_AUTH.replace(",Signature=", ",Sig="),
    GOOD_AUTH.replace("SignedHeaders=", "SignedHeader="),
    GOOD_AUTH.replace("Credential=", "Credentials="),
    GOOD_AUTH + ",Signature=00",
    GOOD_AUTH + ",Extra=1",
    GOOD_AUTH.replace(",Signature=", " Signature="),
    GOOD_AUTH.replace("Credential=AKIAIOSFODNN7EXAMPLE/", "Credential="),
    GOOD_AUTH.replace("/s3/", "/ec2/"),
    GOOD_AUTH.replace("/aws4_request", "/aws5_request"),
    GOOD_AUTH.replace("/20130524/", "/2013-05-24/"),
    GOOD_AUTH.replace("/us-east-1/", "//"),
    GOOD_AUTH.replace("SignedHeaders=host;range;", "SignedHeaders=host;;range;"),
    GOOD_AUTH.replace("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date",
                      "SignedHeaders="),
])
def test_malformed_authorization_header(authorization: str) -> None:
    method, target, headers = GET_OBJECT
    found = verify(method, target, {**headers, "authorization": authorization}, AWS_CREDS,
                   now=AWS_NOW)
    assert is_refusal(found, 400, "AuthorizationHeaderMalformed"), found
    assert found.message.startswith(  # type: ignore[union-attr]
        "The authorization header is malformed; ")


@pytest.mark.parametrize("authorization", ["Bearer abc", "Basic QUtJRDpzZWNyZXQ=", "abc"])
def test_other_authorization_types(authorization: str) -> None:
    found = verify("GET", "/b/k", {"host": "h", "authorization": authorization}, CREDS)
    assert found is not None and found.status == 400


def test_any_region_and_spacing_variants_are_accepted() -> None:
    method, target, headers = GET_OBJECT
    spaced = headers["authorization"].replace(",", ", ")
    assert verify(method, target, {**headers, "authorization": spaced}, AWS_CREDS,
                  now=AWS_NOW) is None
    for region in ("eu-central-1", "auto", "garage"):
        assert verify(*signed("GET", object_url("r"), region=region), CREDS) is None


def test_payload_hash() -> None:
    method, target, headers = GET_OBJECT
    bad = {**headers, "x-amz-content-sha256": "not-a-hash"}
    assert is_refusal(verify(method, target, bad, AWS_CREDS, now=AWS_NOW),
                      400, "InvalidArgument")
    # GET and HEAD without the header are signed over the empty string's hash
    for m in ("GET", "HEAD"):
        request = signed(m, object_url("k"))
        without = {k: v for k, v in request[2].items() if k != "x-amz-content-sha256"}
        assert request[2]["x-amz-content-sha256"] == EMPTY_SHA256
        # botocore signed the header, so dropping it changes the canonical request
        assert is_refusal(verify(m, request[1], without, CREDS), 403, "SignatureDoesNotMatch")
    found = verify("DELETE", "/b/k", {
        "host": "h", "x-amz-date": "20130524T000000Z",
        "authorization": f"AWS4-HMAC-SHA256 Credential={AWS_SCOPE},SignedHeaders=host;"
                         "x-amz-date,Signature=00"}, AWS_CREDS, now=AWS_NOW)
    assert is_refusal(found, 400, "MissingSecurityHeader")


def test_get_without_content_sha256_uses_the_empty_hash() -> None:
    """A GET that neither sends nor signs x-amz-content-sha256 (botocore's canonical request
    with the header taken out of signing: the payload line is still the empty hash)."""
    request = AWSRequest(method="GET", url=object_url("no sha.txt"))
    auth = S3SigV4Auth(Credentials(CREDS.access_key, CREDS.secret_key), "s3", "us-east-1")
    auth.add_auth(request)
    del request.headers["Authorization"]
    del request.headers["X-Amz-Content-SHA256"]
    string_to_sign = auth.string_to_sign(request, auth.canonical_request(request))
    request.headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, "
        f"SignedHeaders={auth.signed_headers(auth.headers_to_sign(request))}, "
        f"Signature={auth.signature(string_to_sign, request)}")
    method, target, headers = received(request)
    assert "x-amz-content-sha256" not in headers
    assert verify(method, target, headers, CREDS) is None


# -- credentials and the key cache --------------------------------------------------------
def test_parse_credentials() -> None:
    assert parse_credentials("AKID:s3cr3t") == ServerCredentials("AKID", "s3cr3t")
    assert parse_credentials("AKID:se:cr:et") == ServerCredentials("AKID", "se:cr:et")
    assert "s3cr3t" not in repr(parse_credentials("AKID:s3cr3t"))


@pytest.mark.parametrize("text", ["", "AKID", ":s3cr3t", "AKID:", "AK ID:s3cr3t",
                                  "AK/ID:s3cr3t", "AK,ID:s3cr3t", "AKID:s3c\nr3t"])
def test_parse_credentials_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--s3-credentials") as caught:
        parse_credentials(text)
    assert "s3c" not in str(caught.value)


def test_signing_key_cache_is_used_and_bounded() -> None:
    sigv4._KEYS.clear()
    request = signed("GET", object_url("k"))
    assert verify(*request, CREDS) is None
    assert verify(*request, CREDS) is None
    assert len(sigv4._KEYS) == 1
    for n in range(200):
        sigv4.signing_key("secret", "20130524", f"region-{n}")
    assert 0 < len(sigv4._KEYS) <= sigv4._MAX_KEYS
    assert verify(*request, CREDS) is None
