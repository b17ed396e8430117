"""AWS Signature Version 4 checks for the reference server's S3 mode (`serve --s3
--s3-credentials KEY:SECRET`): a request is accepted or refused the way S3 itself would.

verify() takes a request as the server's HTTP layer hands it over: the method, the raw
request-target (path?query, percent-encoded as the client sent it, decoded from the wire
as latin-1 so every byte survives) and the headers (lower-case names, one value each).
It returns None for a correctly signed request, else a Refusal with S3's status, error
code and wording.

Both of S3's SigV4 forms are checked:

* the Authorization header, "AWS4-HMAC-SHA256 Credential=AK/YYYYMMDD/REGION/s3/
  aws4_request, SignedHeaders=a;b, Signature=HEX", with x-amz-date (or Date) no more than
  15 minutes from the server's clock;
* presigned URLs (X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date, X-Amz-Expires,
  X-Amz-SignedHeaders and X-Amz-Signature in the query), valid from X-Amz-Date (15
  minutes of skew allowed) until X-Amz-Expires seconds after it.

Any region is accepted; the service must be "s3". The canonical request is S3's: the path
is not normalised ('.', '..' and empty segments stay) and each segment, like each query
name and value, is percent-decoded and encoded once again with only A-Z a-z 0-9 - _ . ~
left as they are. '+' is a plus sign in the path but a space in the query, as the server
reads them (unquote, parse_qsl): what is signed is what the server acts on. The payload
hash is the x-amz-content-sha256 header (a hex SHA-256, UNSIGNED-PAYLOAD or a
STREAMING-... value, taken as given: the server has no request bodies to hash); a GET or
HEAD without it is signed over the SHA-256 of nothing, as S3 does, and a presigned URL
over UNSIGNED-PAYLOAD.

The derived signing key is cached per (secret, date, region): a request then costs
one SHA-256 over a few hundred bytes and one HMAC-SHA256.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_tz
from urllib.parse import quote_from_bytes, unquote_to_bytes

from ..errors import UsageError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
TERMINATOR = "aws4_request"
MAX_SKEW = 15 * 60  # seconds between the request's date and the server's clock
MAX_EXPIRES = 7 * 24 * 3600  # the longest X-Amz-Expires S3 takes
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

_SAFE = "-_.~"  # with A-Z a-z 0-9: what SigV4's URI encoding leaves as it is
_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-_.~/]*")
_AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")
_SCOPE_DATE = re.compile(r"\d{8}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_QUERY_AUTH = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature")
_QUERY_AUTH_V2 = ("AWSAccessKeyId", "Signature")


@dataclass(frozen=True)
class ServerCredentials:
    """The one access key the server accepts and its secret."""

    access_key: str
    secret_key: str
    session_token: str | None = None  # temporary credentials: the token must come, signed

    def __repr__(self) -> str:  # never print the secret
        token = ", session_token='***'" if self.session_token is not None else ""
        return f"ServerCredentials(access_key={self.access_key!r}, secret_key='***'{token})"


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: S3's HTTP status, error code and message."""

    status: int
    code: str
    message: str


def parse_credentials(text: str) -> ServerCredentials:
    """--s3-credentials "KEY:SECRET": split at the first ':' (the secret may hold more)."""
    key, colon, secret = text.partition(":")
    if not colon or not key or not secret:
        raise UsageError("--s3-credentials wants ACCESS_KEY:SECRET_KEY, both non-empty")
    if not key.isascii() or not key.isprintable() or any(c in key for c in " ,/="):
        raise UsageError("--s3-credentials: the access key must be printable ASCII without "
                         "spaces, ',', '/' or '='")
    if not secret.isprintable():
        raise UsageError("--s3-credentials: the secret key holds control characters")
    return ServerCredentials(key, secret)


# -- refusals (S3's codes and wording) ---------------------------------------------------
ACCESS_DENIED = Refusal(403, "AccessDenied", "Access Denied")
_SIGNATURE_MISMATCH = Refusal(
    403, "SignatureDoesNotMatch",
    "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method.")
_UNKNOWN_KEY = Refusal(
    403, "InvalidAccessKeyId",
    "The AWS Access Key Id you provided does not exist in our records.")
_SKEWED = Refusal(
    403, "RequestTimeTooSkewed",
    "The difference between the request time and the current time is too large.")
_NO_DATE = Refusal(
    403, "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header")
_UNSIGNED_HEADERS = Refusal(
    403, "AccessDenied", "There were headers present in the request which were not signed")
