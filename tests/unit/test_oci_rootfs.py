"""--unpack: layers applied in order, whiteouts and opaque directories honoured, and no
layer can create, change or remove anything outside the root file system."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from bulkfetch.oci.rootfs import UnpackError, unpack

LAYER = "application/vnd.oci.image.layer.v1.tar"


def layer(tmp_path: Path, name: str, *members: tuple[str, str, object],
          compress: bool = False) -> tuple[Path, str, str]:
    """A layer blob of (kind, name, data|target) members: kind f(ile), d(ir), l(ink: symlink),
    h(ard link)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for kind, member_name, value in members:
            info = tarfile.TarInfo(member_name)
            if kind == "f":
                data = value if isinstance(value, bytes) else str(value).encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, int(value or 0o755)  # type: ignore[call-overload]
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, str(value)
            elif kind == "h":
                info.type, info.linkname = tarfile.LNKTYPE, str(value)
            tar.addfile(info)
    data = buffer.getvalue()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if compress else data)
    return path, LAYER, name


def tree(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = ("-> " + os.readlink(path)) if path.is_symlink() else \
            "dir" if path.is_dir() else path.read_text()
    return found


def test_layers_apply_in_order_with_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    first = layer(tmp_path, "1", ("d", "etc", 0o755), ("f", "etc/a", "old"),
                  ("f", "etc/gone", "x"), ("d", "var/cache", 0o755), ("f", "var/cache/c", "1"),
                  ("d", "opt/tree/deep", 0o755), ("f", "opt/tree/deep/f", "1"))
    second = layer(tmp_path, "2", ("f", "etc/a", "new"), ("f", "etc/.wh.gone", ""),
                   ("f", "var/cache/mine", "2"), ("f", "var/cache/.wh..wh..opq", ""),
                   ("f", "opt/.wh.tree", ""), ("l", "etc/tz", "/usr/share/zoneinfo/UTC"),
                   ("h", "etc/b", "etc/a"), compress=True)
    stats = unpack(rootfs, [first, second])
    assert tree(rootfs) == {"etc": "dir", "etc/a": "new", "etc/b": "new",
                            "etc/tz": "-> /usr/share/zoneinfo/UTC", "opt": "dir",
                            "var": "dir", "var/cache": "dir", "var/cache/mine": "2"}
    assert stats.whiteouts == 3 and stats.hardlinks == 1 and stats.symlinks == 1
    # counted as the root file system holds them: etc/a written twice, and etc/gone,
    # var/cache/c and opt/tree/deep/f removed, leave three files (a, b, mine)
    assert (stats.files, stats.dirs) == (3, 4)


def test_an_opaque_marker_before_its_siblings_keeps_them(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    first = layer(tmp_path, "1", ("f", "d/old", "1"))
    second = layer(tmp_path, "2", ("f", "d/.wh..wh..opq", ""), ("f", "d/new", "2"))
    unpack(rootfs, [first, second])
    assert tree(rootfs) == {"d": "dir", "d/new": "2"}


@pytest.mark.parametrize(("members", "words"), [
    ((("f", "/etc/passwd", "x"),), "absolute path"),
    ((("f", "a/../../outside", "x"),), "climbs"),
    ((("l", "escape", "/"), ("f", "escape/planted", "x")), "passes through the symlink"),
    ((("l", "up", "../.."), ("f", "up/planted", "x")), "above the root"),
    ((("l", "a/b", "../../x"),), "above the root"),
    ((("h", "pw", "/etc/passwd"),), "absolute path"),
    ((("h", "pw", "../outside/secret"),), "climbs"),
    ((("l", "link", "/"), ("h", "pw", "link/etc/passwd")), "passes through the symlink"),
])
def test_hostile_members_are_refused_and_nothing_outside_changes(
        tmp_path: Path, members: tuple, words: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep")
    rootfs = tmp_path / "work" / "rootfs"
    rootfs.parent.mkdir()
    with pytest.raises(UnpackError, match=words):
        unpack(rootfs, [layer(tmp_path, "evil", *members)])
    assert tree(outside) == {"secret": "keep"}
    assert not (tmp_path / "planted").exists() and not Path("/planted").exists()


def test_a_symlink_planted_by_one_layer_is_replaced_not_followed_by_the_next(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_text("keep")
    rootfs = tmp_path / "rootfs"
    first = layer(tmp_path, "1", ("l", "f", str(outside / "target")))
    second = layer(tmp_path, "2", ("f", "f", "layer two"))
    unpack(rootfs, [first, second])
    assert (outside / "target").read_text() == "keep"
    assert tree(rootfs) == {"f": "layer two"}


def test_a_whiteout_of_a_symlinked_directory_removes_the_link_only(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep")
    rootfs = tmp_path / "rootfs"
    first = layer(tmp_path, "1", ("l", "d", str(outside)))
    second = layer(tmp_path, "2", ("f", ".wh.d", ""))
    unpack(rootfs, [first, second])
    assert tree(outside) == {"secret": "keep"}
    assert tree(rootfs) == {}


def test_a_non_empty_rootfs_is_refused(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "x").write_text("x")
    with pytest.raises(UnpackError, match="not an empty directory"):
        unpack(rootfs, [layer(tmp_path, "1", ("f", "a", "1"))])


def test_a_big_member_streams_through(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    rootfs = tmp_path / "rootfs"
    unpack(rootfs, [layer(tmp_path, "1", ("f", "big", data), compress=True)])
    assert (rootfs / "big").read_bytes() == data
