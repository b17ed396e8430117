"""Image references and digests: Docker's reading of REF, and nothing malformed reaches a
URL or a path."""

from __future__ import annotations

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.oci.reference import DOCKER_HUB, Digest, parse_digest, parse_reference

HEX = "a" * 64


@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest"), [
    ("alpine", DOCKER_HUB, "library/alpine", "latest", None),
    ("alpine:3.20", DOCKER_HUB, "library/alpine", "3.20", None),
    ("docker.io/bitnami/redis:7", DOCKER_HUB, "bitnami/redis", "7", None),
    ("user/app", DOCKER_HUB, "user/app", "latest", None),
    ("127.0.0.1:5000/team/app:v1", "127.0.0.1:5000", "team/app", "v1", None),
    ("localhost/app", "localhost", "app", "latest", None),
    ("ghcr.io/org/a/b@sha256:" + HEX, "ghcr.io", "org/a/b", None, "sha256:" + HEX),
    ("reg.example:443/x:t@sha256:" + HEX, "reg.example:443", "x", "t", "sha256:" + HEX),
])
def test_references_are_read_as_docker_reads_them(text: str, registry: str, repository: str,
                                                  tag: str | None, digest: str | None) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag) == (registry, repository, tag)
    assert (str(ref.digest) if ref.digest else None) == digest


def test_a_pinned_reference_asks_for_its_digest_and_names_itself_by_tag() -> None:
    ref = parse_reference("127.0.0.1:5000/app:v2@sha256:" + HEX)
    assert ref.reference == "sha256:" + HEX
    assert ref.ref_name == "v2"
    assert parse_reference("127.0.0.1:5000/app@sha256:" + HEX).ref_name == "sha256:" + HEX


def test_loopback_speaks_plain_http_and_others_tls_unless_asked() -> None:
    assert parse_reference("127.0.0.1:5000/a").base_url(False) == "http://127.0.0.1:5000"
    assert parse_reference("localhost:5000/a").base_url(False) == "http://localhost:5000"
    assert parse_reference("reg.example/a").base_url(False) == "https://reg.example"
    assert parse_reference("reg.example/a").base_url(True) == "http://reg.example"


@pytest.mark.parametrize("text", [
    "", "UPPER/case", "127.0.0.1:5000/", "app:bad tag", "app:.hidden", "a//b",
    "app@sha256:../../x", "app@sha256:" + "A" * 64, "app@md5:" + "a" * 32,
    "app@sha256:" + "a" * 63, "bad_host!:5000/app", "app/../etc",
])
def test_malformed_references_are_refused_naming_the_input(text: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_reference(text)
    assert repr(text.strip()) in str(refused.value)


def test_digests_are_checked_before_they_become_paths() -> None:
    assert parse_digest("sha256:" + HEX) == Digest("sha256", HEX)
    assert parse_digest("sha512:" + "b" * 128).path == "blobs/sha512/" + "b" * 128
    for bad in ("sha256:../../x", "sha256:" + HEX + "/..", "blake3:" + HEX, "sha256", 7,
                "sha512:" + HEX, "sha256:" + HEX.upper()):
        with pytest.raises(ValueError):
            parse_digest(bad)
    with pytest.raises(ValueError, match="algorithm 'blake3'"):
        parse_digest("blake3:" + HEX)


def test_a_reference_prints_as_docker_writes_it() -> None:
    pinned = "127.0.0.1:5000/team/app:v2@sha256:" + HEX
    assert str(parse_reference(pinned)) == pinned
    assert str(parse_reference("127.0.0.1:5000/team/app@sha256:" + HEX)) == \
        "127.0.0.1:5000/team/app@sha256:" + HEX
    assert str(parse_reference("127.0.0.1:5000/team/app")) == "127.0.0.1:5000/team/app:latest"


def test_references_and_digests_are_values_that_cannot_change() -> None:
    ref = parse_reference("127.0.0.1:5000/team/app@sha256:" + HEX)
    assert {ref.digest: 1}[parse_digest("sha256:" + HEX)] == 1  # hashable, equal by value
    assert len({ref, parse_reference("127.0.0.1:5000/team/app@sha256:" + HEX)}) == 1
    with pytest.raises(AttributeError):
        ref.tag = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ref.digest.hex = "b" * 64  # type: ignore[misc,union-attr]


def test_a_tag_is_what_the_manifest_url_asks_for_and_a_layer_shows_12_digits() -> None:
    assert parse_reference("127.0.0.1:5000/app:v7").reference == "v7"
    assert parse_reference("127.0.0.1:5000/app").reference == "latest"
    digest = parse_digest("sha256:" + "0123456789ab" + "c" * 52)
    assert digest.short == "0123456789ab"


def test_a_bracketed_ipv6_loopback_registry_is_loopback() -> None:
    assert parse_reference("[::1]:5000/app").loopback
    assert parse_reference("[::1]:5000/app").base_url(False) == "http://[::1]:5000"
    assert not parse_reference("[2001:db8::1]:5000/app").loopback


@pytest.mark.parametrize("text", ["127.0.0.1:5000/", "127.0.0.1:5000/:v1", ":v1"])
def test_a_reference_without_a_repository_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="no repository name"):
        parse_reference(text)
