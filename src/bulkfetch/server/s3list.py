"""ListObjectsV2 (and V1) over a data set, as S3 answers them: keys in UTF-8 byte order,
prefix, delimiter and common prefixes, start-after, continuation tokens, max-keys and
encoding-type=url. No sockets and no HTTP here: parameters in, XML bytes out.

Keys are found by bisection, so any page is as cheap as the first: the plain synthetic data
set is indexed without storing a name (name(i) grows with i), any other data set by its
names sorted once, on the first listing."""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote_plus
from xml.sax.saxutils import escape

from bulkfetch.server.dataset import DataSet, SyntheticDataSet, SyntheticNames, every_name

MAX_KEYS = 1000  # S3's most keys (and common prefixes) a page
XML_HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n'
NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
TOKEN_PREFIX = "bf1:"  # continuation tokens: this, then the marker, base64url
_QUOTE = {'"': "&quot;"}


class BadListRequest(ValueError):
    """A parameter S3 would refuse with 400 InvalidArgument."""


# The <Contents> elements of a page: each listed key with its size, ETag and Last-Modified.
Contents = Callable[["Listed", bool], str]
BLOCK = 1000  # keys of a plain synthetic set rendered (and kept) together
BLOCKS_KEPT = 1100  # blocks kept rendered: a million keys, ~200 MB


# name -> what a listing misstates of it ("etag", "size") or None: serve --stale-rate
Stale = Callable[[str], "str | None"]


def misstated(size: int, etag: str, kind: str | None) -> tuple[int, str]:
    """The size and ETag a listing states of an object that changed after it was listed
    (`kind`: FaultPlan.stale()'s answer): another ETag, and for "size" another size."""
    if kind is None:
        return size, etag
    return size + (kind == "size"), '"' + hashlib.md5(etag.encode()).hexdigest() + '"'


def contents_element(key: str, size: int, etag: str, modified: int, url_encoded: bool) -> str:
    return (f"<Contents><Key>{_text(key, url_encoded)}</Key>"
            f"<LastModified>{_iso(modified)}</LastModified>"
            f"<ETag>{escape(etag, _QUOTE)}</ETag>"
            f"<Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>")


