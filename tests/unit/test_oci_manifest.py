"""Manifests and indexes read strictly; platform choice; auth challenges and Docker config."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.oci.auth import Credentials, docker_config_credentials, parse_challenge
from bulkfetch.oci.manifest import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    ManifestError,
    Platform,
    media_type,
    parse_image,
    parse_index,
    parse_platform,
    pick,
    to_oci,
)

HEX = "c" * 64
LAYER = "application/vnd.oci.image.layer.v1.tar"


def descriptor(kind: str = LAYER, digest: str = "sha256:" + HEX, size: object = 10,
               **extra: object) -> dict[str, object]:
    return {"mediaType": kind, "digest": digest, "size": size, **extra}


def image(*layers: dict[str, object]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": descriptor("application/vnd.oci.image.config.v1+json"),
                       "layers": list(layers)}).encode()


def test_an_image_manifest_gives_config_and_layers_in_order() -> None:
    body = image(descriptor(digest="sha256:" + "1" * 64, size=5),
                 descriptor(digest="sha256:" + "2" * 64, size=7))
    parsed = parse_image(body)
    assert [str(layer.digest)[-1] for layer in parsed.layers] == ["1", "2"]
    assert [layer.size for layer in parsed.layers] == [5, 7]
    assert media_type(body, "text/plain") == OCI_MANIFEST


@pytest.mark.parametrize(("layer", "words"), [
    (descriptor(digest="sha256:../../x"), "algorithm:hex"),
    (descriptor(digest="crc32:" + HEX), "algorithm 'crc32'"),
    (descriptor(size=-1), "size"),
    (descriptor(size="10"), "size"),
    (descriptor(size=True), "size"),
    (descriptor(urls=["file:///etc/passwd"]), "only http(s)"),
    (descriptor(urls=["ftp://x/y"]), "only http(s)"),
    ({"digest": "sha256:" + HEX, "size": 1}, "mediaType"),
])
def test_hostile_descriptors_are_refused(layer: dict[str, object], words: str) -> None:
    with pytest.raises(ManifestError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_image(image(layer))


def test_a_manifest_of_another_schema_is_refused() -> None:
    with pytest.raises(ManifestError, match="schemaVersion"):
        parse_image(json.dumps({"schemaVersion": 1, "layers": []}).encode())
    with pytest.raises(ManifestError, match="not JSON"):
        media_type(b"<html>", "application/json")


def index(*platforms: tuple[str, str, str]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        descriptor(OCI_MANIFEST, "sha256:" + str(at) * 64, 100,
                   platform={"os": os_name, "architecture": arch, "variant": variant})
        for at, (os_name, arch, variant) in enumerate(platforms, 1)]}).encode()


def test_the_index_entry_for_the_platform_is_picked() -> None:
    manifests = parse_index(index(("linux", "amd64", ""), ("linux", "arm64", "v8"),
                                  ("linux", "arm", "v7")))
    assert pick(manifests, Platform("linux", "amd64"), "x").digest.hex == "1" * 64
    assert pick(manifests, parse_platform("linux/arm64/v8"), "x").digest.hex == "2" * 64
    assert pick(manifests, parse_platform("linux/arm/v7"), "x").digest.hex == "3" * 64
    with pytest.raises(UsageError, match="linux/amd64, linux/arm/v7, linux/arm64/v8"):
        pick(manifests, Platform("linux", "s390x"), "x")
    # arm64 images often leave out their only variant
    bare = parse_index(index(("linux", "arm64", "")))
    assert pick(bare, parse_platform("linux/arm64/v8"), "x") is bare[0]


def test_platform_flag_is_checked() -> None:
    for bad in ("linux", "linux/", "a/b/c/d"):
        with pytest.raises(UsageError, match="os/arch"):
            parse_platform(bad)


def test_challenges_are_parsed_with_quoting() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:a/b:pull,push",error="insufficient_scope"')
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull,push", "error": "insufficient_scope"}
    assert parse_challenge('Basic realm="Registry Realm"') == ("basic",
                                                               {"realm": "Registry Realm"})


def test_docker_config_auths_give_credentials(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"alice:s3cret:with:colons").decode()
    config.write_text(json.dumps({"auths": {
        "127.0.0.1:5000": {"auth": auth},
        "https://index.docker.io/v1/": {"username": "bob", "password": "pw"}}}))
    found = docker_config_credentials("127.0.0.1:5000", config)
    assert found == Credentials("alice", "s3cret:with:colons")
    assert "s3cret" not in repr(found)
    assert docker_config_credentials("registry-1.docker.io", config) == Credentials("bob", "pw")
    assert docker_config_credentials("other:5000", config) is None
    assert docker_config_credentials("x", tmp_path / "missing.json") is None
    config.write_text("[1, 2]")
    with pytest.raises(UsageError, match=str(config)):
        docker_config_credentials("x", config)


def test_a_docker_manifest_becomes_an_oci_one_over_the_same_blobs() -> None:


    docker = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": descriptor(
        "application/vnd.docker.container.image.v1+json", size=5), "layers": [
        descriptor("application/vnd.docker.image.rootfs.diff.tar.gzip", size=7),
        descriptor("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", size=9,
                   urls=["https://cdn.example/l.tgz"])]}).encode()
    converted = json.loads(to_oci(parse_image(docker)))
    assert converted["mediaType"] == OCI_MANIFEST
    assert converted["config"] == {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": "sha256:" + HEX, "size": 5}
    assert [layer["mediaType"] for layer in converted["layers"]] == [
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"]
    assert converted["layers"][1]["urls"] == ["https://cdn.example/l.tgz"]
    assert parse_image(to_oci(parse_image(docker))).layers[0].size == 7
