"""OCI images for `bulkfetch pull`'s tests, benchmarks and sample registry: built as OCI
layouts from seeded random layers (testing/registry.py serves them) and pushed with skopeo.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"
BLOCK = 1 << 20


@dataclass(frozen=True)
class LayerSpec:
    """An uncompressed tar layer holding one file `layer-<seed>.bin` of `size` bytes derived
    from `seed` alone: the same spec is the same blob, so images can share layers. Each MiB
    is one random block with its index in front: gzip's 32 KiB window finds nothing to
    shrink, and writing runs at disk speed."""

    seed: int
    size: int


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    manifest_digest: str
    config_digest: str
    layers: tuple[tuple[str, int], ...]  # (digest, size) in order


@dataclass(frozen=True)
class BuiltIndex:
    tag: str
    index_digest: str
    images: dict[str, BuiltImage]  # by "os/arch[/variant]"


def _put(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    if not path.exists():
        path.write_bytes(data)
    return "sha256:" + digest


def _layer(layout: Path, spec: LayerSpec) -> tuple[str, int]:
    blobs = layout / "blobs" / "sha256"
    info = tarfile.TarInfo(f"layer-{spec.seed}.bin")
    info.size, info.mode, info.mtime = spec.size, 0o644, 1_700_000_000
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    base = random.Random(spec.seed).randbytes(BLOCK)
    hasher = hashlib.sha256()
    temporary = blobs / f".building-{spec.seed}-{os.getpid()}"
    with open(temporary, "wb") as out:
        def write(data: bytes) -> None:
            out.write(data)
            hasher.update(data)

        write(header)
        left, index = spec.size, 0
        while left > 0:
            block = index.to_bytes(8, "big") + base[8:]
            write(block[:left] if left < BLOCK else block)
            left -= BLOCK
            index += 1
        write(b"\0" * (-spec.size % 512) + b"\0" * 1024)
        size = out.tell()
    digest = hasher.hexdigest()
    os.replace(temporary, blobs / digest)
    return "sha256:" + digest, size


def _index_entries(layout: Path) -> list[dict[str, Any]]:
    path = layout / "index.json"
    if path.exists():
        return list(json.loads(path.read_text())["manifests"])
    return []


def _record(layout: Path, entry: dict[str, Any]) -> None:
    tag = entry["annotations"][REF_NAME]
    entries = [e for e in _index_entries(layout)
               if (e.get("annotations") or {}).get(REF_NAME) != tag] + [entry]
    (layout / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def _image(layout: Path, layers: Sequence[LayerSpec], os_name: str, arch: str,
           variant: str | None) -> tuple[bytes, BuiltImage]:
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    built = [_layer(layout, spec) for spec in layers]
    config = {"architecture": arch, "os": os_name, "config": {},
              "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in built]}}
    if variant:
        config["variant"] = variant
    config_bytes = json.dumps(config).encode()
    config_digest = _put(layout, config_bytes)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest,
                   "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_TAR, "digest": digest, "size": size}
                   for digest, size in built]}).encode()
    return manifest, BuiltImage("", _put(layout, manifest), config_digest, tuple(built))


def build_image(layout: Path, tag: str, layers: Sequence[LayerSpec], *, os_name: str = "linux",
                arch: str = "amd64", variant: str | None = None) -> BuiltImage:
    """Write (or add to) an OCI layout: the image's blobs and an index.json entry `tag`."""
    manifest, image = _image(layout, layers, os_name, arch, variant)
    _record(layout, {"mediaType": OCI_MANIFEST, "digest": image.manifest_digest,
                     "size": len(manifest), "annotations": {REF_NAME: tag}})
    return BuiltImage(tag, image.manifest_digest, image.config_digest, image.layers)


def build_index(layout: Path, tag: str, platforms: dict[str, Sequence[LayerSpec]]) -> BuiltIndex:
    """A multi-platform image index `tag` over one image per "os/arch[/variant]"."""
    images, descriptors = {}, []
    for name, layers in platforms.items():
        os_name, arch, *rest = name.split("/")
        variant = rest[0] if rest else None
        manifest, image = _image(layout, layers, os_name, arch, variant)
        images[name] = BuiltImage(tag, image.manifest_digest, image.config_digest,
                                  image.layers)
        platform = {"os": os_name, "architecture": arch}
        if variant:
            platform["variant"] = variant
        descriptors.append({"mediaType": OCI_MANIFEST, "digest": image.manifest_digest,
                            "size": len(manifest), "platform": platform})
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                        "manifests": descriptors}).encode()
    digest = _put(layout, index)
    _record(layout, {"mediaType": OCI_INDEX, "digest": digest, "size": len(index),
                     "annotations": {REF_NAME: tag}})
    return BuiltIndex(tag, digest, images)


def push(layout: Path, tag: str, registry: str, repo: str, *,
         creds: tuple[str, str] | None = None, all_platforms: bool = False) -> None:
    """skopeo copy of oci:LAYOUT:TAG to the registry, digests kept as built (without
    --preserve-digests skopeo would compress the layers and change them)."""
    command = ["skopeo", "copy", "-q", "--insecure-policy", "--dest-tls-verify=false",
               "--preserve-digests"]
    if all_platforms:
        command.append("--all")
    if creds:
        command += ["--dest-creds", f"{creds[0]}:{creds[1]}"]
    done = subprocess.run([*command, f"oci:{layout}:{tag}", f"docker://{registry}/{repo}:{tag}"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"skopeo push of {tag} failed: {done.stderr.strip()}")
