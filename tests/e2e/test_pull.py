"""`bulkfetch pull` against Debian's docker-registry on loopback, images pushed with skopeo;
the result read back by skopeo and umoci; what was fetched counted in the access logs."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch.testing.images import LayerSpec, build_image, build_index, push
from bulkfetch.testing.registry import BlobHost, Registry, TokenIssuer

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("docker-registry", "skopeo", "umoci")),
    reason="needs docker-registry, skopeo and umoci (bash .ci/run installs them)")

MIB = 1 << 20
V1 = [LayerSpec(1, 200_000), LayerSpec(2, 300_000), LayerSpec(3, 40 * MIB),
      LayerSpec(4, 100_000)]
V2 = [LayerSpec(1, 200_000), LayerSpec(2, 300_000), LayerSpec(3, 40 * MIB),
      LayerSpec(5, 120_000)]


def run_pull(tmp: Path, *args: str, stdin: str | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "xdg-cache"),
                   "DOCKER_CONFIG": str(tmp / "docker"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bulkfetch", "pull", "--plain", *args],
                          capture_output=True, text=True, env=environment, input=stdin,
                          timeout=300)


def blob_gets(registry: Registry, since: int = 0) -> list[str]:
    """Paths of the blob GETs the registry answered with bytes, after entry `since`."""
    return [entry.path for entry in registry.access_log()[since:]
            if entry.method == "GET" and "/blobs/" in entry.path
            and entry.status in (200, 206, 307)]


def refs(dest: Path) -> dict[str, str]:
    index = json.loads((dest / "index.json").read_text())
    return {entry["annotations"]["org.opencontainers.image.ref.name"]: entry["digest"]
            for entry in index["manifests"]}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, dict]]:
    work = tmp_path_factory.mktemp("registry")
    layout = work / "layout"
    built = {"v1": build_image(layout, "v1", V1), "v2": build_image(layout, "v2", V2),
             "multi": build_index(layout, "multi", {"linux/amd64": [LayerSpec(10, 150_000)],
                                                    "linux/arm64": [LayerSpec(11, 160_000)]})}
    with Registry(work / "plain") as registry:
        push(layout, "v1", registry.address, "team/app")
        push(layout, "v2", registry.address, "team/app")
        push(layout, "multi", registry.address, "team/multi", all_platforms=True)
        yield registry, built


def test_a_pulled_layout_is_what_skopeo_and_umoci_read(tmp_path: Path, plain: tuple) -> None:
    registry, built = plain
    dest = tmp_path / "dest"
    since = len(registry.access_log())
    proc = run_pull(tmp_path, f"{registry.address}/team/app:v1", str(dest),
                    "--split-above", "1m", "--parts", "4")
    assert proc.returncode == 0, proc.stderr
    assert refs(dest) == {"v1": built["v1"].manifest_digest}
    for digest, size in built["v1"].layers:
        blob = dest / "blobs" / "sha256" / digest.split(":")[1]
        assert blob.stat().st_size == size
    assert not (dest / ".bulkfetch").exists()
    # the 40 MiB layer came in pieces
    big = built["v1"].layers[2][0]
    assert sum(big in path for path in blob_gets(registry, since)) >= 3
    out = tmp_path / "dir-out"
    check = subprocess.run(["skopeo", "copy", "--insecure-policy", f"oci:{dest}:v1",
                            f"dir:{out}"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    for digest, _ in built["v1"].layers:
        data = (out / digest.split(":")[1]).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    bundle = tmp_path / "bundle"
    unpacked = subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{dest}:v1",
                               str(bundle)], capture_output=True, text=True)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (bundle / "rootfs" / "layer-3.bin").stat().st_size == 40 * MIB


def test_a_second_image_fetches_only_its_new_layers(tmp_path: Path, plain: tuple) -> None:
    registry, built = plain
    dest = tmp_path / "dest"
    assert run_pull(tmp_path, "--no-cache", f"{registry.address}/team/app:v1",
                    str(dest)).returncode == 0
    since = len(registry.access_log())
    proc = run_pull(tmp_path, "--no-cache", f"{registry.address}/team/app:v2", str(dest))
    assert proc.returncode == 0, proc.stderr
    new, config = built["v2"].layers[3][0], built["v2"].config_digest
    assert set(blob_gets(registry, since)) == {f"/v2/team/app/blobs/{new}",
                                               f"/v2/team/app/blobs/{config}"}
    assert set(refs(dest)) == {"v1", "v2"}
    assert "3 already in" in proc.stderr


def test_the_shared_cache_feeds_a_new_layout_without_fetching(tmp_path: Path,
                                                              plain: tuple) -> None:
    registry, built = plain
    cache = tmp_path / "cache"
    first, second = tmp_path / "one", tmp_path / "two"
    assert run_pull(tmp_path, "--cache", str(cache), f"{registry.address}/team/app:v1",
                    str(first)).returncode == 0
    since = len(registry.access_log())
    proc = run_pull(tmp_path, "--cache", str(cache), f"{registry.address}/team/app:v1",
                    str(second))
    assert proc.returncode == 0, proc.stderr
    assert blob_gets(registry, since) == []
    assert "4 from the cache" in proc.stderr
    digest = built["v1"].layers[2][0].split(":")[1]
    assert (second / "blobs" / "sha256" / digest).stat().st_ino == \
        (cache / "blobs" / "sha256" / digest).stat().st_ino


def test_the_platform_is_chosen_from_an_index(tmp_path: Path, plain: tuple) -> None:
    registry, built = plain
    arm = built["multi"].images["linux/arm64"]
    dest = tmp_path / "dest"
    proc = run_pull(tmp_path, "--platform", "linux/arm64",
                    f"{registry.address}/team/multi:multi", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert refs(dest) == {"multi": arm.manifest_digest}
    missing = run_pull(tmp_path, "--platform", "linux/s390x",
                       f"{registry.address}/team/multi:multi", str(tmp_path / "other"))
    assert missing.returncode == 2
    assert "linux/amd64, linux/arm64" in missing.stderr


def test_several_images_share_one_run_and_one_index(tmp_path: Path, plain: tuple) -> None:
    registry, built = plain
    dest = tmp_path / "dest"
    proc = run_pull(tmp_path, "--platform", "linux/amd64", f"{registry.address}/team/app:v1",
                    f"{registry.address}/team/multi:multi", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert refs(dest) == {"v1": built["v1"].manifest_digest,
                          "multi": built["multi"].images["linux/amd64"].manifest_digest}


def test_unpack_builds_the_root_filesystem(tmp_path: Path, plain: tuple) -> None:
    registry, _ = plain
    rootfs = tmp_path / "rootfs"
    proc = run_pull(tmp_path, f"{registry.address}/team/app:v2", str(tmp_path / "dest"),
                    "--unpack", str(rootfs))
    assert proc.returncode == 0, proc.stderr
    assert sorted(path.name for path in rootfs.iterdir()) == [
        "layer-1.bin", "layer-2.bin", "layer-3.bin", "layer-5.bin"]


def _hostile_layout(layout: Path) -> None:
    """An image whose one layer writes through a symlink it plants, and outside by name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/"
        tar.addfile(link)
        member = tarfile.TarInfo("escape/tmp/planted")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"owned"))
    layer = buffer.getvalue()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return "sha256:" + digest

    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [put(layer)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": put(layer), "size": len(layer)}]}).encode()
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(manifest),
        "size": len(manifest), "annotations": {
            "org.opencontainers.image.ref.name": "evil"}}]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def test_unpack_refuses_a_layer_that_writes_through_a_symlink(tmp_path: Path,
                                                              plain: tuple) -> None:
    registry, _ = plain
    _hostile_layout(tmp_path / "evil-layout")
    push(tmp_path / "evil-layout", "evil", registry.address, "team/evil")
    rootfs = tmp_path / "rootfs"
    proc = run_pull(tmp_path, f"{registry.address}/team/evil:evil", str(tmp_path / "dest"),
                    "--unpack", str(rootfs))
    assert proc.returncode == 1
    assert "escape/tmp/planted" in proc.stderr
    assert not Path("/tmp/planted").exists()


