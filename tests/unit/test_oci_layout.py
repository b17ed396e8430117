"""The OCI layout pull writes, the shared blob cache, and the registry's blobs as a Source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.oci import layout
from bulkfetch.oci.auth import Authorizer, Credentials
from bulkfetch.oci.blobs import BlobPlan, BlobSource, BlobSpec
from bulkfetch.oci.cache import BlobCache
from bulkfetch.oci.reference import Digest


def digest_of(data: bytes) -> Digest:
    return Digest("sha256", hashlib.sha256(data).hexdigest())


def entry(name: str, digest: str) -> dict[str, object]:
    return {"mediaType": "m", "digest": digest, "size": 1,
            "annotations": {layout.REF_NAME: name}}


def test_a_layout_is_made_and_its_index_keeps_other_images(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    layout.prepare(dest)
    assert json.loads((dest / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    layout.add_to_index(dest, [entry("v1", "a"), entry("v2", "b")])
    layout.add_to_index(dest, [entry("v1", "c")])
    names = {e["annotations"][layout.REF_NAME]: e["digest"]
             for e in json.loads((dest / "index.json").read_text())["manifests"]}
    assert names == {"v1": "c", "v2": "b"}
    layout.prepare(dest)  # an existing layout is fine


def test_a_directory_holding_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(UsageError, match="not an OCI image layout"):
        layout.prepare(tmp_path / "photos")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "oci-layout").write_text('{"imageLayoutVersion": "9.0"}')
    with pytest.raises(UsageError, match="not an OCI layout marker"):
        layout.prepare(tmp_path / "other")


def test_small_blobs_are_written_read_only_once(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    layout.prepare(dest)
    data = b'{"config": 1}'
    digest = digest_of(data)
    layout.put_blob(dest, digest, data)
    path = layout.blob_path(dest, digest)
    assert path.read_bytes() == data and path.stat().st_mode & 0o777 == 0o444
    assert layout.has_blob(dest, digest, len(data))
    assert not layout.has_blob(dest, digest, len(data) + 1)


def test_the_cache_links_blobs_in_and_out(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache")
    data = b"layer bytes" * 100
    digest = digest_of(data)
    source = tmp_path / "one" / digest.path
    source.parent.mkdir(parents=True)
    source.write_bytes(data)
    assert not cache.place(digest, len(data), tmp_path / "two" / digest.path)
    cache.keep(digest, len(data), source)
    assert cache.has(digest, len(data))
    assert cache.path(digest).stat().st_ino == source.stat().st_ino  # linked, not copied
    target = tmp_path / "two" / digest.path
    assert cache.place(digest, len(data), target)
    assert target.read_bytes() == data
    assert not cache.has(digest, len(data) - 1)  # a blob of another size is no hit


def test_the_cache_copies_across_file_systems(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    cache = BlobCache(tmp_path / "cache")
    data = b"x" * 5000
    digest = digest_of(data)
    source = tmp_path / "blob"
    source.write_bytes(data)
    cache.keep(digest, len(data), source)
    assert cache.path(digest).read_bytes() == data
    assert cache.path(digest).stat().st_ino != source.stat().st_ino


def blob(n: int) -> BlobSpec:
    hex_ = f"{n:064x}"
    return BlobSpec(f"blobs/sha256/{hex_}", f"http://r/v2/team/app/blobs/sha256:{hex_}", n,
                    "sha256", hex_)


def test_the_blob_source_lists_one_blob_a_page_and_pins_each() -> None:
    source = BlobSource(BlobPlan((blob(1), blob(2))))
    first = source.list_page(None)
    assert first.items == (blob(1).name,) and first.next_token == "1" and first.total == 2
    assert source.list_page("1").next_token is None
    assert source.resolve(blob(2).name) == (blob(2).name, blob(2).url)
    with pytest.raises(ValueError):
        source.resolve("blobs/sha256/../../etc/passwd")
    abilities = source.abilities()
    assert abilities.pinned is not None
    pinned = abilities.pinned(blob(2).name)
    assert pinned is not None and pinned.size == 2 and pinned.digest == bytes.fromhex(
        blob(2).hex) and pinned.vouched_by == "the manifest"
    assert abilities.request_headers is None  # nothing to sign: no auth in the plan


def test_only_the_registry_gets_the_credentials() -> None:
    basic = Authorizer(kind="basic", credentials=Credentials("alice", "s3cr3t"))
    bearer = Authorizer(kind="bearer", token="tok-SECRET", renew_at=float("inf"))
    plan = BlobPlan((blob(1),), (("http://r/v2/team/app/", basic),
                                 ("http://r/v2/team/", bearer)))
    source = BlobSource(plan)
    assert source.headers("http://r/v2/team/app/blobs/x") == [
        "Authorization: Basic YWxpY2U6czNjcjN0"]
    assert source.headers("http://r/v2/team/other/blobs/x") == ["Authorization: Bearer tok-SECRET"]
    assert source.headers("https://cdn.example/foreign.tar") == []
    assert not source.reauthorize("http://r/v2/team/app/blobs/x")  # Basic: nothing to renew
    assert source.reauthorize("http://r/v2/team/other/blobs/x")
    assert bearer.renew_at == 0.0  # the next request renews the token
    assert "s3cr3t" not in repr(plan) and "SECRET" not in repr(plan)
    assert plan.summary() == {"blobs": 1, "bytes": 1}


def test_a_report_shows_the_plan_without_its_credentials() -> None:
    from bulkfetch.config import GetOptions

    bearer = Authorizer(kind="bearer", token="tok-SECRET",
                        credentials=Credentials("alice", "s3cr3t"))
    plan = BlobPlan((blob(7),), (("http://r/v2/team/app/", bearer),))
    shown = json.dumps(GetOptions(source=plan.identity(), dest="d", plan=plan).as_dict())
    assert "SECRET" not in shown and "s3cr3t" not in shown
    assert '"plan": {"blobs": 1, "bytes": 7}' in shown