_EXPIRED = Refusal(403, "AccessDenied", "Request has expired")
_NOT_YET = Refusal(403, "AccessDenied", "Request is not valid yet")
_TWO_MECHANISMS = Refusal(
    400, "InvalidArgument",
    "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature "
    "query string parameter or the Authorization header should be specified")
_NOT_V4 = Refusal(
    400, "InvalidRequest",
    "The authorization mechanism you have provided is not supported. "
    "Please use AWS4-HMAC-SHA256.")
_UNSUPPORTED_TYPE = Refusal(400, "InvalidArgument", "Unsupported Authorization Type")
_NO_CONTENT_SHA = Refusal(
    400, "MissingSecurityHeader",
    "Your request was missing a required header: x-amz-content-sha256")
_BAD_CONTENT_SHA = Refusal(
    400, "InvalidArgument",
    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a STREAMING-... value "
    "or a valid sha256 value.")
# a temporary key's request without its session token, or with another one
_BAD_TOKEN = Refusal(403, "InvalidToken", "The provided token is malformed or otherwise invalid.")


def _malformed(detail: str) -> Refusal:
    return Refusal(400, "AuthorizationHeaderMalformed",
                   f"The authorization header is malformed; {detail}")


def _query_error(detail: str) -> Refusal:
    return Refusal(400, "AuthorizationQueryParametersError", detail)


# -- signing key ---------------------------------------------------------------------------
_KEYS: dict[tuple[str, str, str], bytes] = {}
_MAX_KEYS = 64  # a few dates x regions; cleared whole when full


def signing_key(secret: str, date: str, region: str) -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), "s3"),
    "aws4_request"), cached per (secret, date, region)."""
    cache_key = (secret, date, region)
    found = _KEYS.get(cache_key)
    if found is None:
        found = ("AWS4" + secret).encode("utf-8")
        for part in (_raw(date), _raw(region), b"s3", b"aws4_request"):
            found = hmac.new(found, part, hashlib.sha256).digest()
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        _KEYS[cache_key] = found
    return found


# -- canonical request ---------------------------------------------------------------------
def _raw(text: str) -> bytes:
    """The bytes a wire string stands for: the HTTP layer decodes them as latin-1, so
    encoding back gives them unchanged (a caller's str beyond latin-1 is taken as UTF-8)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


def _encode(raw: str) -> str:
    """Percent-decode, then encode once with only unreserved characters left as they are."""
    return quote_from_bytes(unquote_to_bytes(_raw(raw)), safe=_SAFE)


def _encode_query(raw: str) -> str:
    """_encode, '+' read as a space first: the server reads the query with parse_qsl, and
    the signature must cover what it acts on (a signed "%2B" sent as '+' is refused)."""
    return quote_from_bytes(unquote_to_bytes(_raw(raw).replace(b"+", b" ")), safe=_SAFE)


def canonical_uri(path: str) -> str:
    """S3's canonical URI: each '/'-separated segment decoded and encoded again; nothing
    normalised ('.', '..' and empty segments are kept)."""
    if not path:
        return "/"
    if _PLAIN_PATH.fullmatch(path):
        return path
    return "/".join(_encode(segment) for segment in path.split("/"))


def parse_query(query: str) -> list[tuple[str, str]]:
    """The query's name/value pairs, each canonically encoded ('+' is a space, a name
    without '=' has an empty value, empty parts between '&'s are skipped)."""
    pairs: list[tuple[str, str]] = []
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((_encode_query(name), _encode_query(value)))
    return pairs


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _header_value(value: str) -> bytes:
    """Trimmed, each run of (ASCII) whitespace made one space; split on bytes, since a
    latin-1 str would also split at U+0085 and U+00A0, which may be halves of UTF-8."""
    raw = _raw(value)
    return b" ".join(raw.split())


def string_to_sign(method: str, uri: str, query: str, headers: Mapping[str, str],
                   signed: list[str], payload_hash: str, timestamp: str,
                   scope: str) -> bytes | None:
    """The string to sign, or None when a signed header is absent from the request."""
    lines = [_raw(method), uri.encode("ascii"), query.encode("ascii")]
    for name in signed:
        value = headers.get(name)
        if value is None:
            return None
        lines.append(_raw(name) + b":" + _header_value(value))
    lines += [b"", _raw(";".join(signed)), _raw(payload_hash)]
    digest = hashlib.sha256(b"\n".join(lines)).hexdigest()
    return _raw("\n".join((ALGORITHM, timestamp, scope, digest)))


def signature(secret: str, date: str, region: str, to_sign: bytes) -> str:
    return hmac.new(signing_key(secret, date, region), to_sign, hashlib.sha256).hexdigest()


# -- dates ---------------------------------------------------------------------------------
def _amz_time(value: str) -> float | None:
    """Seconds since the epoch of an ISO 8601 basic timestamp (20130524T000000Z)."""
    match = _AMZ_DATE.fullmatch(value)
    if match is None:
        return None
    fields = tuple(int(g) for g in match.groups())
    year, month, day, hour, minute, second = fields
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def _request_time(headers: Mapping[str, str]) -> tuple[str, float] | None:
    """(ISO 8601 basic timestamp, epoch seconds) of x-amz-date, else of Date."""
    amz = headers.get("x-amz-date")
    if amz is not None:
        when = _amz_time(amz.strip())
        return None if when is None else (amz.strip(), when)
    date = headers.get("date")
    if date is None:
        return None
    parsed = parsedate_tz(date)
    if parsed is None:
        return None
    try:
        when = float(calendar.timegm(parsed[:9]) - (parsed[9] or 0))
    except (OverflowError, ValueError):
        return None
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when)), when


