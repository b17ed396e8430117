"""Manifests and image indexes (OCI and Docker v2), read strictly, and platform choice.

Everything here comes from the network: a descriptor is used only when its media type,
digest (oci.reference.parse_digest) and size are well-formed, and a foreign layer's URL only
when it is http(s).
"""

from __future__ import annotations

import json
import platform as host
from dataclasses import dataclass
from urllib.parse import urlsplit

from bulkfetch.errors import UsageError
from bulkfetch.oci.reference import Digest, parse_digest

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
IMAGE_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
# What we ask for, best first: the registry returns an OCI manifest only when asked for it.
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
MAX_MANIFEST = 4 << 20  # the distribution spec's limit on a manifest's size
MAX_SIZE = (1 << 53) - 1  # a descriptor's size must be an exact JSON integer
# Layers whose bytes may live outside the registry (descriptor `urls`).
FOREIGN_TYPES = frozenset({
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
})


class ManifestError(ValueError):
    """A manifest or index that is not what the spec says it must be."""


@dataclass(frozen=True, slots=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: Digest
    size: int
    urls: tuple[str, ...] = ()
    platform: Platform | None = None


@dataclass(frozen=True, slots=True)
class Image:
    config: Descriptor
    layers: tuple[Descriptor, ...]


_MACHINES = {"x86_64": ("amd64", ""), "amd64": ("amd64", ""), "aarch64": ("arm64", "v8"),
             "arm64": ("arm64", "v8"), "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"),
             "i386": ("386", ""), "i686": ("386", ""), "ppc64le": ("ppc64le", ""),
             "s390x": ("s390x", ""), "riscv64": ("riscv64", "")}


def host_platform() -> Platform:
    """This machine's platform as image indexes name it."""
    machine = host.machine().lower()
    architecture, variant = _MACHINES.get(machine, (machine, ""))
    return Platform("linux", architecture, variant)


def parse_platform(text: str) -> Platform:
    parts = text.strip().split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise UsageError(f"--platform {text!r}: give os/arch or os/arch/variant, e.g. "
                         "linux/amd64 or linux/arm64/v8")
    return Platform(*(part.lower() for part in parts))


def media_type(body: bytes, content_type: str) -> str:
    """The document's own mediaType, else the response's Content-Type."""
    try:
        document = json.loads(body)
    except ValueError:
        raise ManifestError("the manifest is not JSON") from None
    if not isinstance(document, dict):
        raise ManifestError("the manifest is not a JSON object")
    declared = document.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    return content_type.split(";")[0].strip().lower()


def _descriptor(raw: object, where: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where} is not a JSON object")
    kind = raw.get("mediaType")
    if not isinstance(kind, str) or not kind or len(kind) > 255:
        raise ManifestError(f"{where} has no usable mediaType")
    try:
        digest = parse_digest(raw.get("digest"), f"{where}'s digest")
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    size = raw.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SIZE:
        raise ManifestError(f"{where} ({digest}) has no usable size ({size!r})")
    urls = raw.get("urls") or []
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise ManifestError(f"{where} ({digest}) has malformed urls")
    for url in urls:
        if urlsplit(url).scheme.lower() not in ("http", "https") or not urlsplit(url).netloc:
            raise ManifestError(f"{where} ({digest}) names a foreign URL {url[:100]!r}; only "
                                "http(s) URLs are fetched")
    found = raw.get("platform")
    platform = None
    if isinstance(found, dict):
        os_name, arch = found.get("os"), found.get("architecture")
        variant = found.get("variant") or ""
        if isinstance(os_name, str) and isinstance(arch, str) and isinstance(variant, str):
            platform = Platform(os_name.lower(), arch.lower(), variant.lower())
    return Descriptor(kind, digest, size, tuple(urls), platform)


def _document(body: bytes) -> dict[str, object]:
    document = json.loads(body)
    if document.get("schemaVersion") != 2:
        raise ManifestError(f"schemaVersion {document.get('schemaVersion')!r}; bulkfetch "
                            "reads version 2 (OCI and Docker v2) manifests")
    return document  # type: ignore[no-any-return]


def parse_index(body: bytes) -> tuple[Descriptor, ...]:
    manifests = _document(body).get("manifests")
    if not isinstance(manifests, list):
        raise ManifestError("the image index has no manifests list")
    return tuple(_descriptor(raw, f"manifests[{at}]") for at, raw in enumerate(manifests))


def parse_image(body: bytes) -> Image:
    document = _document(body)
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise ManifestError("the manifest has no layers list")
    config = _descriptor(document.get("config"), "config")
    if config.urls:
        raise ManifestError("the config descriptor names foreign URLs")
    return Image(config, tuple(_descriptor(raw, f"layers[{at}]") for at, raw in
                               enumerate(layers)))


# Docker's media types and their OCI equals, for an image stored in an OCI layout: skopeo's
# oci: transport and umoci read OCI manifests only (a Docker one: "no descriptor found").
_TO_OCI = {
    DOCKER_MANIFEST: OCI_MANIFEST,
    "application/vnd.docker.container.image.v1+json": "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.image.rootfs.diff.tar.gzip":
        "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd":
        "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
}


def to_oci(image: Image) -> bytes:
    """The OCI manifest of an image a Docker v2 manifest describes, as skopeo writes it when
    copying docker:// to oci:: the same config and layer blobs, OCI media types. (Its bytes,
    and so its digest, differ from the registry's manifest.)"""
    def described(descriptor: Descriptor) -> dict[str, object]:
        found: dict[str, object] = {
            "mediaType": _TO_OCI.get(descriptor.media_type, descriptor.media_type),
            "digest": str(descriptor.digest), "size": descriptor.size}
        if descriptor.urls:
            found["urls"] = list(descriptor.urls)
        return found

    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": described(image.config),
                       "layers": [described(layer) for layer in image.layers]},
                      separators=(",", ":")).encode()


def _variant_matches(want: Platform, have: Platform) -> bool:
    if not want.variant:
        return True
    # arm64 images often omit their (only) variant v8
    return have.variant == want.variant or (
        want.architecture == "arm64" and want.variant == "v8" and not have.variant)


def pick(manifests: tuple[Descriptor, ...], want: Platform, what: str) -> Descriptor:
    """The manifest of an index for `want`; UsageError listing what the index has."""
    for descriptor in manifests:
        have = descriptor.platform
        if descriptor.media_type in IMAGE_TYPES and have is not None \
                and (have.os, have.architecture) == (want.os, want.architecture) \
                and _variant_matches(want, have):
            return descriptor
    offered = sorted({str(d.platform) for d in manifests if d.platform is not None})
    raise UsageError(f"{what} has no image for {want}; it has "
                     f"{', '.join(offered) or 'no platform-tagged images'} "
                     "(choose one with --platform)")
