"""`bulkfetch pull` against a registry that lies: each case is a clear error naming what was
wrong, exit status non-zero, nothing written outside DEST and the cache, nothing cached
that failed verification, and no image recorded in index.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_registry import HostileRegistry, sha256

LAYER_BODY = os.urandom(300_000)
GOOD = os.urandom(50_000)


@pytest.fixture
def registry() -> Iterator[HostileRegistry]:
    server = HostileRegistry()
    yield server
    server.close()


def pull(tmp_path: Path, ref: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "DOCKER_CONFIG": str(tmp_path / "docker")}
    return subprocess.run(
        [sys.executable, "-m", "bulkfetch", "pull", ref, str(tmp_path / "dest"), "--plain",
         "--retries", "1", *extra], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=120)


def all_files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def cached(tmp_path: Path) -> set[str]:
    cache = tmp_path / "cache"
    return {path.name for path in cache.rglob("*") if path.is_file()} if cache.exists() \
        else set()


def assert_refused(tmp_path: Path, proc: subprocess.CompletedProcess[str],
                   *words: str) -> None:
    assert proc.returncode != 0, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    outside = {name for name in all_files(tmp_path)
               if not name.startswith(("dest/", "cache/"))}
    assert outside == set()
    index = tmp_path / "dest" / "index.json"
    assert not index.exists() or json.loads(index.read_text())["manifests"] == []


def test_a_blob_whose_bytes_do_not_match_its_digest_is_refused_and_not_cached(
        tmp_path: Path, registry: HostileRegistry) -> None:
    registry.image("team/app", "v1", [(GOOD, {}), (LAYER_BODY, {})])
    tampered = bytearray(LAYER_BODY)
    tampered[1000] ^= 1
    registry.blob("team/app", sha256(LAYER_BODY), bytes(tampered))
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert_refused(tmp_path, proc, sha256(LAYER_BODY)[7:],
                   "SHA256 of the body does not match the digest the manifest gives")
    assert sha256(LAYER_BODY)[7:] not in cached(tmp_path)
    assert not (tmp_path / "dest" / "blobs" / "sha256" / sha256(LAYER_BODY)[7:]).exists()
    assert proc.returncode == 1
    assert sha256(GOOD)[7:] in cached(tmp_path)  # the good layer is kept for the rerun


def test_a_manifest_whose_docker_content_digest_lies_is_refused(
        tmp_path: Path, registry: HostileRegistry) -> None:
    registry.image("team/app", "v1", [(GOOD, {})],
                   manifest_digest_header=sha256(b"another manifest"))
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert_refused(tmp_path, proc, "Docker-Content-Digest", "do not match")
    assert not any(path.startswith("/v2/team/app/blobs/") for path in registry.requests)


def test_a_pinned_reference_whose_manifest_differs_is_refused(
        tmp_path: Path, registry: HostileRegistry) -> None:
    manifest = registry.image("team/app", "v1", [(GOOD, {})])
    wrong = sha256(manifest + b" ")
    registry.answers[f"/v2/team/app/manifests/{wrong}"] = \
        registry.answers[f"/v2/team/app/manifests/{sha256(manifest)}"]
    proc = pull(tmp_path, f"{registry.address}/team/app@{wrong}")
    assert_refused(tmp_path, proc, "the digest asked for")


@pytest.mark.parametrize(("digest", "words"), [
    ("sha256:../../x", "not of the form algorithm:hex"),
    ("sha256:../../../../../tmp/" + "a" * 40, "not of the form algorithm:hex"),
    ("blake3:" + "a" * 64, "algorithm 'blake3'"),
    ("sha256:" + "A" * 64, "lower-case hex"),
])
def test_a_layer_digest_that_is_no_digest_is_refused_before_it_becomes_a_path(
        tmp_path: Path, registry: HostileRegistry, digest: str, words: str) -> None:
    registry.image("team/app", "v1", [(LAYER_BODY, {"digest": digest})])
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert_refused(tmp_path, proc, words)
    assert not any("blobs/" + digest.split(":")[0] in path and ".." in path
                   for path in registry.requests)


@pytest.mark.parametrize(("served", "words"), [
    # refused at the response's headers, before a byte of the body is taken
    (LAYER_BODY + b"more", "Content-Length 300004, the manifest gives 300000"),
    (LAYER_BODY[:-4], "Content-Length 299996, the manifest gives 300000"),
])
def test_a_blob_of_another_size_is_refused(tmp_path: Path, registry: HostileRegistry,
                                           served: bytes, words: str) -> None:
    registry.image("team/app", "v1", [(LAYER_BODY, {})])
    registry.blob("team/app", sha256(LAYER_BODY), served)
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert_refused(tmp_path, proc, words)
    assert cached(tmp_path) == set()


def test_an_endless_blob_is_cut_at_its_size(tmp_path: Path,
                                            registry: HostileRegistry) -> None:
    # no Content-Length: the body runs on until the connection closes
    registry.image("team/app", "v1", [(LAYER_BODY, {})])
    registry.blob("team/app", sha256(LAYER_BODY), LAYER_BODY * 20, **{"Connection": "close",
                                                                      "Content-Length": ""})
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert_refused(tmp_path, proc, "longer than the 300,000 bytes the manifest gives")


def test_a_foreign_layer_at_a_file_url_is_refused(tmp_path: Path,
                                                  registry: HostileRegistry) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the registry")
    registry.image("team/app", "v1", [(
        LAYER_BODY, {"mediaType": "application/vnd.oci.image.layer.nondistributable.v1.tar",
                     "urls": [f"file://{secret}"]})])
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    secret.unlink()
    assert_refused(tmp_path, proc, "file://", "only http(s)")


def test_docker_hubs_rate_limit_is_shown_and_a_429_is_waited_out(
        tmp_path: Path, registry: HostileRegistry) -> None:
    registry.image("team/app", "v1", [(GOOD, {})], extra_headers={
        "RateLimit-Limit": "100;w=21600", "RateLimit-Remaining": "76;w=21600"})
    path = f"/v2/team/app/blobs/{sha256(GOOD)}"
    registry.throttled[path] = 1
    proc = pull(tmp_path, f"{registry.address}/team/app:v1")
    assert proc.returncode == 0, proc.stderr
    assert "76 of 100 pulls left (per 21600 s)" in proc.stderr
    assert registry.requests.count(path) >= 2
