"""A registry's small answers are checked before use: a manifest against the digest asked
for and against Docker-Content-Digest, a config blob against its digest and size. Played by
a scripted HTTP server on loopback, one answer list per path."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bulkfetch.config import Timeouts
from bulkfetch.errors import UsageError
from bulkfetch.oci import registry as registry_module
from bulkfetch.oci.auth import Credentials
from bulkfetch.oci.manifest import ACCEPT, OCI_MANIFEST
from bulkfetch.oci.reference import Digest, parse_reference
from bulkfetch.oci.registry import ATTEMPTS, MAX_WAIT_S, Registry, RegistryError, pulls_left
from bulkfetch.util.ports import free_port

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST}).encode()
CONFIG = b'{"architecture": "amd64", "os": "linux"}'

Answer = tuple[int, dict[str, str], bytes]


def sha256(body: bytes) -> Digest:
    return Digest("sha256", hashlib.sha256(body).hexdigest())


class Script:
    """What the server answers: for each path, its answers in turn (the last one repeats),
    and every request seen as (path, Accept, Authorization)."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Answer]] = {}
        self.seen: list[tuple[str, str, str]] = []


@pytest.fixture
def script() -> Iterator[tuple[Script, str]]:
    played = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            played.seen.append((self.path, self.headers.get("Accept", ""),
                                self.headers.get("Authorization", "")))
            answers = played.answers.get(self.path) or [(404, {}, b"")]
            status, headers, body = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield played, f"127.0.0.1:{server.server_address[1]}/team/app"
    finally:
        server.shutdown()
        server.server_close()


def registry(name: str, credentials: Credentials | None = None) -> Registry:
    return Registry(parse_reference(name), plain_http=True, credentials=credentials,
                    timeouts=Timeouts(connect_s=5, idle_s=5))