def test_htpasswd_credentials_from_the_flag_and_from_the_docker_config(
        tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    built = build_image(layout, "v1", [LayerSpec(20, 50_000)])
    with Registry(tmp_path / "reg", auth="htpasswd", users={"alice": "wonder"}) as registry:
        push(layout, "v1", registry.address, "team/app", creds=("alice", "wonder"))
        ref = f"{registry.address}/team/app:v1"
        anonymous = run_pull(tmp_path, ref, str(tmp_path / "a"))
        assert anonymous.returncode == 2
        assert "--username" in anonymous.stderr
        wrong = run_pull(tmp_path, "--username", "alice", "--password-stdin", ref,
                         str(tmp_path / "b"), stdin="nope\n")
        assert wrong.returncode == 2
        assert "refused the credentials of user 'alice'" in wrong.stderr
        assert "nope" not in wrong.stderr
        right = run_pull(tmp_path, "--username", "alice", "--password-stdin", ref,
                         str(tmp_path / "c"), stdin="wonder\n")
        assert right.returncode == 0, right.stderr
        assert refs(tmp_path / "c") == {"v1": built.manifest_digest}
        (tmp_path / "docker").mkdir()
        (tmp_path / "docker" / "config.json").write_text(json.dumps({"auths": {
            registry.address: {"auth": "YWxpY2U6d29uZGVy"}}}))  # alice:wonder
        configured = run_pull(tmp_path, ref, str(tmp_path / "d"))
        assert configured.returncode == 0, configured.stderr


def test_token_auth_renews_and_blob_redirects_carry_no_authorization(
        tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    built = build_image(layout, "v1", [LayerSpec(30, 6 * MIB), LayerSpec(31, 6 * MIB),
                                       LayerSpec(32, 6 * MIB)])
    with TokenIssuer(tmp_path / "issuer", users={"bob": "builder"}, anonymous=True,
                     ttl_s=2) as issuer, \
            Registry(tmp_path / "reg0", auth="token", issuer=issuer) as first:
        push(layout, "v1", first.address, "team/app", creds=("bob", "builder"))
        with BlobHost(first.data_dir, limit_rate=3 * MIB) as blobs, \
                Registry(tmp_path / "reg1", auth="token", issuer=issuer, redirect_to=blobs,
                         data_dir=first.data_dir) as registry:
            first.stop()
            before = issuer.tokens_issued
            # one layer at a time (-c 2: one big transfer), each ~2 s at 3 MiB/s: the
            # later requests outlive the 2-second token they started with
            proc = run_pull(tmp_path, "--no-cache", "-c", "2",
                            f"{registry.address}/team/app:v1", str(tmp_path / "dest"))
            assert proc.returncode == 0, proc.stderr
            assert refs(tmp_path / "dest") == {"v1": built.manifest_digest}
            served = [entry for entry in blobs.access_log() if entry.status in (200, 206)]
            assert served
            assert all(entry.auth is False for entry in served)
            assert issuer.tokens_issued - before >= 3  # the first, renewed twice or more


def test_a_killed_pull_resumes_from_the_bytes_it_had(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    size = 48 * MIB
    build_image(layout, "v1", [LayerSpec(40, size)])
    with Registry(tmp_path / "reg0") as first:
        push(layout, "v1", first.address, "team/app")
        with BlobHost(first.data_dir, limit_rate=4 * MIB) as blobs, \
                Registry(tmp_path / "reg1", redirect_to=blobs,
                         data_dir=first.data_dir) as registry:
            ref = f"{registry.address}/team/app:v1"
            dest = tmp_path / "dest"
            args = [sys.executable, "-m", "bulkfetch", "pull", "-q", "--no-cache",
                    "--split-above", "1m", "--parts", "3", ref, str(dest)]
            process = subprocess.Popen(args, start_new_session=True)
            partial = dest / ".bulkfetch" / "partial"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until a record says about half is in
                written = 0
                for record in partial.glob("*.json") if partial.exists() else ():
                    with contextlib.suppress(ValueError, KeyError, OSError):
                        written = sum(part[2] for part in json.loads(record.read_text())
                                      ["parts"])
                if written >= size * 0.45:
                    break
                time.sleep(0.05)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            time.sleep(0.01)  # nginx's clock has millisecond steps
            rerun_began = time.time()
            proc = run_pull(tmp_path, "--no-cache", "--split-above", "1m", "--parts", "3",
                            ref, str(dest))
            assert proc.returncode == 0, proc.stderr
            # split by start time: the killed run's requests may be logged after the rerun began
            log = blobs.access_log()
            first_bytes = sum(entry.bytes for entry in log if entry.started < rerun_began)
            rerun_bytes = sum(entry.bytes for entry in log if entry.started >= rerun_began)
            assert first_bytes < size
            assert first_bytes + rerun_bytes >= size
            assert rerun_bytes <= size * 0.6, (first_bytes, rerun_bytes)
            assert not (dest / ".bulkfetch").exists()


def test_a_token_issuer_that_wants_a_user_gets_the_basic_credentials(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    built = build_image(layout, "v1", [LayerSpec(50, 70_000)])
    with TokenIssuer(tmp_path / "issuer", users={"bob": "builder"}, anonymous=False) as issuer, \
            Registry(tmp_path / "reg", auth="token", issuer=issuer) as registry:
        push(layout, "v1", registry.address, "team/app", creds=("bob", "builder"))
        ref = f"{registry.address}/team/app:v1"
        anonymous = run_pull(tmp_path, ref, str(tmp_path / "a"))
        assert anonymous.returncode == 2
        assert "refused anonymous pulls" in anonymous.stderr
        assert not (tmp_path / "a" / "index.json").exists()
        proc = run_pull(tmp_path, "--username", "bob", "--password-stdin", ref,
                        str(tmp_path / "b"), stdin="builder\n")
        assert proc.returncode == 0, proc.stderr
        assert refs(tmp_path / "b") == {"v1": built.manifest_digest}
        assert any(scope == "repository:team/app:pull" for scope in issuer.scopes)


def test_a_docker_v2_image_is_recorded_with_an_oci_manifest(tmp_path: Path,
                                                            plain: tuple) -> None:
    registry, _ = plain
    layout = tmp_path / "layout"
    build_image(layout, "d1", [LayerSpec(60, 90_000), LayerSpec(61, 40_000)])
    pushed = subprocess.run(["skopeo", "copy", "-q", "--insecure-policy",
                             "--dest-tls-verify=false", "--format", "v2s2", f"oci:{layout}:d1",
                             f"docker://{registry.address}/team/docker:d1"],
                            capture_output=True, text=True)
    assert pushed.returncode == 0, pushed.stderr
    dest = tmp_path / "dest"
    proc = run_pull(tmp_path, f"{registry.address}/team/docker:d1", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert "a Docker v2 image" in proc.stderr
    index = json.loads((dest / "index.json").read_text())
    assert index["manifests"][0]["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    copied = subprocess.run(["skopeo", "copy", "--insecure-policy", f"oci:{dest}:d1",
                             f"dir:{tmp_path / 'out'}"], capture_output=True, text=True)
    assert copied.returncode == 0, copied.stderr
    unpacked = subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{dest}:d1",
                               str(tmp_path / "bundle")], capture_output=True, text=True)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (tmp_path / "bundle" / "rootfs" / "layer-61.bin").stat().st_size == 40_000
