"""What an S3-compatible store is for a run: endpoint, region, credentials and addressing
(S3Settings), the URLs of its buckets and objects, and how libcurl signs listing requests
to it (CURLOPT_AWS_SIGV4; object GETs: s3/signer.py). s3/profiles.py finds the settings the
way the AWS tools do.

A secret never appears in a repr, a str, describe() or an exception message: S3Credentials
hides the secret key and the session token from its repr, and messages name where a value
came from instead of the value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import SplitResult, quote, urlsplit

from bulkfetch.errors import UsageError

__all__ = ["DEFAULT_REGION", "S3Credentials", "S3Settings", "UnsendableKey", "aws_endpoint",
           "parse_s3_url"]

DEFAULT_REGION = "us-east-1"
ADDRESSING_STYLES = ("auto", "path", "virtual")

# Bucket names, S3's general-purpose rules: 3-63 characters of lower-case letters, digits,
# '.' and '-', a letter or digit at each end, no '..', not an IPv4 address. (The legacy
# us-east-1 names with upper case or '_' are refused: no bucket can be created so today.)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_LIKE = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
# A bucket name that is one DNS label: the only kind auto puts in the host name.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{1,61})[a-z0-9]")
# Regions go into libcurl's "aws:amz:REGION:s3" (parts end at ':' and hold at most 64
# bytes) and into the signature's scope; S3-compatible stores use names like "garage".
_REGION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?")
# An endpoint's optional path: unreserved characters, '/' and %XX, nothing libcurl rewrites.
_ENDPOINT_PATH = re.compile(r"(?:/(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})*)*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_AWS_HOST = re.compile(r"(?i)(?:^|\.)amazonaws\.com(?:\.cn)?$")


class UnsendableKey(ValueError):
    """A key object_url() cannot put in a URL that libcurl would send unchanged."""


@dataclass(frozen=True, slots=True)
class S3Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    source: str = ""  # where they came from, for messages ("environment", "profile 'dev' ...")

    def __post_init__(self) -> None:
        where = self.source or "the credentials"
        # libcurl splits CURLOPT_USERPWD at its first ':' (Curl_parse_login_details), so
        # the access key may hold none; the secret may (everything after the first ':' is
        # the password). Control characters would end a C string or a header line.
        if not self.access_key or ":" in self.access_key \
                or re.search(r"[\s\x00-\x1f\x7f]", self.access_key):
            raise UsageError(f"{where}: the access key is empty or holds ':', a space or a "
                             "control character")
        if not self.secret_key or _CONTROL.search(self.secret_key):
            raise UsageError(f"{where}: the secret key is empty or holds a control character")
        if self.session_token is not None and (not self.session_token
                                               or _CONTROL.search(self.session_token)):
            raise UsageError(f"{where}: the session token is empty or holds a control "
                             "character")


@dataclass(frozen=True, slots=True)
class S3Settings:
    endpoint: str  # "scheme://host[:port][/path]", no trailing slash
    region: str
    credentials: S3Credentials | None  # None: unsigned requests (--no-sign-request)
    addressing: str  # "path" | "virtual" | "auto" (decided per bucket: addressing_for())
    # where endpoint and region came from ("--region", "AWS_ENDPOINT_URL_S3", ...), for
    # describe(); not part of equality
    endpoint_source: str = field(default="", compare=False)
    region_source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.addressing not in ADDRESSING_STYLES:
            raise UsageError(f"addressing style {self.addressing!r}: give auto, path or "
                             "virtual")
        if _REGION.fullmatch(self.region) is None:
            raise UsageError(f"region {self.region!r} is not a region name (letters, "
                             "digits, '-', '_' and '.', at most 64)")
        if _endpoint(self.endpoint, "endpoint") != self.endpoint:
            raise UsageError(f"endpoint {_shown(self.endpoint)}: give it as "
                             "scheme://host[:port][/path], without a trailing slash")

    # -- addressing ---------------------------------------------------------------------
    def is_aws(self) -> bool:
        """True when the endpoint is one of AWS's own S3 endpoints over https."""
        parts = urlsplit(self.endpoint)
        return (parts.scheme == "https" and not parts.path
                and _AWS_HOST.search(parts.hostname or "") is not None)

    def addressing_for(self, bucket: str) -> str:
        """"path" or "virtual": how requests for `bucket` are addressed."""
        if self.addressing != "auto":
            return self.addressing
        return "virtual" if self.is_aws() and _DNS_LABEL.fullmatch(bucket) else "path"

    def bucket_url(self, bucket: str) -> str:
        """The URL ListObjectsV2 goes to, without the query: ENDPOINT/BUCKET (path style)
        or scheme://BUCKET.HOST[:port][/path]/ (virtual-hosted)."""
        _check_bucket(bucket, "bucket")
        if self.addressing_for(bucket) == "virtual":  # every valid name is a DNS name
            parts = urlsplit(self.endpoint)
            return f"{parts.scheme}://{bucket}.{parts.netloc}{parts.path}/"
        return f"{self.endpoint}/{bucket}"

    def object_url(self, bucket: str, key: str) -> str:
        """The URL of `key` in `bucket`. Every byte of the key's UTF-8 but RFC 3986's
        unreserved characters (A-Z a-z 0-9 - _ . ~) and '/' is percent-encoded, once:
        libcurl's SigV4 for the "s3" service signs the path as given (no second encoding,
        http_aws_sigv4.c should_urlencode), which is what S3 expects. Keys from a listing
        that were not valid UTF-8 (surrogate-escaped) are sent as their original bytes.

        Dot segments cannot be sent. libcurl's URL parser removes "." and ".." path
        segments (RFC 3986 5.2.4; since curl 8.13 also their %2e / %2E spellings), so
        "a/../x" would fetch "x" and "a/./b" would fetch "a/b"; CURLOPT_PATH_AS_IS would
        keep them, but libcurl refuses SigV4 with it (since 8.14: "Cannot use sigv4
        authentication with path-as-is flag"). Such a key raises UnsendableKey (a
        ValueError: the fetcher's per-item refusal); the S3 source refuses these names
        before (names.check_name: no '', '.' or '..' component) and parse_s3_url()
        refuses a prefix holding one. Empty segments ("a//b") are sent as they are:
        libcurl keeps them, and S3 does not merge them.
        """
        if not key:
            raise UnsendableKey("empty key")
        if any(part in (".", "..") for part in key.split("/")):
            raise UnsendableKey(f"key {key!r} has a '.' or '..' path segment, which libcurl "
                                "removes from a URL before sending (and signing) it")
        encoded = quote(key.encode("utf-8", "surrogateescape"), safe="/-_.~")
        base = self.bucket_url(bucket)
        return (base if base.endswith("/") else base + "/") + encoded

    # -- signing ------------------------------------------------------------------------
    def sigv4(self) -> str | None:
        """CURLOPT_AWS_SIGV4: provider, region and service always given (libcurl would
        otherwise guess them from the host name); None when unsigned."""
        return None if self.credentials is None else f"aws:amz:{self.region}:s3"

    def userpwd(self) -> str | None:
        """CURLOPT_USERPWD "ACCESS:SECRET". libcurl splits it at the first ':' and keeps
        the rest whole, so a ':' in the secret is signed with as it is (checked: the
        signature libcurl 8.23 sends for "AKID:se:cr:et" is the one for secret "se:cr:et");
        the access key never holds one (S3Credentials refuses it)."""
        if self.credentials is None:
            return None
        return f"{self.credentials.access_key}:{self.credentials.secret_key}"

    def headers(self) -> list[str]:
        """Extra request headers of a signed request: the payload hash S3 wants (a GET has
        no body to hash) and the session token of temporary credentials."""
        if self.credentials is None:
            return []
        found = ["x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        if self.credentials.session_token:
            found.append(f"x-amz-security-token: {self.credentials.session_token}")
        return found

    def describe(self) -> str:
        """Endpoint, region, addressing and where the credentials came from; no secret."""
        def origin(source: str) -> str:
            return f" ({source})" if source else ""

        if self.addressing == "auto":
            style = ("auto addressing: virtual-hosted where the bucket name allows it"
                     if self.is_aws() else "path-style addressing (auto)")
        else:
            style = f"{'virtual-hosted' if self.addressing == 'virtual' else 'path-style'} " \
                    "addressing"
        if self.credentials is None:
            signed = "unsigned requests"
        else:
            temporary = " with a session token" if self.credentials.session_token else ""
            signed = f"signed with credentials from {self.credentials.source or 'the caller'}" \
                     f"{temporary}"
        return (f"endpoint {self.endpoint}{origin(self.endpoint_source)}, region "
                f"{self.region}{origin(self.region_source)}, {style}, {signed}")


# -- s3:// URLs -------------------------------------------------------------------------
def _check_bucket(bucket: str, where: str) -> None:
    if not bucket:
        raise UsageError(f"{where}: no bucket; give s3://BUCKET[/PREFIX]")
    if _BUCKET.fullmatch(bucket) is None:
        raise UsageError(f"{where}: {bucket!r} is not a bucket name (3-63 lower-case "
                         "letters, digits, '.' and '-', starting and ending with a letter "
                         "or digit)")
    if ".." in bucket or _IPV4_LIKE.fullmatch(bucket):
        raise UsageError(f"{where}: {bucket!r} is not a bucket name (it holds '..' or is "
                         "an IP address)")


def parse_s3_url(url: str) -> tuple[str, str]:
    """("bucket", "some/prefix") of "s3://bucket/some/prefix". Everything after the
    bucket's '/' is the prefix, as it is ('?' and '#' are characters of a key here, as in
    the AWS CLI); an empty prefix is the whole bucket. A prefix with a '.' or '..' segment
    is refused: its keys could not be fetched (see S3Settings.object_url)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "s3":
        raise UsageError(f"{url!r} is not an s3://BUCKET[/PREFIX] URL")
    bucket, _, prefix = rest.partition("/")
    _check_bucket(bucket, repr(url))
    if any(part in (".", "..") for part in prefix.split("/")):
        raise UsageError(f"{url!r}: the prefix has a '.' or '..' segment, which cannot be "
                         "sent in a URL unchanged")
    return bucket, prefix


# -- endpoints --------------------------------------------------------------------------
def aws_endpoint(region: str) -> str:
    """AWS's own S3 endpoint of a region."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://s3.{region}.{suffix}"


def _shown(url: str) -> str:
    """An endpoint as a message may show it: no user-info, query or fragment (they may
    hold a password or a token)."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "(not a URL)"
    return repr(f"{parts.scheme}://{host}{parts.path}" if parts.scheme else host + parts.path)


def _endpoint(value: str, where: str) -> str:
    """`value` checked and normalised ("scheme://host[:port][/path]", no trailing slash),
    else a UsageError saying where the bad value came from."""
    if "@" in value:  # user-info: never echoed, whatever else is wrong with the value
        raise UsageError(f"{where}: an endpoint URL must not hold a user name or password "
                         "(credentials come from the environment or a profile)")
    shown = _shown(value)
    if re.search(r"[\s\x00-\x1f\x7f]", value):
        raise UsageError(f"{where} {shown}: an endpoint URL holds no spaces or control "
                         "characters")
    try:
        parts: SplitResult = urlsplit(value)
        port = parts.port
    except ValueError:
        raise UsageError(f"{where} {shown}: not a URL with a valid host and port "
                         "(http://HOST[:PORT] or https://HOST[:PORT])") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{where} {shown}: give http://HOST[:PORT] or https://HOST[:PORT]")
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise UsageError(f"{where} {shown}: an endpoint URL has no query or fragment")
    path = parts.path.rstrip("/")
    if _ENDPOINT_PATH.fullmatch(path) is None or any(
            part.lower() in (".", "..", "%2e", "%2e%2e", ".%2e", "%2e.")
            for part in path.split("/")):
        raise UsageError(f"{where} {shown}: the path may hold only letters, digits, "
                         "'-._~', %XX and '/', and no '.' or '..' segment")
    if port == 0:
        raise UsageError(f"{where} {shown}: port 0")
    return f"{parts.scheme.lower()}://{parts.netloc}{path}"


# -- the shared files -------------------------------------------------------------------