def test_a_manifest_by_tag_is_named_by_the_digest_of_its_bytes(
        script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [
        (200, {"Docker-Content-Digest": str(sha256(MANIFEST)),
               "RateLimit-Remaining": "76;w=21600", "RateLimit-Limit": "100;w=21600"},
         MANIFEST)]
    fetched = registry(name).manifest("v1")
    assert fetched.body == MANIFEST and fetched.digest == sha256(MANIFEST)
    assert fetched.media_type == OCI_MANIFEST
    assert fetched.pulls_left == "76 of 100 pulls left (per 21600 s)"
    assert played.seen[0][1] == ACCEPT  # every manifest type we read is asked for


def test_a_manifest_by_digest_must_hash_to_that_digest(script: tuple[Script, str]) -> None:
    played, name = script
    pinned = sha256(MANIFEST)
    played.answers[f"/v2/team/app/manifests/{pinned}"] = [(200, {}, MANIFEST)]
    assert registry(name).manifest(str(pinned)).digest == pinned
    other = sha256(b"another manifest")
    played.answers[f"/v2/team/app/manifests/{other}"] = [(200, {}, MANIFEST)]
    with pytest.raises(RegistryError, match="do not match the digest asked for"):
        registry(name).manifest(str(other))


def test_a_manifest_must_match_its_docker_content_digest(script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [
        (200, {"Docker-Content-Digest": str(sha256(b"what it claims"))}, MANIFEST)]
    with pytest.raises(RegistryError, match="do not match its Docker-Content-Digest"):
        registry(name).manifest("v1")


def test_a_malformed_docker_content_digest_is_refused(script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [
        (200, {"Docker-Content-Digest": "sha256:not-hex"}, MANIFEST)]
    with pytest.raises(RegistryError, match="Docker-Content-Digest"):
        registry(name).manifest("v1")


def test_a_manifest_that_is_not_json_is_refused(script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [(200, {}, b"<html>")]
    with pytest.raises(RegistryError, match="not JSON"):
        registry(name).manifest("v1")


@pytest.mark.parametrize(("status", "error", "words"), [
    (404, UsageError, "no such image"),
    (403, UsageError, "refused access"),
    (400, RegistryError, "HTTP 400"),
])
def test_a_manifest_refused_says_why(script: tuple[Script, str], status: int,
                                     error: type[Exception], words: str) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [(status, {}, b"")]
    with pytest.raises(error, match=words):
        registry(name).manifest("v1")
    assert len(played.seen) == 1  # a refusal is not retried


def test_busy_answers_are_retried_until_a_good_one(script: tuple[Script, str]) -> None:
    played, name = script
    busy: Answer = (429, {"Retry-After": "0"}, b"")
    played.answers["/v2/team/app/manifests/v1"] = [
        busy, (503, {"Retry-After": "0"}, b""), (200, {}, MANIFEST)]
    assert registry(name).manifest("v1").body == MANIFEST
    assert len(played.seen) == 3


def test_a_registry_busy_at_every_attempt_is_an_error_after_the_last(
        script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [(503, {"Retry-After": "0"}, b"")]
    with pytest.raises(RegistryError, match="HTTP 503"):
        registry(name).manifest("v1")
    assert len(played.seen) == ATTEMPTS


def test_a_basic_challenge_is_answered_once_and_a_refusal_names_the_user(
        script: tuple[Script, str]) -> None:
    played, name = script
    challenge: Answer = (401, {"WWW-Authenticate": 'Basic realm="r"'}, b"")
    played.answers["/v2/team/app/manifests/v1"] = [challenge, (200, {}, MANIFEST)]
    fetched = registry(name, Credentials("ann", "secret")).manifest("v1")
    assert fetched.body == MANIFEST
    assert played.seen[0][2] == "" and played.seen[1][2].startswith("Basic ")
    played.answers["/v2/team/app/manifests/v2"] = [challenge]
    with pytest.raises(UsageError, match="'ann'"):
        registry(name, Credentials("ann", "wrong")).manifest("v2")
    with pytest.raises(UsageError, match="--username"):  # no credentials to answer with
        registry(name).manifest("v2")


def test_a_small_blob_must_match_its_digest_and_size(script: tuple[Script, str]) -> None:
    played, name = script
    digest = sha256(CONFIG)
    played.answers[f"/v2/team/app/blobs/{digest}"] = [(200, {}, CONFIG)]
    assert registry(name).small_blob(digest, len(CONFIG), "config") == CONFIG
    altered = CONFIG.replace(b"amd64", b"arm64")  # same size, other bytes
    played.answers[f"/v2/team/app/blobs/{digest}"] = [(200, {}, altered)]
    with pytest.raises(RegistryError, match="does not match its digest and size"):
        registry(name).small_blob(digest, len(CONFIG), "config")
    played.answers[f"/v2/team/app/blobs/{digest}"] = [(200, {}, CONFIG)]
    with pytest.raises(RegistryError, match="does not match"):  # the descriptor said longer
        registry(name).small_blob(digest, len(CONFIG) + 1, "config")
    played.answers[f"/v2/team/app/blobs/{digest}"] = [(404, {}, b"")]
    with pytest.raises(RegistryError, match="HTTP 404"):
        registry(name).small_blob(digest, len(CONFIG), "config")


def test_a_blob_larger_than_its_descriptor_is_cut_off(script: tuple[Script, str]) -> None:
    played, name = script
    digest = sha256(CONFIG)
    played.answers[f"/v2/team/app/blobs/{digest}"] = [(200, {}, CONFIG * 100)]
    with pytest.raises(RegistryError, match="broken or hostile"):
        registry(name).small_blob(digest, len(CONFIG), "config")


@pytest.mark.parametrize(("remaining", "limit", "said"), [
    ("76;w=21600", "100;w=21600", "76 of 100 pulls left (per 21600 s)"),
    ("5", "", "5 pulls left"),
    ("5;w=x", "y", "5 pulls left"),
    ("", "100", ""),
    ("many", "100", ""),
])
def test_pulls_left_reads_docker_hubs_rate_limit(remaining: str, limit: str,
                                                 said: str) -> None:
    lines = [b"HTTP/1.1 200 OK\r\n"]
    if remaining:
        lines.append(f"RateLimit-Remaining: {remaining}\r\n".encode())
    if limit:
        lines.append(f"RateLimit-Limit: {limit}\r\n".encode())
    assert pulls_left(lines) == said


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds each retry would sleep (nothing is slept)."""
    slept: list[float] = []
    monkeypatch.setattr(registry_module.time, "sleep", slept.append)
    return slept


def test_a_registry_that_refuses_connections_is_retried_then_named(
        pauses: list[float]) -> None:
    closed = f"127.0.0.1:{free_port()}/team/app"  # nothing listens there
    with pytest.raises(RegistryError, match=r"curl error 7"):
        registry(closed).manifest("v1")
    assert len(pauses) == ATTEMPTS - 1  # retried, with a pause before each
    assert all(0 < wait <= 8.0 * 1.5 for wait in pauses)


def test_a_reply_that_is_not_http_is_not_retried(pauses: list[float]) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def garbage() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-not-a-registry\r\n\r\n")
                conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    try:
        with pytest.raises(RegistryError, match=r"curl error"):
            registry(f"127.0.0.1:{listener.getsockname()[1]}/team/app").manifest("v1")
        assert pauses == []  # a reply like that does not improve on asking again
    finally:
        listener.close()


def test_a_busy_registry_is_waited_for_as_it_asks_and_no_longer_than_the_cap(
        script: tuple[Script, str], pauses: list[float]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [
        (429, {"Retry-After": "3"}, b""), (500, {"Retry-After": "100000"}, b""),
        (502, {}, b""), (200, {}, MANIFEST)]
    assert registry(name).manifest("v1").body == MANIFEST
    assert pauses[:2] == [3.0, MAX_WAIT_S]
    assert 0.25 <= pauses[2] <= 0.25 * 2 ** 3 * 1.5  # the backoff of the third attempt


def test_a_refusal_names_the_image_by_tag_or_by_digest(
        script: tuple[Script, str]) -> None:
    played, name = script
    played.answers["/v2/team/app/manifests/v1"] = [(403, {}, b"")]
    with pytest.raises(UsageError, match=r"team/app:v1: the registry refused access \(HTTP 403"):
        registry(name).manifest("v1")
    digest = str(sha256(MANIFEST))
    played.answers[f"/v2/team/app/manifests/{digest}"] = [(403, {}, b"")]
    with pytest.raises(UsageError, match=f"team/app@{digest}: the registry refused access"):
        registry(name).manifest(digest)


def test_a_manifest_without_a_media_type_takes_the_content_type(
        script: tuple[Script, str]) -> None:
    played, name = script
    plain = json.dumps({"schemaVersion": 2}).encode()
    played.answers["/v2/team/app/manifests/v1"] = [
        (200, {"Content-Type": f"{OCI_MANIFEST}; charset=utf-8"}, plain)]
    fetched = Registry(parse_reference(name), plain_http=True).manifest("v1")  # (defaults)
    assert fetched.media_type == OCI_MANIFEST
    with pytest.raises(AttributeError):
        fetched.body = b"other"  # type: ignore[misc]


def test_an_empty_config_blob_takes_no_byte_more(script: tuple[Script, str]) -> None:
    played, name = script
    empty = sha256(b"")
    played.answers[f"/v2/team/app/blobs/{empty}"] = [(200, {}, b"")]
    assert registry(name).small_blob(empty, 0, "config") == b""
    played.answers[f"/v2/team/app/blobs/{empty}"] = [(200, {}, b"xx")]
    with pytest.raises(RegistryError, match="broken or hostile"):
        registry(name).small_blob(empty, 0, "config")
