"""`bulkfetch serve --epoch N --mutate-rate P` (issue 24) through the data set and App.handle
(no sockets): which files change, how, and that nothing else does."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import time
import xml.etree.ElementTree as ET
from email.utils import formatdate
from pathlib import Path

import pytest
from click.testing import CliRunner

from bulkfetch.errors import UsageError
from bulkfetch.server.app import App, Response
from bulkfetch.server.command import serve
from bulkfetch.server.dataset import (
    CHUNK,
    DAY,
    EPOCH_2025,
    MAX_EPOCH,
    SMALL_BODY,
    SyntheticDataSet,
    file_version,
    mutate_limit,
    mutated_indices,
    salted_modified,
)
from bulkfetch.server.export import _list_command, export_static
from bulkfetch.server.hostile import HostileNames
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.server.s3app import S3App
from bulkfetch.util.sizes import parse_size_spec

SEED = 7
NS = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}


def data(files: int = 200, epoch: int = 1, rate: float = 0.0, size: int | str = 100,
         salt: str = "", nested: bool = False, seed: int = SEED) -> SyntheticDataSet:
    return SyntheticDataSet(files, 50, seed, parse_size_spec(str(size)), nested, salt=salt,
                            epoch=epoch, mutate_rate=rate)


def request(app: App | S3App, target: str, method: str = "GET", **headers: str) -> Response:
    return app.handle(method, target, {k.replace("_", "-").lower(): v for k, v in headers.items()})


def header(response: Response, name: str) -> str:
    values = [v for k, v in response.headers if k.lower() == name.lower()]
    assert len(values) == 1, (name, response.headers)
    return values[0]


def served(response: Response) -> bytes:
    return b"".join(response.chunks) if response.chunks is not None else response.body


def formula_changed(seed: int, index: int, rate: float, epoch: int) -> bool:
    """changed(i, e) of dataset.py's docstring, written out here independently."""
    block, slot = divmod(epoch, 16)
    h = hashlib.blake2b(f"bulkfetch/{seed}/{index}/mutate/{block}".encode(),
                        digest_size=64).digest()
    return int.from_bytes(h[4 * slot: 4 * slot + 4], "big") < int(rate * 2**32)


