"""`bulkfetch get s3://BUCKET[/PREFIX] DEST`: the keys under PREFIX, listed with
ListObjectsV2, fetched with GetObject; requests signed with SigV4 by libcurl.

PREFIX names a directory, as `aws s3 cp --recursive` and rclone read it: s3://b/photos lists
the keys under "photos/" and names each file by the rest of its key. A page's token is the
last key of the page before it (ListObjectsV2's `start-after`), not the server's opaque
continuation token: a journaled page is listed again exactly, by any server, at any later
time. Keys come URL-encoded (`encoding-type=url`), so a key XML cannot carry (control
characters) still arrives whole and is refused by the name check like any unsafe name.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import operator
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, unquote_plus

import pycurl

from bulkfetch.config import DEFAULT_MAX_PAGE_SIZE, S3Options, Timeouts, TlsOptions
from bulkfetch.net.curl import (
    header_value,
    new_handle,
    perform_get,
    retry_after_seconds,
    retryable_status,
)
from bulkfetch.s3.profiles import resolve_settings
from bulkfetch.s3.settings import S3Settings, parse_s3_url
from bulkfetch.s3.signer import CHECKSUM_MODE, ObjectSigner
from bulkfetch.sources.abilities import Abilities, KeyRange, RangePage
from bulkfetch.sources.listed import ListedPage, ListingError, listing_transfer_error
from bulkfetch.util.globs import key_filter
from bulkfetch.util.names import all_plain

KEYS_PER_PAGE = 1000  # ListObjectsV2's most
# S3 error codes after which another attempt may succeed, whatever the status says.
_RETRYABLE_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
                    "RequestTimeTooSkewed", "OperationAborted"}
# Codes that are the user's to fix: the run stops at once (exit 2), with what to do.
_USAGE_CODES = {
    "SignatureDoesNotMatch": "the signature does not match: the secret key is wrong for this "
                             "access key (or the endpoint or region is not the store's)",
    "InvalidAccessKeyId": "the store does not know this access key",
    "AccessDenied": "access denied: these credentials may not list the bucket (a public "
                    "bucket needs --no-sign-request)",
    "AllAccessDisabled": "all access to this bucket is disabled",
    "NoSuchBucket": "no such bucket",
    "InvalidBucketName": "not a valid bucket name",
    "AuthorizationHeaderMalformed": "the store refused the authorization header (the region "
                                    "may be wrong: try --region)",
    "PermanentRedirect": "the bucket is in another region or at another endpoint (try "
                         "--region or --endpoint-url)",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is not valid",
}
_REFUSED = "\0\0"  # an item "name NUL NUL reason": a key resolve() refuses, with why


class S3ListingRefused(ListingError):
    """The store refused the listing for a reason the user must fix (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False, usage=True)


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _error_fields(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an S3 error body; ("", "") when it is not one."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return "", ""
    found = {_local(child.tag): (child.text or "") for child in root}
    return found.get("Code", ""), found.get("Message", "")


_LISTING_START = re.compile(r'\s*(?:<\?xml[^>]*\?>\s*)?<ListBucketResult(?:\s[^>]*)?>')
_KEY = re.compile(r"<Key>([^<&]*)</Key>")
_SIZE = re.compile(r"<Size>([0-9]{1,20})</Size>")
_TRUNCATED = re.compile(r"<IsTruncated>\s*(true|false)\s*</IsTruncated>")
_URL_ENCODED = "<EncodingType>url</EncodingType>"
_KEY_COUNT = re.compile(r"<KeyCount>([0-9]{1,9})</KeyCount>")
# An ETag's MD5 when it is one (32 hex digits, quotes escaped or not), "" when it is not (a
# multipart upload's "<hex>-<parts>", an SSE-KMS object's): one group, read per key in C.
_ETAG = re.compile(r'<ETag>(?:&quot;|&#34;|")?(?:([0-9a-fA-F]{32})(?:&quot;|&#34;|")?'
                   r'</ETag>|[^<]*</ETag>)')
_MD5_HEX = re.compile(r"[0-9a-fA-F]{32}")


def listed_md5s(etags: list[str], count: int) -> list[str] | None:
    """The MD5s (lower-case hex, "": none) of `count` keys whose ETags a listing gave, or
    None when it did not give one per key."""
    if len(etags) != count:
        return None
    joined = "".join(etags)
    return etags if joined == joined.lower() else [etag.lower() for etag in etags]


def md5_of_etag(etag: str) -> str:
    """The MD5 an ETag's text states (quotes stripped), or ""."""
    tag = etag.strip().strip('"')
    return tag.lower() if _MD5_HEX.fullmatch(tag) else ""


# What a ListObjectsV2 answer says: its keys as listed, their sizes, their MD5s (None: not
# one ETag per key), whether more follow, and whether the keys are URL-encoded.
Listing = tuple[list[str], list[int], list[str] | None, bool, bool]


def _plain_listing(body: bytes) -> Listing | None:
    """(keys as listed, sizes, MD5s, more follow, keys URL-encoded) of a ListObjectsV2 answer in
    the shape every store sends for encoding-type=url: ASCII, each <Contents> with one
    <Key> holding no entity and one <Size>. A fifth of a full XML parse's cost (this is
    what a listing spends its CPU on); None for anything else (CDATA, entities, a missing
    Size), which the full parse reads or refuses."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return None
    if (_LISTING_START.match(text) is None or not text.rstrip().endswith("</ListBucketResult>")
            or _URL_ENCODED not in text):
        return None
    at = text.find("<IsTruncated>")
    truncated = _TRUNCATED.match(text, at) if at >= 0 else None
    if truncated is None:
        return None
    keys, sizes = _KEY.findall(text), _SIZE.findall(text)
    count = len(keys)
    # A Key or Size these patterns do not take (an entity, CDATA) leaves the page short of
    # the keys ListObjectsV2 says it holds (KeyCount, near the top: no scan of the page; no
    # delimiter is sent, so no common prefix counts). A comment could hold a whole
    # Contents, read as one more key: a store can list any key anyway, and every name is
    # checked before anything is written.
    stated = _KEY_COUNT.search(text)
    if len(sizes) != count or (int(stated[1]) if stated else text.count("<Contents")) != count:
        return None
    return (keys, list(map(int, sizes)), listed_md5s(_ETAG.findall(text), count),
            truncated[1] == "true", True)


class S3Source:
    def __init__(self, url: str, options: S3Options, timeouts: Timeouts,
                 max_page_size: int = DEFAULT_MAX_PAGE_SIZE,
                 settings: S3Settings | None = None, tls: TlsOptions | None = None) -> None:
        self.url = url
        self.tls = tls or TlsOptions()
        self.bucket, prefix = parse_s3_url(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.settings = settings or resolve_settings(
            endpoint_url=options.endpoint_url, region=options.region, profile=options.profile,
            no_sign_request=options.no_sign_request, addressing=options.addressing)
        self.timeouts = timeouts
        self.max_page_size = max_page_size
        self.taken = key_filter(options.include, options.exclude)
        self._handle: pycurl.Curl | None = None
        self._list_base = self.settings.bucket_url(self.bucket)
        # object_url(bucket, prefix + name) == this + name for a plain name (no quoting)
        self._object_base = self.settings.object_url(self.bucket, self.prefix + "x")[:-1]
        self._url_format = self._object_base.replace("%", "%%") + "%s"

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} ({self.settings.describe()})"

    def abilities(self) -> Abilities:
        """Every object request asks for the object's stored checksum (x-amz-checksum-*):
        an object uploaded in parts has no MD5 ETag, and is checked by that
        (engine/digests.py), its layout asked by layout_request. A signed source's headers
        come per request (s3/signer.py: a few us where libcurl's signer takes 15), and it
        follows no redirect: libcurl would send them (the session token among them) to any
        host a 3xx names; S3 redirects only to say the bucket is elsewhere, a failure to
        name, not a hop to follow. Its keys are listed in ranges at once."""
        credentials = self.settings.credentials
        if credentials is None:
            return Abilities(curl_options=((pycurl.HTTPHEADER, [CHECKSUM_MODE]),),
                             layout_request=self.layout_request, ranges=self)
        signer = ObjectSigner(credentials, self.settings.region, self._object_base)
        return Abilities(curl_options=((pycurl.FOLLOWLOCATION, 0),),
                         request_headers=signer.headers, layout_request=self.layout_request,
                         ranges=self)

    def layout_request(self, url: str) -> tuple[str, list[str]]:
        """The URL and headers of `HEAD url?partNumber=1`, which gives the size of an
        object's first part and the number of its parts: how an object uploaded in parts
        is checked whole (engine/multipart.py)."""
        probe = url + "?partNumber=1"
        credentials = self.settings.credentials
        if credentials is None:
            return probe, [CHECKSUM_MODE]
        signer = ObjectSigner(credentials, self.settings.region, self._object_base)
        return probe, signer.headers_for("HEAD", probe)

    def _list_options(self) -> list[tuple[int, Any]]:
        """A listing request is signed by libcurl (CURLOPT_AWS_SIGV4): its query has to
        be canonicalised, and a thousand keys share each one."""
        sigv4, userpwd = self.settings.sigv4(), self.settings.userpwd()
        if sigv4 is None or userpwd is None:
            return []
        return [(pycurl.AWS_SIGV4, sigv4), (pycurl.USERPWD, userpwd),
                (pycurl.HTTPHEADER, self.settings.headers()), (pycurl.FOLLOWLOCATION, 0)]

    # -- items -------------------------------------------------------------------------
    def resolve(self, item: str) -> tuple[str, str]:
        name, refused, reason = item.partition(_REFUSED)
        if refused:
            raise ValueError(reason)
        return name, self.settings.object_url(self.bucket, self.prefix + name)

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        if not all_plain(items):
            return None
        return map(self._url_format.__mod__, items)

    # -- listing -----------------------------------------------------------------------
    def list_url(self, after: str | None) -> str:
        query = [("encoding-type", "url"), ("list-type", "2"),
                 ("max-keys", str(KEYS_PER_PAGE)), ("prefix", self.prefix)]
        if after is not None:
            query.append(("start-after", after))
        # a token from an undecodable key holds surrogates: its bytes go back as they came
        return self._list_base + "?" + "&".join(
            f"{name}={quote(value.encode('utf-8', 'surrogateescape'), safe='-_.~')}"
            for name, value in query)

    def list_page(self, token: str | None) -> ListedPage:
        """The Source protocol's sequential listing: the token is the last key listed."""
        page = self.list_range(KeyRange(token, None))
        return ListedPage(page.items, page.keys[-1] if page.more else None,
                          sizes=page.sizes, md5s=page.md5s)

    def list_range(self, span: KeyRange) -> RangePage:
        """The first page of the keys in `span` (full keys: the prefix included)."""
        return self.range_page(span, *self._get(self.range_url(span)))

    # -- the same, a request at a time on handles a curl multi drives (range_lister.py) --
    def range_url(self, span: KeyRange) -> str:
        return self.list_url(span.after)

    def list_handle(self) -> pycurl.Curl:
        """A handle for listing requests: TLS, timeouts, page size limit and signing set."""
        handle = new_handle(self.timeouts, self.tls)
        handle.setopt(pycurl.MAXFILESIZE_LARGE, self.max_page_size)
        for option, value in self._list_options():
            handle.setopt(option, value)
        return handle

    def range_page(self, span: KeyRange, status: int, headers: list[bytes],
                   body: bytes) -> RangePage:
        """The page of `span` in a list answer (the last response's status and headers).
        Raises ListingError."""
        where = f"listing s3://{self.bucket}/{self.prefix}"
        if status != 200:
            code, message = _error_fields(body)
            if code in _USAGE_CODES and code not in _RETRYABLE_CODES:
                detail = f" ({message})" if message and message != code else ""
                raise S3ListingRefused(f"{where}: HTTP {status} {code}: {_USAGE_CODES[code]}"
                                       f"{detail}")
            retry_after = retry_after_seconds(header_value(headers, b"retry-after"))
            named = f" {code}" if code else ""
            raise ListingError(f"{where}: HTTP {status}{named}",
                               retryable_status(status) or code in _RETRYABLE_CODES,
                               retry_after)
        keys, sizes, md5s, truncated = self._keys(body, where)
        if span.after is not None and keys and keys[0] <= span.after:
            raise ListingError(f"{where}: asked for keys after {span.after!r}, the store "
                               f"listed {keys[0]!r}", retryable=False)
        more = truncated
        if span.upto is not None and keys and keys[-1] > span.upto:
            keys = keys[:bisect.bisect_right(keys, span.upto)]
            more = False
        if len(keys) < len(sizes):  # cut at span.upto: the sizes and MD5s with them
            sizes = sizes[:len(keys)]
            md5s = md5s[:len(keys)] if md5s is not None else None
        items, item_sizes, item_md5s, plain = self._items(keys, sizes, md5s, where)
        return RangePage(items, tuple(keys), more, sizes=item_sizes, md5s=item_md5s,
                         plain=plain)

    def transfer_error(self, code: int, message: str, url: str) -> ListingError:
        """What a list request libcurl failed with (`url`: where it went) means."""
        return listing_transfer_error(code, message, url,
                                      f"listing s3://{self.bucket}/{self.prefix}",
                                      self.max_page_size, self.tls)

    def clone(self) -> S3Source:
        twin = copy.copy(self)
        twin._handle = None
        return twin

    def _keys(self, body: bytes, where: str
              ) -> tuple[list[str], list[int], list[str] | None, bool]:
        """The keys of a ListObjectsV2 answer (decoded), their sizes, their MD5s, and
        whether more follow."""
        found = _plain_listing(body)
        if found is not None:
            raw, sizes, md5s, truncated, encoded = found
        else:
            raw, sizes, md5s, truncated, encoded = self._parsed_listing(body, where)
        if truncated and not raw:
            raise ListingError(f"{where}: the store says more keys follow but listed none",
                               retryable=False)
        # An undecodable key keeps its bytes as surrogates: resolve() refuses it
        keys = raw
        if encoded and ("%" in (joined := "".join(raw)) or "+" in joined):
            keys = [unquote_plus(key, errors="surrogateescape") for key in raw]
        if not all(map(operator.lt, keys, itertools.islice(keys, 1, None))):  # in C
            raise ListingError(f"{where}: the store listed keys out of order",
                               retryable=False)
        return keys, sizes, md5s, truncated

    @staticmethod
    def _parsed_listing(body: bytes, where: str) -> Listing:
        """What _plain_listing finds, by a full XML parse: any answer, 4 us a key."""
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as exc:
            raise ListingError(f"{where}: malformed XML ({exc})", retryable=True) from None
        if _local(root.tag) != "ListBucketResult":
            raise ListingError(f"{where}: not a ListBucketResult but {_local(root.tag)!r}",
                               retryable=False)
        encoded = truncated = False
        raw: list[str] = []
        sizes: list[int] = []
        etags: list[str] = []
        for child in root:
            tag = _local(child.tag)
            if tag == "Contents":
                key, size, etag = None, -1, None
                for field in child:
                    name = _local(field.tag)
                    if name == "Key":
                        key = field.text or ""
                    elif name == "Size" and (field.text or "").isdigit():
                        size = int(field.text or "")
                    elif name == "ETag":
                        etag = md5_of_etag(field.text or "")
                if key is None:
                    raise ListingError(f"{where}: an object without a Key", retryable=False)
                raw.append(key)
                sizes.append(size)
                if etag is not None:
                    etags.append(etag)
            elif tag == "IsTruncated":
                truncated = (child.text or "").strip() == "true"
            elif tag == "EncodingType":
                encoded = (child.text or "").strip() == "url"
        return raw, sizes, listed_md5s(etags, len(raw)), truncated, encoded

    def _items(self, keys: list[str], sizes: list[int], md5s: list[str] | None, where: str
               ) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...] | None, bool]:
        """The items to fetch (names under the prefix, refused ones marked), their sizes
        (-1: not listed), their MD5s (None: not listed), and whether every item is a plain
        name."""
        prefix, skip, taken = self.prefix, len(self.prefix), self.taken
        if taken is None and keys and keys[0].startswith(prefix) \
                and keys[-1].startswith(prefix) and all_plain(keys):
            # Sorted keys that begin and end with the prefix all hold it; plain keys are
            # neither empty nor directory markers nor anything but ASCII: the common page.
            names = keys if not skip else [key[skip:] for key in keys]
            if all(names):
                return tuple(names), tuple(sizes), tuple(md5s) if md5s else None, True
        items: list[str] = []
        item_sizes: list[int] = []
        item_md5s: list[str] = []
        for key, size, md5 in zip(keys, sizes, md5s or itertools.repeat(""), strict=False):
            if not key.startswith(prefix):
                raise ListingError(f"{where}: the store listed {key!r}, which is not under "
                                   "the prefix asked for", retryable=False)
            name = key[skip:]
            if not name or name.endswith("/"):  # a "directory" marker object
                continue
            if taken is not None and not taken(name):
                continue
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                items.append(f"{name.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')}"
                             f"{_REFUSED}its key is not UTF-8")
            else:
                items.append(name)
            item_sizes.append(size)
            item_md5s.append(md5)
        return (tuple(items), tuple(item_sizes), tuple(item_md5s) if md5s else None,
                False)

    def _get(self, url: str) -> tuple[int, list[bytes], bytes]:
        if self._handle is None:
            self._handle = self.list_handle()
        handle = self._handle
        try:
            return perform_get(handle, url)
        except pycurl.error as exc:
            code, message = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
            raise self.transfer_error(code, message, handle.getinfo(pycurl.EFFECTIVE_URL)
                                      or url) from None
