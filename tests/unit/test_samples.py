"""The sample view of a destination (issue 19): keys split as webdataset splits them, and
members grouped into the same samples the real webdataset package reads from the shards."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bulkfetch.dataset import open_dataset
from bulkfetch.testing import write_tar_destination
from bulkfetch.util.samples import group, split_key


@pytest.mark.parametrize(("name", "key", "extension"), [
    ("a/b/000001.seg.png", "a/b/000001", "seg.png"),
    ("000001.jpg", "000001", "jpg"),
    ("d.x/y.z", "d.x/y", "z"),  # only the last component's dots count
    ("plain", "plain", ""),
    ("dir/.hidden.jpg", "dir/.hidden", "jpg"),  # a leading dot belongs to the key
    ("dir/.hidden", "dir/.hidden", ""),
    ("a.", "a", ""),
])
def test_a_key_ends_at_the_first_dot_of_the_last_component(name: str, key: str,
                                                           extension: str) -> None:
    assert split_key(name) == (key, extension)


def test_consecutive_members_of_a_key_make_one_sample_and_nothing_is_dropped() -> None:
    items = [("s/1.jpg", b"j1"), ("s/1.txt", b"t1"), ("s/1.seg.png", b"p1"),
             ("s/2.jpg", b"j2"),
             ("s/1.json", b"late"),  # not next to its key: a sample of its own
             ("s/2.jpg", b"again"), ("s/2.txt", b"t2"),  # the same extension twice: a new one
             ("bare", b"b")]
    assert list(group(items)) == [
        {"__key__": "s/1", "jpg": b"j1", "txt": b"t1", "seg.png": b"p1"},
        {"__key__": "s/2", "jpg": b"j2"},
        {"__key__": "s/1", "json": b"late"},
        {"__key__": "s/2", "jpg": b"again", "txt": b"t2"},
        {"__key__": "bare", "": b"b"}]
    assert list(group([])) == []
    with pytest.raises(ValueError, match="sample's key field"):
        list(group([("x.__key__", b"")]))


SHARDS = [
    [("train/000001.jpg", b"J1"), ("train/000001.txt", b"caption one"),
     ("train/000001.seg.png", b"P1"), ("train/000002.jpg", b"J2"),
     ("train/sub.dir/000003.jpg", b"J3"), ("train/sub.dir/000003.json", b'{"w": 3}')],
    [("val/000004.jpg", b"J4"), ("val/000004.txt", b"four"), ("val/000005.cls", b"7")],
]


def test_the_samples_are_the_ones_webdataset_reads_from_the_shards(tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    dest = tmp_path / "d"
    write_tar_destination(dest, SHARDS)
    with sqlite3.connect(dest / "index.sqlite") as conn:
        shards = [str(dest / file) for (file,) in conn.execute(
            "SELECT file FROM shards ORDER BY id")]
    theirs = [{k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")}
              for sample in webdataset.WebDataset(shards, shardshuffle=False)]
    with open_dataset(dest) as dataset:
        ours = list(dataset.samples())
        assert [s["__key__"] for s in dataset.samples("val/*")] == ["val/000004", "val/000005"]
    assert ours == theirs
    assert len(ours) == 5 and ours[0] == {
        "__key__": "train/000001", "jpg": b"J1", "txt": b"caption one", "seg.png": b"P1"}


def test_a_directory_destination_has_the_same_sample_view(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    for name, body in SHARDS[0]:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(body)
    with open_dataset(dest) as dataset:  # walked by name: a key's files sit together
        keys = [(s["__key__"], sorted(k for k in s if k != "__key__"))
                for s in dataset.samples()]
    assert keys == [("train/000001", ["jpg", "seg.png", "txt"]), ("train/000002", ["jpg"]),
                    ("train/sub.dir/000003", ["jpg", "json"])]