def formula_body(seed: int, index: int, size: int, version: int, salt: str = "") -> bytes:
    key = str(index) if version == 1 else f"{index}.{version}"
    tail = f"/{salt}" if salt else ""
    return b"".join(
        hashlib.shake_128(f"bulkfetch/{seed}/{key}/{k}{tail}".encode())
        .digest(min(CHUNK, size - k * CHUNK)) for k in range(-(-size // CHUNK)))


# -- which files change -------------------------------------------------------------------
def test_versions_follow_the_documented_formula() -> None:
    rate, epoch = 0.05, 40  # three hash blocks, the last one partly past N
    dataset = data(300, epoch, rate)
    for index in range(300):
        changed = [e for e in range(2, epoch + 1) if formula_changed(SEED, index, rate, e)]
        want = max(changed, default=1)
        assert dataset.version(index) == want, index
    assert {dataset.version(i) for i in range(300)} >= {1, epoch, epoch - 1}


def test_epoch_2_at_one_percent_of_100000_files_changes_about_one_percent() -> None:
    changed = list(mutated_indices(SEED, 100_000, 0.01, 1, 2))
    # Binomial(100000, 0.01): mean 1000, sd 31.5; five sd either side fails one run in 10^6
    assert 842 <= len(changed) <= 1158, len(changed)
    assert changed == sorted(set(changed))
    assert changed == list(mutated_indices(SEED, 100_000, 0.01, 1, 2))  # reproducible
    other_seed = set(mutated_indices(SEED + 1, 100_000, 0.01, 1, 2))
    assert len(other_seed & set(changed)) < 50  # another seed picks other files (~10 alike)
    # spread over the whole range, not bunched at one end
    assert 350 <= sum(1 for i in changed if i < 50_000) <= 650


def test_later_epochs_only_add_changes() -> None:
    files, rate = 100_000, 0.01
    to2 = set(mutated_indices(SEED, files, rate, 1, 2))
    to3 = set(mutated_indices(SEED, files, rate, 1, 3))
    two_to_3 = set(mutated_indices(SEED, files, rate, 2, 3))
    assert to2 < to3 and to3 == to2 | two_to_3
    # 1 - 0.99^2 = 1.99%: mean 1990, sd 44
    assert 1770 <= len(to3) <= 2210, len(to3)
    assert 842 <= len(two_to_3) <= 1158, len(two_to_3)
    # a file changed in both epochs is in both sets: its version at 3 is 3
    both = to2 & two_to_3
    assert 0 < len(both) < 30  # ~10 expected
    at2, at3 = data(files, 2, rate), data(files, 3, rate)
    for index in list(to3)[:300] + list(range(300)):
        v2, v3 = at2.version(index), at3.version(index)
        assert v3 == (3 if index in two_to_3 else v2)
        assert (v2 == 2) == (index in to2)
    assert list(at3.changed_since(2)) == sorted(two_to_3)


def test_rate_bounds_and_empty_ranges() -> None:
    assert list(mutated_indices(SEED, 50, 1.0, 1, 2)) == list(range(50))
    assert all(file_version(SEED, i, mutate_limit(1.0), 37) == 37 for i in range(50))
    assert list(mutated_indices(SEED, 50, 0.0, 1, MAX_EPOCH)) == []
    assert list(mutated_indices(SEED, 50, 0.9, 4, 4)) == []
    for bad in ((0, 2), (3, 2)):
        with pytest.raises(ValueError):
            list(mutated_indices(SEED, 10, 0.5, *bad))
    for rate in (-0.1, 1.01, math.nan):
        with pytest.raises(ValueError):
            mutate_limit(rate)
    with pytest.raises(ValueError):
        data(epoch=0)


# -- what a change is ---------------------------------------------------------------------
@pytest.mark.parametrize(("epoch", "rate"), [(1, 0.5), (5, 0.0), (1, 1.0)])
def test_no_change_is_byte_for_byte_the_data_set_without_flags(epoch: int, rate: float) -> None:
    plain, flagged = data(60, size="uniform:10:300"), data(60, epoch, rate, "uniform:10:300")
    assert not flagged.mutating and flagged.identity == plain.identity
    for index in range(60):
        name = plain.name(index)
        a, b = plain.lookup(name), flagged.lookup(name)
        assert a is not None and b is not None
        assert b"".join(b.read(0, b.size)) == b"".join(a.read(0, a.size)) \
            == formula_body(SEED, index, a.size, 1)
        assert (b.etag(), b.last_modified) == (a.etag(), a.last_modified) \
            == ('"' + hashlib.md5(plain.body(index)).hexdigest() + '"', EPOCH_2025)


@pytest.mark.parametrize("salt", ["", "run-2"])
def test_a_changed_file_has_a_new_body_etag_and_later_last_modified(salt: str) -> None:
    rate, epoch = 0.3, 4
    plain = data(120, salt=salt, size="uniform:1:5000")
    mutated = data(120, epoch, rate, salt=salt, size="uniform:1:5000")
    versions = [mutated.version(i) for i in range(120)]
    assert {1, 2, 3, 4} <= set(versions)  # every case below is met
    for index, version in enumerate(versions):
        name = plain.name(index)
        old, new = plain.lookup(name), mutated.lookup(name)
        assert old is not None and new is not None
        body = b"".join(new.read(0, new.size))
        assert new.size == old.size == len(body)  # sizes stay (documented)
        assert body == mutated.body(index) == formula_body(SEED, index, new.size, version, salt)
        assert new.etag() == '"' + hashlib.md5(body).hexdigest() + '"'
        assert new.last_modified == salted_modified(salt) + (version - 1) * DAY
        if version == 1:
            assert (body, new.etag()) == (plain.body(index), old.etag())
        else:
            assert body != plain.body(index) and new.etag() != old.etag()
            assert new.last_modified > old.last_modified


def test_salt_and_version_never_stand_for_each_other() -> None:
    """A salt that spells a version mark still gives other bytes than that version."""
    mutated = data(50, 2, 1.0)  # every file is version 2
    for salt in (".2", "2", "v2", "/2"):
        salted = data(50, salt=salt)
        assert all(salted.body(i) != mutated.body(i) for i in range(50))
    assert mutated.body(3) != data(50, 3, 1.0).body(3)  # version 3 is not version 2


def test_large_streamed_bodies_change_too() -> None:
    size = SMALL_BODY + CHUNK + 17
    plain, mutated = data(4, size=size), data(4, 2, 1.0, size=size)
    old, new = plain.lookup(plain.name(1)), mutated.lookup(mutated.name(1))
    assert old is not None and new is not None
    body = b"".join(new.read(0, size))
    assert len(body) == size and body == formula_body(SEED, 1, size, 2)
    assert new.etag() == '"' + hashlib.md5(body).hexdigest() + '"' != old.etag()
    assert new.sha256() == hashlib.sha256(body).digest()
    assert b"".join(new.read(CHUNK - 5, CHUNK + 5)) == body[CHUNK - 5: CHUNK + 5]


@pytest.mark.parametrize("nested", [False, True])
def test_growing_files_keeps_the_first_names_bodies_and_etags(nested: bool) -> None:
    small = data(10_000, 2, 0.01, nested=nested)
    grown = data(10_100, 2, 0.01, nested=nested)
    assert small.width == grown.width
    assert small.names(0) == grown.names(0)
    for index in range(10_000):
        name = small.name(index)
        assert grown.name(index) == name
        a, b = small.lookup(name), grown.lookup(name)
        assert a is not None and b is not None
        assert (a.size, a.etag(), a.last_modified) == (b.size, b.etag(), b.last_modified), name
        if index % 97 == 0 or small.version(index) > 1:
            assert small.body(index) == grown.body(index)
    assert [grown.lookup(grown.name(i)) is not None for i in (10_000, 10_099)] == [True] * 2
    assert small.lookup(grown.name(10_000)) is None
    grown_changed = list(mutated_indices(SEED, 10_100, 0.01, 1, 2))
    assert [i for i in grown_changed if i < 10_000] \
        == list(mutated_indices(SEED, 10_000, 0.01, 1, 2))


def test_hostile_extras_never_change_and_the_synthetic_files_do() -> None:
    plain, mutated = HostileNames(data(30)), HostileNames(data(30, 2, 1.0))
    extra_a, extra_b = plain.lookup("../x"), mutated.lookup("../x")
    assert extra_a is not None and extra_b is not None
    assert (extra_a.etag(), extra_a.last_modified) == (extra_b.etag(), extra_b.last_modified)
    a, b = plain.lookup("f0000000003"), mutated.lookup("f0000000003")
    assert a is not None and b is not None and a.etag() != b.etag()


# -- the server's answers -----------------------------------------------------------------
def _apps(files: int = 80, rate: float = 0.25, epoch: int = 2, **extra: object
          ) -> tuple[App | S3App, App | S3App]:
    base = {"files": files, "page_size": 20, "seed": SEED, **extra}
    return (build_app(ServeOptions(**base)),  # type: ignore[arg-type]
            build_app(ServeOptions(**base, epoch=epoch, mutate_rate=rate)))  # type: ignore[arg-type]


def test_conditional_gets_answer_304_for_unchanged_files_and_200_for_changed() -> None:
    before, after = _apps()
    changed = set(mutated_indices(SEED, 80, 0.25, 1, 2))
    assert 5 < len(changed) < 40
    for index in range(80):
        target = f"/get/f{index:010d}"
        old = request(before, target)
        assert old.status == 200
        etag, modified = header(old, "ETag"), header(old, "Last-Modified")
        assert modified == formatdate(EPOCH_2025, usegmt=True)
        by_etag = request(after, target, if_none_match=etag)
        by_date = request(after, target, if_modified_since=modified)
        new = request(after, target)
        if index in changed:
            assert by_etag.status == by_date.status == 200
            assert served(by_etag) == served(new) != served(old)
            assert header(new, "ETag") == '"' + hashlib.md5(served(new)).hexdigest() + '"'
            assert header(new, "ETag") != etag
            assert header(new, "Last-Modified") == formatdate(EPOCH_2025 + DAY, usegmt=True)
            # a resumed range against the old ETag gets the whole new body
            ranged = request(after, target, range="bytes=10-", if_range=etag)
            assert ranged.status == 200 and served(ranged) == served(new)
        else:
            assert by_etag.status == by_date.status == 304
            assert header(by_etag, "ETag") == etag
            assert header(by_etag, "Last-Modified") == modified
            assert served(new) == served(old)
        # the new validators are current at the new epoch
        assert request(after, target, if_none_match=header(new, "ETag")).status == 304
        assert request(after, target,
                       if_modified_since=header(new, "Last-Modified")).status == 304
    # the listing and its tokens are those of epoch 1
    first = request(before, "/list")
    assert served(request(after, "/list")) == served(first)
    token = json.loads(served(first))["NextMarker"]
    assert request(after, "/list?next-marker=" + token).status == 200


@pytest.mark.parametrize("nested", [False, True])
def test_s3_listing_states_the_etag_and_date_a_get_serves(nested: bool) -> None:
    before, after = _apps(60, 0.3, 3, s3_bucket="bulkfetch", nested=nested)
    dataset = data(60, 3, 0.3, nested=nested)
    changed = {dataset.name(i) for i in mutated_indices(SEED, 60, 0.3, 1, 3)}
    assert 10 < len(changed) < 50

    def listing(app: App | S3App) -> dict[str, tuple[str, str, str]]:
        answer = request(app, "/bulkfetch?list-type=2")
        assert answer.status == 200
        root = ET.fromstring(served(answer))
        return {c.findtext("s3:Key", namespaces=NS) or "": (
            c.findtext("s3:ETag", namespaces=NS) or "",
            c.findtext("s3:LastModified", namespaces=NS) or "",
            c.findtext("s3:Size", namespaces=NS) or "") for c in root.iterfind("s3:Contents", NS)}

    old, new = listing(before), listing(after)
    assert sorted(old) == sorted(new) and len(new) == 60
    assert {key for key in new if new[key][0] != old[key][0]} == changed
    assert {key for key in new if new[key][1] != old[key][1]} == changed
    assert all(new[key][2] == old[key][2] for key in new)
    for key, (etag, stamp, size) in new.items():
        got = request(after, "/bulkfetch/" + key)
        assert header(got, "ETag") == etag and len(served(got)) == int(size)
        version = dataset.version(dataset.index_of(key) or 0)
        want = EPOCH_2025 + (version - 1) * DAY
        assert stamp == time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(want))


# -- flags --------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "words"), [
    ({"epoch": 0}, "--epoch"),
    ({"epoch": MAX_EPOCH + 1}, "--epoch"),
    ({"mutate_rate": 1.5}, "--mutate-rate"),
    ({"mutate_rate": -0.01}, "--mutate-rate"),
    ({"mutate_rate": math.nan}, "--mutate-rate"),
    ({"root": "/", "epoch": 2, "mutate_rate": 0.1}, "--root"),
    ({"root": "/", "epoch": 2}, "--root"),
])
def test_options_refuse_bad_epochs_and_rates(fields: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        ServeOptions(**fields)  # type: ignore[arg-type]


def test_options_allow_a_rate_at_epoch_1_which_changes_nothing() -> None:
    options = ServeOptions(files=10, mutate_rate=0.5)
    app = build_app(options)
    assert isinstance(app, App) and isinstance(app.dataset, SyntheticDataSet)
    assert not app.dataset.mutating
    assert "epoch 1 at mutate rate 0.5" in options.describe()
    assert "epoch" not in ServeOptions(files=10).describe()


@pytest.mark.parametrize(("args", "words"), [
    (["--mutate-rate", "1.5"], "--mutate-rate"),
    (["--mutate-rate", "-1"], "--mutate-rate"),
    (["--epoch", "0"], "--epoch"),
    (["--epoch", str(MAX_EPOCH + 1)], "--epoch"),
    (["--epoch", "two"], "--epoch"),
])
def test_the_command_refuses_bad_values_with_a_usage_error(args: list[str], words: str) -> None:
    result = CliRunner().invoke(serve, [*args, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_the_command_refuses_epochs_with_root(tmp_path: Path) -> None:
    result = CliRunner().invoke(serve, ["--root", str(tmp_path), "--epoch", "3",
                                        "--mutate-rate", "0.1", "--port", "0"])
    assert result.exit_code == 2 and "--root" in result.output, result.output


# -- the static export --------------------------------------------------------------------
def test_export_writes_the_bodies_etags_and_dates_of_the_epoch(tmp_path: Path) -> None:
    options = ServeOptions(files=40, page_size=15, seed=SEED, epoch=2, mutate_rate=0.3,
                           port=8123)
    export_static(options, str(tmp_path / "out"))
    dataset = data(40, 2, 0.3)
    changed = list(mutated_indices(SEED, 40, 0.3, 1, 2))
    assert 3 < len(changed) < 30
    etags = (tmp_path / "out" / "etags.map").read_text()
    modified = (tmp_path / "out" / "modified.map").read_text()
    for index in range(40):
        name = dataset.name(index)
        path = tmp_path / "out" / "files" / name
        assert path.read_bytes() == dataset.body(index)
        entry = dataset.lookup(name)
        assert entry is not None
        assert f"/get/{name} '{entry.etag()}';" in etags
        assert path.stat().st_mtime == entry.last_modified
        dated = f"/get/{name} '{formatdate(entry.last_modified, usegmt=True)}';"
        assert (dated in modified) == (index in changed)
    conf = (tmp_path / "out" / "nginx.conf").read_text()
    assert "modified.map" in conf and "add_header Last-Modified $bulkfetch_modified" in conf
    assert f"default '{formatdate(EPOCH_2025, usegmt=True)}';" in conf
    assert modified.count("/get/") == len(changed)
    assert "epoch 2 at mutate rate 0.3" in conf


def test_export_passes_the_epoch_to_the_live_s3_lister() -> None:
    """With --s3 the export's listings come from a live server: it must serve the same epoch,
    or the listed ETags would be those of epoch 1."""
    words = shlex.split(_list_command(ServeOptions(s3_bucket="bkt", epoch=3, mutate_rate=0.01),
                                      9000))
    at = words.index("--epoch")
    assert words[at: at + 4] == ["--epoch", "3", "--mutate-rate", "0.01"]
    assert "--epoch" not in _list_command(ServeOptions(s3_bucket="bkt"), 9000)
