"""An OCI image layout on disk (image-spec `image-layout.md`): `oci-layout`, `index.json`,
`blobs/ALG/HEX`. Written as skopeo and umoci read it; every file goes temp + fsync + rename,
so a killed pull leaves the layout as it was or as it is meant to be, never half written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bulkfetch.errors import UsageError
from bulkfetch.oci.reference import Digest
from bulkfetch.util.atomic import write_durably

LAYOUT_FILE = "oci-layout"
INDEX_FILE = "index.json"
LAYOUT_VERSION = "1.0.0"
REF_NAME = "org.opencontainers.image.ref.name"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def prepare(dest: Path) -> None:
    """Make `dest` an image layout (or check that it is one): refuses a directory that
    holds something else, so a pull never scatters blobs into a user's files."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        marker = dest / LAYOUT_FILE
        if marker.exists():
            try:
                version = json.loads(marker.read_bytes()).get("imageLayoutVersion")
            except (ValueError, AttributeError):
                version = None
            if not isinstance(version, str) or not version.startswith("1."):
                raise UsageError(f"{marker} is not an OCI layout marker this version reads; "
                                 "pull into a new directory")
        else:
            unexpected = sorted(entry.name for entry in dest.iterdir()
                                if entry.name not in (".bulkfetch", "blobs", INDEX_FILE))
            if unexpected:
                raise UsageError(f"{dest} is not empty and not an OCI image layout (it holds "
                                 f"{', '.join(unexpected[:3])}...); pull into a new or empty "
                                 "directory")
            write_durably(marker, json.dumps(
                {"imageLayoutVersion": LAYOUT_VERSION}).encode())
        for algorithm in ("sha256", "sha512"):
            (dest / "blobs" / algorithm).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot prepare the image layout {dest}: {exc.strerror or exc}") \
            from None


def blob_path(dest: Path, digest: Digest) -> Path:
    return dest / digest.path


def has_blob(dest: Path, digest: Digest, size: int) -> bool:
    """A blob in place at its size: placed only after it was verified (and fsynced)."""
    try:
        stat = os.lstat(blob_path(dest, digest))
    except OSError:
        return False
    import stat as kinds

    return kinds.S_ISREG(stat.st_mode) and stat.st_size == size


def put_blob(dest: Path, digest: Digest, data: bytes) -> None:
    """A small blob (manifest, index, config) already checked against `digest`."""
    path = blob_path(dest, digest)
    if not has_blob(dest, digest, len(data)):
        write_durably(path, data, 0o444)


def read_index(dest: Path) -> dict[str, object]:
    path = dest / INDEX_FILE
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is unreadable ({exc}); move it away or pull into a new "
                         "directory") from None
    if not isinstance(document, dict) or not isinstance(document.get("manifests"), list):
        raise UsageError(f"{path} is not an OCI image index; pull into a new directory")
    return document


def add_to_index(dest: Path, entries: list[dict[str, object]]) -> None:
    """Record `entries` (descriptors with a ref.name annotation) in index.json, replacing
    any entry of the same name, keeping every other one."""
    document = read_index(dest)
    names = {entry["annotations"][REF_NAME] for entry in entries}  # type: ignore[index]
    kept = [entry for entry in document["manifests"]  # type: ignore[union-attr]
            if not (isinstance(entry, dict)
                    and (entry.get("annotations") or {}).get(REF_NAME) in names)]
    document["manifests"] = kept + entries
    document.setdefault("mediaType", OCI_INDEX)
    write_durably(dest / INDEX_FILE, json.dumps(document, indent=2).encode() + b"\n")