class _FlatNames(SyntheticNames):
    """The names of a plain synthetic data set in key order, without storing any: name(i)
    is 'f' and i zero-padded, so key order is index order. Listings are rendered a block
    of keys at a time and the last BLOCKS_KEPT blocks kept, so listing again costs no
    hashing: benchmarks of clients list the same keys many times and must measure the
    client, not this server. (The names are plain: encoded or not, the text is the same.)"""

    def __init__(self, dataset: SyntheticDataSet, stale: Stale | None = None) -> None:
        super().__init__(dataset)
        self.stale = stale
        self._blocks: OrderedDict[int, tuple[str, list[int]]] = OrderedDict()

    def contents(self, listed: Listed, url_encoded: bool) -> str:
        positions = listed.positions
        if not positions:
            return ""
        low, high = positions[0], positions[-1] + 1
        if high - low != len(positions):  # keys rolled into common prefixes between
            return "".join(self._element(i) for i in positions)
        pieces = []
        for number in range(low // BLOCK, (high - 1) // BLOCK + 1):
            text, offsets = self._block(number)
            start = number * BLOCK
            pieces.append(text[offsets[max(low, start) - start]:
                               offsets[min(high, start + BLOCK) - start]])
        return "".join(pieces)

    def _element(self, index: int) -> str:
        dataset = self.dataset
        size = dataset.size(index)
        version = dataset.version(index)  # --epoch/--mutate-rate: what a GET serves now
        etag = f'"{hashlib.md5(dataset.chunk_body(index, size, version)).hexdigest()}"'
        name = dataset.name(index)
        if self.stale is not None:
            size, etag = misstated(size, etag, self.stale(name))
        return contents_element(name, size, etag, dataset.modified(version), False)

    def _block(self, number: int) -> tuple[str, list[int]]:
        found = self._blocks.get(number)
        if found is not None:
            self._blocks.move_to_end(number)
            return found
        elements = [self._element(i) for i in range(number * BLOCK,
                                                     min(len(self), (number + 1) * BLOCK))]
        offsets = [0, *itertools.accumulate(map(len, elements))]
        found = self._blocks[number] = ("".join(elements), offsets)
        if len(self._blocks) > BLOCKS_KEPT:
            self._blocks.popitem(last=False)
        return found


def sorted_keys(dataset: DataSet, stale: Stale | None = None
                ) -> tuple[Sequence[str], Contents]:
    """Every name of `dataset`, in S3 key order (code point order is UTF-8 byte order), and
    what a listing says of each (misstated for the names `stale` picks)."""
    if isinstance(dataset, SyntheticDataSet) and not dataset.nested:
        flat = _FlatNames(dataset, stale)
        return flat, flat.contents
    names = every_name(dataset)

    def contents(listed: Listed, url_encoded: bool) -> str:
        out = []
        for key in listed.keys:
            entry = dataset.lookup(key)
            if entry is not None:  # else gone since the names were sorted (a --root file)
                size, etag = entry.size, entry.etag()
                if stale is not None:
                    size, etag = misstated(size, etag, stale(key))
                out.append(contents_element(key, size, etag, entry.last_modified,
                                            url_encoded))
        return "".join(out)

    return sorted(set(names)), contents


def encode_token(marker: str) -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(
        marker.encode("utf-8", "surrogatepass")).decode("ascii")


def decode_token(token: str) -> str:
    if not token.startswith(TOKEN_PREFIX):
        raise BadListRequest("The continuation token provided is incorrect")
    try:
        return base64.b64decode(token[len(TOKEN_PREFIX):].encode("ascii"), altchars=b"-_",
                                validate=True).decode("utf-8", "surrogatepass")
    except (binascii.Error, UnicodeError, ValueError):
        raise BadListRequest("The continuation token provided is incorrect") from None


@dataclass(frozen=True)
class ListRequest:
    version: int = 2  # 1: ListObjects (marker), 2: ListObjectsV2
    prefix: str = ""
    delimiter: str = ""
    after: str = ""  # V2 start-after, V1 marker
    token: str | None = None  # V2 continuation-token, as sent
    max_keys: int = MAX_KEYS
    url_encoded: bool = False

    @classmethod
    def from_query(cls, params: dict[str, str]) -> ListRequest:
        version = 2 if params.get("list-type") == "2" else 1
        raw_max = params.get("max-keys", str(MAX_KEYS))
        if not raw_max.isascii() or not raw_max.isdigit():
            raise BadListRequest("Provided max-keys not an integer or within integer range")
        encoding = params.get("encoding-type")
        if encoding not in (None, "url"):
            raise BadListRequest("Invalid Encoding Method specified in Request")
        after = params.get("start-after", "") if version == 2 else params.get("marker", "")
        return cls(version, params.get("prefix", ""), params.get("delimiter", ""), after,
                   params.get("continuation-token") if version == 2 else None,
                   min(int(raw_max), MAX_KEYS), encoding == "url")


@dataclass
class Listed:
    keys: Sequence[str]
    positions: Sequence[int]  # of each key in the sorted keys
    prefixes: list[str]
    truncated: bool
    last: str  # the last key or common prefix listed: where the next page starts after


class _KeyView(Sequence[str]):
    """keys[span], read only where asked (a page of a plain synthetic set never is)."""

    def __init__(self, keys: Sequence[str], span: range) -> None:
        self.keys, self.span = keys, span

    def __len__(self) -> int:
        return len(self.span)

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [self.keys[i] for i in self.span[index]]
        return self.keys[self.span[index]]


def list_keys(keys: Sequence[str], request: ListRequest) -> Listed:
    """The page `request` asks for. A common prefix not after the start (start-after,
    marker or token) is not listed again, nor any key under it, as S3 does."""
    after = decode_token(request.token) if request.token is not None else request.after
    prefix, delimiter = request.prefix, request.delimiter
    position = max(bisect.bisect_left(keys, prefix), bisect.bisect_right(keys, after))
    if not delimiter:  # the keys from here on, up to the first not under the prefix
        end = bisect.bisect_left(keys, _successor(prefix), position) if prefix else len(keys)
        stop = min(end, position + request.max_keys)
        span = range(position, stop)
        return Listed(_KeyView(keys, span), span, [], stop < end and request.max_keys > 0,
                      keys[stop - 1] if stop > position else "")
    found: list[str] = []
    positions: list[int] = []
    prefixes: list[str] = []
    last = ""
    total = len(keys)
    while position < total and len(found) + len(prefixes) < request.max_keys:
        key = keys[position]
        if not key.startswith(prefix):
            break
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            found.append(key)
            positions.append(position)
            last = key
            position += 1
            continue
        common = key[: cut + len(delimiter)]
        if common > after:
            prefixes.append(common)
            last = common
        position = bisect.bisect_left(keys, _successor(common), position)
    truncated = (position < total and keys[position].startswith(prefix)
                 and request.max_keys > 0)
    return Listed(found, positions, prefixes, truncated, last)


def _successor(prefix: str) -> str:
    """The least string greater than every string starting with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _text(value: str, url_encoded: bool) -> str:
    if url_encoded:
        return quote_plus(value, safe="/", errors="surrogatepass")
    return escape(value)


def _iso(epoch: int, cache: dict[int, str] = {}) -> str:  # noqa: B006  (a deliberate cache)
    found = cache.get(epoch)
    if found is None:
        found = cache[epoch] = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch))
    return found


def render_list(bucket: str, request: ListRequest, listed: Listed, contents: Contents) -> bytes:
    """The ListBucketResult of `listed`: each key with its size, ETag and Last-Modified."""
    enc = request.url_encoded
    out = [f'<ListBucketResult xmlns="{NAMESPACE}"><Name>{escape(bucket)}</Name>'
           f"<Prefix>{_text(request.prefix, enc)}</Prefix>"]
    if request.version == 2:
        out.append(f"<KeyCount>{len(listed.keys) + len(listed.prefixes)}</KeyCount>")
    else:
        out.append(f"<Marker>{_text(request.after, enc)}</Marker>")
    out.append(f"<MaxKeys>{request.max_keys}</MaxKeys>")
    if request.delimiter:
        out.append(f"<Delimiter>{_text(request.delimiter, enc)}</Delimiter>")
    out.append(f"<IsTruncated>{'true' if listed.truncated else 'false'}</IsTruncated>")
    if enc:
        out.append("<EncodingType>url</EncodingType>")
    if request.version == 2:
        if request.token is not None:
            out.append(f"<ContinuationToken>{escape(request.token)}</ContinuationToken>")
        if listed.truncated:
            out.append(f"<NextContinuationToken>{encode_token(listed.last)}"
                       "</NextContinuationToken>")
        if request.after:
            out.append(f"<StartAfter>{_text(request.after, enc)}</StartAfter>")
    elif listed.truncated and request.delimiter:  # V1 sends NextMarker only with a delimiter
        out.append(f"<NextMarker>{_text(listed.last, enc)}</NextMarker>")
    out.append(contents(listed, enc))
    for common in listed.prefixes:
        out.append(f"<CommonPrefixes><Prefix>{_text(common, enc)}</Prefix></CommonPrefixes>")
    out.append("</ListBucketResult>")
    return XML_HEAD + "".join(out).encode("utf-8", "surrogatepass")