# -- verification --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Scope:
    access_key: str
    date: str
    region: str

    @property
    def text(self) -> str:
        return f"{self.date}/{self.region}/{SERVICE}/{TERMINATOR}"


def _parse_credential(credential: str) -> _Scope | str:
    """AK/YYYYMMDD/REGION/s3/aws4_request, or what is wrong with it."""
    parts = credential.rsplit("/", 4)
    if len(parts) != 5 or not parts[0] or not parts[2]:
        return ('the Credential is mal-formed; expecting '
                '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".')
    access_key, date, region, service, terminator = parts
    if not _SCOPE_DATE.fullmatch(date):
        return f'incorrect date format "{date}". This date in the credential must be in ' \
               'the format "yyyyMMdd".'
    if service != SERVICE:
        return f'incorrect service "{service}". This endpoint belongs to "{SERVICE}".'
    if terminator != TERMINATOR:
        return f'incorrect terminal "{terminator}". This endpoint uses "{TERMINATOR}".'
    return _Scope(access_key, date, region)


def _parse_signed_headers(text: str) -> list[str] | None:
    names = text.lower().split(";")
    if not all(names):
        return None
    return sorted(set(names))


def _unsigned(headers: Mapping[str, str], signed: list[str]) -> bool:
    """S3 wants host and every x-amz-* header the request has signed."""
    if "host" not in signed:
        return True
    return any(name.startswith("x-amz-") and name not in signed for name in headers)


def _payload_hash(method: str, headers: Mapping[str, str]) -> str | Refusal:
    value = headers.get("x-amz-content-sha256")
    if value is None:
        return EMPTY_SHA256 if method in ("GET", "HEAD") else _NO_CONTENT_SHA
    value = value.strip()
    if value == UNSIGNED_PAYLOAD or value.startswith("STREAMING-") or _HEX64.fullmatch(value):
        return value
    return _BAD_CONTENT_SHA


