"""What big-file clients are tested against, through App.handle (no sockets): Repr-Digest,
--ignore-ranges, --wrong-content-range and --etag-salt."""

from __future__ import annotations

import base64
import hashlib
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from urllib.parse import quote

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.server.app import App, Response, repr_digest, shifted_range
from bulkfetch.server.dataset import (
    CHUNK,
    EPOCH_2025,
    SMALL_BODY,
    DigestCache,
    SyntheticDataSet,
    SyntheticEntry,
)
from bulkfetch.server.export import export_static
from bulkfetch.server.hostile import HostileNames, hostile_body
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.server.tree import FileTree
from bulkfetch.util.sizes import parse_size_spec

NAME = "f0000000004"
LARGE = 3 * CHUNK + 1234 + SMALL_BODY  # streamed, over many chunks, not a multiple of CHUNK


def dataset(size: int | str = 1000, files: int = 20, salt: str = "",
            seed: int = 0) -> SyntheticDataSet:
    return SyntheticDataSet(files, 10, seed, parse_size_spec(str(size)), salt=salt)


def request(app: App, target: str, method: str = "GET", **headers: str) -> Response:
    return app.handle(method, target, {k.replace("_", "-").lower(): v for k, v in headers.items()})


def header(response: Response, name: str) -> str | None:
    values = [v for k, v in response.headers if k.lower() == name.lower()]
    assert len(values) <= 1, values
    return values[0] if values else None


def body(response: Response) -> bytes:
    return b"".join(response.chunks) if response.chunks is not None else response.body