def verify(method: str, target: str, headers: Mapping[str, str],
           credentials: ServerCredentials, now: float | None = None) -> Refusal | None:
    """None when the request is signed with `credentials` (SigV4, S3's rules), else why
    S3 would refuse it. `headers` maps lower-case names to values; `now` defaults to the
    clock."""
    if target.startswith(("http://", "https://")):  # absolute-form: keep path?query
        slash = target.find("/", target.find("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    path, _, query = target.partition("?")
    pairs = parse_query(query) if query else []
    authorization = headers.get("authorization")
    names = {name for name, _ in pairs} if pairs else set()
    if any(name in names for name in _QUERY_AUTH):
        if authorization is not None:
            return _TWO_MECHANISMS
        return _verify_query(method, path, pairs, headers, credentials,
                             time.time() if now is None else now)
    if authorization is None:
        if all(name in names for name in _QUERY_AUTH_V2):
            return _NOT_V4
        return ACCESS_DENIED
    return _verify_header(method, path, pairs, headers, authorization, credentials,
                          time.time() if now is None else now)


def _verify_header(method: str, path: str, pairs: list[tuple[str, str]],
                   headers: Mapping[str, str], authorization: str,
                   credentials: ServerCredentials, now: float) -> Refusal | None:
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme != ALGORITHM:
        return _NOT_V4 if scheme in ("AWS", "AWS4-HMAC-SHA1") else _UNSUPPORTED_TYPE
    fields: dict[str, str] = {}
    for component in rest.split(","):
        name, equals, value = component.strip().partition("=")
        if not equals or name in fields:
            return _malformed("the authorization component is mal-formed or repeated.")
        fields[name] = value.strip()
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        return _malformed("the authorization header requires three components: "
                          "Credential, SignedHeaders, and Signature.")
    scope = _parse_credential(fields["Credential"])
    if isinstance(scope, str):
        return _malformed(scope)
    signed = _parse_signed_headers(fields["SignedHeaders"])
    if signed is None:
        return _malformed("the SignedHeaders component is mal-formed.")
    if not hmac.compare_digest(_raw(scope.access_key), _raw(credentials.access_key)):
        return _UNKNOWN_KEY
    stamp = _request_time(headers)
    if stamp is None:
        return _NO_DATE
    timestamp, when = stamp
    if timestamp[:8] != scope.date:
        return _malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    if abs(now - when) > MAX_SKEW:
        return _SKEWED
    if _unsigned(headers, signed):
        return _UNSIGNED_HEADERS
    if credentials.session_token is not None and not hmac.compare_digest(
            _raw(headers.get("x-amz-security-token", "")), _raw(credentials.session_token)):
        return _BAD_TOKEN
    payload = _payload_hash(method, headers)
    if isinstance(payload, Refusal):
        return payload
    to_sign = string_to_sign(method, canonical_uri(path), canonical_query(pairs), headers,
                             signed, payload, timestamp, scope.text)
    return _check(to_sign, fields["Signature"], credentials, scope)


def _verify_query(method: str, path: str, pairs: list[tuple[str, str]],
                  headers: Mapping[str, str], credentials: ServerCredentials,
                  now: float) -> Refusal | None:
    params: dict[str, str] = {}
    for name, value in pairs:
        if name.startswith("X-Amz-"):
            # latin-1: a str per byte, as the HTTP layer gives the headers
            params.setdefault(name, unquote_to_bytes(value).decode("latin-1"))
    wanted = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "X-Amz-Date",
              "X-Amz-SignedHeaders", "X-Amz-Expires")
    if not all(name in params for name in wanted):
        return _query_error(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
            "and X-Amz-Expires parameters.")
    if params["X-Amz-Algorithm"] != ALGORITHM:
        return _query_error(f'X-Amz-Algorithm only supports "{ALGORITHM}"')
    scope = _parse_credential(params["X-Amz-Credential"])
    if isinstance(scope, str):
        return _query_error(f"Error parsing the X-Amz-Credential parameter; {scope}")
    signed = _parse_signed_headers(params["X-Amz-SignedHeaders"])
    if signed is None:
        return _query_error("Error parsing the X-Amz-SignedHeaders parameter.")
    if not hmac.compare_digest(_raw(scope.access_key), _raw(credentials.access_key)):
        return _UNKNOWN_KEY
    timestamp = params["X-Amz-Date"]
    when = _amz_time(timestamp)
    if when is None:
        return _query_error("X-Amz-Date must be in the ISO8601 Long Format "
                            "\"yyyyMMdd'T'HHmmss'Z'\"")
    if timestamp[:8] != scope.date:
        return _query_error("Invalid credential date. Date is not the same as X-Amz-Date.")
    expires = params["X-Amz-Expires"]
    if not expires.isdigit() or not expires.isascii():
        return _query_error("X-Amz-Expires should be a number")
    if int(expires) > MAX_EXPIRES:
        return _query_error("X-Amz-Expires must be less than a week (in seconds) that is "
                            "604800")
    if when - now > MAX_SKEW:
        return _NOT_YET
    if now > when + int(expires):
        return _EXPIRED
    if _unsigned(headers, signed):
        return _UNSIGNED_HEADERS
    payload = headers.get("x-amz-content-sha256", UNSIGNED_PAYLOAD).strip()
    kept = [(name, value) for name, value in pairs if name != "X-Amz-Signature"]
    to_sign = string_to_sign(method, canonical_uri(path), canonical_query(kept), headers,
                             signed, payload, timestamp, scope.text)
    return _check(to_sign, params["X-Amz-Signature"], credentials, scope)


def _check(to_sign: bytes | None, given: str, credentials: ServerCredentials,
           scope: _Scope) -> Refusal | None:
    if to_sign is None:
        return _SIGNATURE_MISMATCH
    expected = signature(credentials.secret_key, scope.date, scope.region, to_sign)
    if hmac.compare_digest(expected.encode("ascii"), _raw(given.strip())):
        return None
    return _SIGNATURE_MISMATCH