def formula_body(seed: int, index: int, size: int, salt: str = "") -> bytes:
    """The documented formula of dataset.py, written out here independently."""
    tail = f"/{salt}" if salt else ""
    parts = []
    for k in range(-(-size // 65536)):
        want = min(65536, size - k * 65536)
        parts.append(hashlib.shake_128(f"bulkfetch/{seed}/{index}/{k}{tail}".encode())
                     .digest(want))
    return b"".join(parts)


def expected_digest(data: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def parse_content_range(value: str) -> tuple[int, int, int]:
    unit, _, spec = value.partition(" ")
    assert unit == "bytes", value
    span, _, total = spec.partition("/")
    first, _, last = span.partition("-")
    return int(first), int(last) + 1, int(total)


# -- Repr-Digest -------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 1000, CHUNK + 5, LARGE])
def test_repr_digest_is_the_sha256_of_the_whole_body_on_200_206_and_head(size: int) -> None:
    data = dataset(size)
    app = App(data, digest_header=True)
    whole = formula_body(0, 4, size)
    want = expected_digest(whole)
    full = request(app, "/get/" + NAME)
    assert full.status == 200 and body(full) == whole
    assert header(full, "Repr-Digest") == want
    head = request(app, "/get/" + NAME, "HEAD")
    assert head.status == 200 and head.content_length == size
    assert header(head, "Repr-Digest") == want
    if size >= 2:
        part = request(app, "/get/" + NAME, range=f"bytes=1-{size // 2}")
        assert part.status == 206 and body(part) == whole[1 : size // 2 + 1]
        assert header(part, "Repr-Digest") == want  # the representation's, not the part's
        assert header(request(app, "/get/" + NAME, "HEAD", range="bytes=-1"),
                      "Repr-Digest") == want


def test_repr_digest_syntax_is_an_sf_byte_sequence() -> None:
    value = repr_digest(hashlib.sha256(b"abc").digest())
    assert value == "sha-256=:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=:"
    key, _, member = value.partition("=")
    assert key == "sha-256" and member.startswith(":") and member.endswith(":")
    assert base64.b64decode(member[1:-1], validate=True) == hashlib.sha256(b"abc").digest()


def test_no_repr_digest_unless_asked_and_none_on_304_or_416() -> None:
    plain = request(App(dataset()), "/get/" + NAME)
    assert plain.status == 200 and header(plain, "Repr-Digest") is None
    app = App(dataset(), digest_header=True)
    etag = header(request(app, "/get/" + NAME), "ETag")
    assert etag is not None
    not_modified = request(app, "/get/" + NAME, if_none_match=etag)
    assert not_modified.status == 304 and header(not_modified, "Repr-Digest") is None
    unsatisfiable = request(app, "/get/" + NAME, range="bytes=5000-")
    assert unsatisfiable.status == 416 and header(unsatisfiable, "Repr-Digest") is None


def test_a_large_body_is_generated_once_for_md5_and_sha256_then_cached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = dataset(LARGE)
    chunks = -(-LARGE // CHUNK)
    calls: list[int] = []
    real_chunk = data.chunk

    def counting(index: int, k: int, length: int) -> bytes:
        calls.append(k)
        return real_chunk(index, k, length)

    monkeypatch.setattr(data, "chunk", counting)
    app = App(data, digest_header=True)
    response = request(app, "/get/" + NAME)
    assert response.chunks is not None  # streamed: nothing of the body generated yet
    assert sorted(calls) == list(range(chunks))  # one pass gave both the ETag and the digest
    whole = formula_body(0, 4, LARGE)
    assert header(response, "ETag") == '"' + hashlib.md5(whole).hexdigest() + '"'
    assert header(response, "Repr-Digest") == expected_digest(whole)
    calls.clear()
    again = request(app, "/get/" + NAME, "HEAD")
    assert calls == [] and header(again, "Repr-Digest") == expected_digest(whole)
    ranged = request(app, "/get/" + NAME, range="bytes=0-9")
    assert calls == [0] and header(ranged, "Repr-Digest") == expected_digest(whole)


def test_without_the_digest_header_no_sha256_is_computed() -> None:
    data = dataset(LARGE)
    request(App(data), "/get/" + NAME, "HEAD")
    known = data.etags.get(4)
    assert known is not None and known.sha256 is None


def test_a_cached_etag_alone_gets_its_sha256_in_one_more_pass() -> None:
    data = dataset(LARGE)
    entry = data.lookup(NAME)
    assert isinstance(entry, SyntheticEntry)
    whole = formula_body(0, 4, LARGE)
    assert entry.etag() == '"' + hashlib.md5(whole).hexdigest() + '"'
    assert entry.sha256() == hashlib.sha256(whole).digest()
    assert data.etags.get(4) is not None and data.etags.get(4).sha256 is not None  # type: ignore[union-attr]


def test_digest_cache_drops_the_least_recently_used() -> None:
    cache = DigestCache(capacity=2)
    made: list[str] = []

    def chunks_of(text: str):  # type: ignore[no-untyped-def]
        def chunks():  # type: ignore[no-untyped-def]
            made.append(text)
            return iter([text.encode()])
        return chunks

    for key in ("a", "b", "a", "c", "a", "b"):
        assert cache.digests(key, chunks_of(key), sha256=False).etag == (
            '"' + hashlib.md5(key.encode()).hexdigest() + '"')
    assert made == ["a", "b", "c", "b"]  # "a" kept as the most recently used, "b" dropped


def test_digest_header_on_a_real_directory(tmp_path: Path) -> None:
    big = bytes(range(256)) * 9000  # over the 1 MiB read size of the tree
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "big.bin").write_bytes(big)
    (tmp_path / "small.txt").write_bytes(b"hello\n")
    app = App(FileTree(str(tmp_path), 10), digest_header=True)
    for name, data in (("sub/big.bin", big), ("small.txt", b"hello\n")):
        response = request(app, "/get/" + quote(name))
        assert response.status == 200 and body(response) == data
        assert header(response, "Repr-Digest") == expected_digest(data)
        assert header(response, "ETag") == '"' + hashlib.md5(data).hexdigest() + '"'
    # a rewritten file is a new cache key: new digests, not stale ones
    (tmp_path / "small.txt").write_bytes(b"changed, and longer\n")
    response = request(app, "/get/small.txt", "HEAD")
    assert header(response, "Repr-Digest") == expected_digest(b"changed, and longer\n")


# -- --ignore-ranges --------------------------------------------------------------------
@pytest.mark.parametrize("size", [1000, LARGE])
@pytest.mark.parametrize("value", ["bytes=0-9", "bytes=100-", "bytes=-5", "bytes=5000000-"])
def test_ignore_ranges_answers_200_with_the_whole_body_and_still_lures(size: int,
                                                                       value: str) -> None:
    app = App(dataset(size), ignore_ranges=True)
    whole = formula_body(0, 4, size)
    response = request(app, "/get/" + NAME, range=value)
    assert response.status == 200
    assert body(response) == whole and response.content_length == size
    assert header(response, "Content-Range") is None
    assert header(response, "Accept-Ranges") == "bytes"
    etag = header(response, "ETag")
    assert etag is not None
    with_validator = request(app, "/get/" + NAME, range=value, if_range=etag)
    assert with_validator.status == 200 and body(with_validator) == whole
    head = request(app, "/get/" + NAME, "HEAD", range=value)
    assert head.status == 200 and head.content_length == size
    assert header(head, "Accept-Ranges") == "bytes"


def test_ranges_are_honoured_by_default() -> None:
    response = request(App(dataset()), "/get/" + NAME, range="bytes=0-9")
    assert response.status == 206 and len(response.body) == 10


# -- --wrong-content-range --------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "stop", "size", "sent"),
    [
        (0, 10, 100, (10, 20)),  # the next range of the same length
        (90, 95, 100, (95, 100)),
        (80, 95, 100, (95, 100)),  # cut at the end of the body
        (90, 100, 100, (80, 90)),  # ends the body: the one before it
        (5, 100, 100, (0, 5)),  # ... cut at the start
        (0, 100, 100, (1, 100)),  # the whole body: bytes 1 to the end
        (0, 1, 1, (0, 1)),  # a 1-byte body has no other range
    ],
)
def test_shifted_range(start: int, stop: int, size: int, sent: tuple[int, int]) -> None:
    assert shifted_range(start, stop, size) == sent


@pytest.mark.parametrize("size", [1000, LARGE])
@pytest.mark.parametrize("value", ["bytes=0-99", "bytes=100-199", "bytes=900-", "bytes=-10",
                                   "bytes=0-", "bytes=5-5"])
def test_wrong_content_range_sends_another_range_labelled_as_such(size: int, value: str) -> None:
    app = App(dataset(size), wrong_content_range=True)
    whole = formula_body(0, 4, size)
    honest = request(App(dataset(size)), "/get/" + NAME, range=value)
    asked = header(honest, "Content-Range")
    assert honest.status == 206 and asked is not None
    response = request(app, "/get/" + NAME, range=value)
    assert response.status == 206
    labelled = header(response, "Content-Range")
    assert labelled is not None and labelled != asked
    start, stop, total = parse_content_range(labelled)
    assert total == size
    assert body(response) == whole[start:stop]  # truthful about what it sends...
    assert response.content_length == stop - start
    assert body(response) != body(honest)  # ...which is not what was asked for
    head = request(app, "/get/" + NAME, "HEAD", range=value)
    assert header(head, "Content-Range") == labelled


def test_wrong_content_range_leaves_whole_answers_and_416_alone() -> None:
    app = App(dataset(), wrong_content_range=True)
    whole = request(app, "/get/" + NAME)
    assert whole.status == 200 and whole.body == formula_body(0, 4, 1000)
    assert request(app, "/get/" + NAME, range="bytes=1000-").status == 416
    stale = request(app, "/get/" + NAME, range="bytes=0-9", if_range='"stale"')
    assert stale.status == 200 and len(stale.body) == 1000


# -- --etag-salt ------------------------------------------------------------------------
def test_no_salt_keeps_the_documented_formula_byte_for_byte() -> None:
    for size in (100, LARGE):
        default = SyntheticDataSet(20, 10, 7, parse_size_spec(str(size)))
        empty = SyntheticDataSet(20, 10, 7, parse_size_spec(str(size)), salt="")
        for data in (default, empty):
            assert data.body(3) == formula_body(7, 3, size)
            assert data.last_modified == EPOCH_2025
            response = request(App(data), "/get/f0000000003")
            assert body(response) == formula_body(7, 3, size)
            assert header(response, "Last-Modified") == formatdate(EPOCH_2025, usegmt=True)


@pytest.mark.parametrize("size", [1000, LARGE])
def test_salt_changes_body_etag_and_last_modified_but_not_the_listing(size: int) -> None:
    plain, salted, other = (App(dataset(size, salt=s)) for s in ("", "run-2", "run-3"))
    answers = [request(app, "/get/" + NAME) for app in (plain, salted, other)]
    bodies = [body(a) for a in answers]
    assert bodies[0] == formula_body(0, 4, size)
    assert bodies[1] == formula_body(0, 4, size, "run-2")
    assert bodies[2] == formula_body(0, 4, size, "run-3")
    assert len({*bodies}) == 3 and all(len(b) == size for b in bodies)
    etags = [header(a, "ETag") for a in answers]
    assert etags == ['"' + hashlib.md5(b).hexdigest() + '"' for b in bodies]
    assert len(set(etags)) == 3
    stamps = [header(a, "Last-Modified") for a in answers]
    assert len(set(stamps)) == 3
    assert all(parsedate_to_datetime(s).timestamp() > EPOCH_2025  # type: ignore[arg-type]
               for s in stamps[1:])
    # the listing and its tokens are those of the unsalted data set
    lists = [request(app, "/list") for app in (plain, salted, other)]
    assert lists[0].body == lists[1].body == lists[2].body
    assert salted.dataset.identity == plain.dataset.identity


def test_salted_last_modified_follows_the_documented_formula() -> None:
    h = hashlib.blake2b(b"bulkfetch/salt/abc", digest_size=8).digest()
    want = EPOCH_2025 + 1 + int.from_bytes(h, "big") % (365 * 86400)
    assert dataset(salt="abc").last_modified == want
    assert dataset(salt="abc").lookup(NAME).last_modified == want  # type: ignore[union-attr]
    assert dataset(LARGE, salt="abc").lookup(NAME).last_modified == want  # type: ignore[union-attr]


@pytest.mark.parametrize("size", [1000, LARGE])
def test_if_range_with_the_etag_of_before_the_change_gets_200_and_the_new_body(
        size: int) -> None:
    before = App(dataset(size))
    after = App(dataset(size, salt="changed"))
    old_etag = header(request(before, "/get/" + NAME), "ETag")
    new = request(after, "/get/" + NAME)
    new_etag = header(new, "ETag")
    assert old_etag is not None and new_etag is not None and old_etag != new_etag
    stale = request(after, "/get/" + NAME, range="bytes=100-199", if_range=old_etag)
    assert stale.status == 200 and header(stale, "Content-Range") is None
    assert body(stale) == formula_body(0, 4, size, "changed")
    fresh = request(after, "/get/" + NAME, range="bytes=100-199", if_range=new_etag)
    assert fresh.status == 206
    assert body(fresh) == formula_body(0, 4, size, "changed")[100:200]
    # If-None-Match with the old ETag: the file changed, so 200 (not 304)
    assert request(after, "/get/" + NAME, if_none_match=old_etag).status == 200


def test_salt_changes_hostile_bodies_too() -> None:
    plain = HostileNames(dataset())
    salted = HostileNames(dataset(salt="s"))
    entry_plain, entry_salted = plain.lookup("../x"), salted.lookup("../x")
    assert entry_plain is not None and entry_salted is not None
    assert b"".join(entry_plain.read(0, 100)) == hostile_body("../x")
    assert b"".join(entry_salted.read(0, 100)) == hostile_body("../x", "s") != hostile_body("../x")
    assert entry_salted.last_modified == dataset(salt="s").last_modified != EPOCH_2025


# -- options -----------------------------------------------------------------------------
def test_options_build_an_app_with_every_switch() -> None:
    app = build_app(ServeOptions(files=10, digest_header=True, wrong_content_range=True,
                                 etag_salt="x", bandwidth_per_connection=1 << 20))
    assert app.digest_header and app.wrong_content_range and not app.ignore_ranges
    assert isinstance(app.dataset, SyntheticDataSet) and app.dataset.salt == "x"
    plain = build_app(ServeOptions(files=10))
    assert not (plain.digest_header or plain.ignore_ranges or plain.wrong_content_range)
    assert isinstance(plain.dataset, SyntheticDataSet) and plain.dataset.salt == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ignore_ranges": True, "wrong_content_range": True}, "exclude each other"),
        ({"bandwidth_per_connection": -1}, "--bandwidth-per-connection"),
        ({"etag_salt": "bad\udcff"}, "UTF-8"),
        ({"etag_salt": "x", "root": "."}, "--root"),
    ],
)
def test_options_refuse_nonsense(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ServeOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"digest_header": True}, "--digest-header"),
        ({"bandwidth_per_connection": 1000}, "--bandwidth-per-connection"),
        ({"ignore_ranges": True}, "--ignore-ranges"),
        ({"wrong_content_range": True}, "--wrong-content-range"),
    ],
)
def test_export_refuses_what_nginx_cannot_do(tmp_path: Path, kwargs: dict[str, object],
                                             flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        export_static(ServeOptions(files=3, **kwargs), str(tmp_path / "x"))  # type: ignore[arg-type]


def test_export_writes_salted_bodies_and_their_last_modified(tmp_path: Path) -> None:
    export_static(ServeOptions(files=3, etag_salt="v2"), str(tmp_path / "x"))
    written = tmp_path / "x" / "files" / "f0000000001"
    assert written.read_bytes() == formula_body(0, 1, 100, "v2")
    assert int(written.stat().st_mtime) == dataset(salt="v2").last_modified
    conf = (tmp_path / "x" / "nginx.conf").read_text()
    assert formatdate(dataset(salt="v2").last_modified, usegmt=True) in conf
