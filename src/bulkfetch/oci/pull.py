"""`bulkfetch pull`: images from a registry into an OCI image layout.

1. Resolve each reference: its manifest (through an image index to this platform's), its
   config; every answer checked against its digest (oci/registry.py).
2. Sort the blobs: already in DEST, in the shared cache (linked in), or to fetch.
3. Fetch the rest through the download engine (blobs.py): all blobs of all images at
   once, big ones in ranges, each checked against its manifest digest and size, fsynced
   before it is renamed into blobs/; partial blobs stay for the next run.
4. Keep the new blobs in the cache; write each complete image's manifest and config, then
   index.json. An image with a blob missing is not recorded, so the layout never names a
   blob it does not hold.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.config import (
    GetOptions,
    Limits,
    RetryPolicy,
    SinkOptions,
    Timeouts,
    TlsOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.models import Progress, Report
from bulkfetch.oci import layout
from bulkfetch.oci.auth import Credentials, docker_config_credentials
from bulkfetch.oci.blobs import BlobPlan, BlobSpec
from bulkfetch.oci.cache import BlobCache
from bulkfetch.oci.manifest import (
    DOCKER_MANIFEST,
    IMAGE_TYPES,
    INDEX_TYPES,
    MAX_MANIFEST,
    OCI_MANIFEST,
    Descriptor,
    Image,
    ManifestError,
    Platform,
    host_platform,
    parse_image,
    parse_index,
    parse_platform,
    pick,
    to_oci,
)
from bulkfetch.oci.reference import Digest, Reference, parse_reference
from bulkfetch.oci.registry import Fetched, Registry, RegistryError
from bulkfetch.util.atomic import fsync_directory

MAX_CONFIG = 16 << 20  # an image config this big is not one
REF_NAME = layout.REF_NAME


@dataclass(frozen=True)
class PullOptions:
    refs: tuple[str, ...]
    dest: str
    platform: str | None = None  # os/arch[/variant]; None: this machine's
    cache_dir: str | None = None  # None: the default; "" : no cache
    plain_http: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    limits: Limits = field(default_factory=lambda: Limits(workers=1, split_above=16 << 20))
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    tls: TlsOptions = field(default_factory=TlsOptions)


@dataclass
class Resolved:
    """One reference, resolved to the image this platform gets."""

    ref: Reference
    registry: Registry
    manifest: Fetched
    image: Image
    config: bytes

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        return self.image.layers

    def index_entry(self) -> dict[str, object]:
        return {"mediaType": self.manifest.media_type, "digest": str(self.manifest.digest),
                "size": len(self.manifest.body),
                "annotations": {REF_NAME: self.ref.ref_name}}


@dataclass
class PullResult:
    images: list[Resolved]
    complete: list[Resolved]  # recorded in index.json
    present: int = 0  # layers already in DEST
    cached: int = 0  # layers linked or copied from the cache
    fetched: int = 0  # layers the engine fetched now
    fetched_bytes: int = 0
    cached_names: set[str] = field(default_factory=set)
    report: Report | None = None  # the engine's, when it ran
    cache_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return len(self.complete) == len(self.images)


def _credentials(options: PullOptions, ref: Reference) -> Credentials | None:
    if options.username is not None:
        return Credentials(options.username, options.password or "")
    return docker_config_credentials(ref.registry)


def _local_blob(places: list[Path], digest: Digest, size: int) -> bytes | None:
    """A small blob (a config) from DEST or the cache, if one holds it whole."""
    for root in places:
        try:
            data = (root / digest.path).read_bytes()
        except OSError:
            continue
        if len(data) == size and hashlib.new(digest.algorithm, data).hexdigest() == digest.hex:
            return data
    return None


def resolve(options: PullOptions, say: Callable[[str], None],
            places: list[Path] | None = None) -> list[Resolved]:
    """Each reference's manifest and config, checked; UsageError or RegistryError. A config
    DEST or the cache (`places`) holds is read there; manifests are always asked for, since
    a tag may have moved."""
    want: Platform = parse_platform(options.platform) if options.platform else \
        host_platform()
    refs = list(dict.fromkeys(parse_reference(text) for text in options.refs))  # once each
    names = [ref.ref_name for ref in refs]
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise UsageError(f"two images would both be named {twice[0]!r} in DEST/index.json "
                         "(the name is the tag); pull them into separate layouts")
    registries: dict[tuple[str, str], Registry] = {}
    resolved = []
    for ref in refs:
        key = (ref.registry, ref.repository)
        registry = registries.get(key)
        if registry is None:
            registry = registries[key] = Registry(
                ref, plain_http=options.plain_http, credentials=_credentials(options, ref),
                timeouts=options.timeouts, tls=options.tls)
        top = registry.manifest(ref.reference)
        manifest = top
        try:
            if top.media_type in INDEX_TYPES:
                chosen = pick(parse_index(top.body), want, str(ref))
                if chosen.size > MAX_MANIFEST:
                    raise ManifestError(f"the manifest for {want} claims {chosen.size} bytes")
                manifest = registry.manifest(str(chosen.digest))
                if len(manifest.body) != chosen.size:
                    raise ManifestError(f"the manifest for {want} is {len(manifest.body)} "
                                        f"bytes, the index says {chosen.size}")
                if manifest.media_type not in IMAGE_TYPES:
                    raise ManifestError(f"the index's entry for {want} is a "
                                        f"{manifest.media_type}, not an image manifest")
            elif top.media_type not in IMAGE_TYPES:
                raise ManifestError(f"the registry answered a {top.media_type or 'untyped'} "
                                    "manifest; bulkfetch pulls OCI and Docker v2 images")
            image = parse_image(manifest.body)
        except ManifestError as exc:
            raise RegistryError(f"{ref}: {exc}") from None
        if image.config.size > MAX_CONFIG:
            raise RegistryError(f"{ref}: the image config claims {image.config.size:,} bytes")
        config = _local_blob(places or [], image.config.digest, image.config.size) or \
            registry.small_blob(image.config.digest, image.config.size, f"{ref}: config")
        if manifest.media_type == DOCKER_MANIFEST:  # stored as skopeo would: see to_oci
            body = to_oci(image)
            manifest = Fetched(OCI_MANIFEST, body,
                               Digest("sha256", hashlib.sha256(body).hexdigest()),
                               manifest.pulls_left)
            say(f"{ref}: a Docker v2 image, recorded with an OCI manifest")
        layers = len(image.layers)
        say(f"{ref}: {layers} layer{'' if layers == 1 else 's'}, "
            f"{sum(layer.size for layer in image.layers):,} bytes ({manifest.digest})"
            + (f"; the registry says {top.pulls_left}" if top.pulls_left else ""))
        resolved.append(Resolved(ref, registry, manifest, image, config))
    return resolved


def plan_blobs(images: list[Resolved], dest: Path, cache: BlobCache | None,
               result: PullResult) -> BlobPlan:
    """The layers the engine must fetch; those in DEST or the cache are counted instead."""
    specs: dict[str, BlobSpec] = {}
    auth: dict[str, Registry] = {}
    seen: set[str] = set()  # a layer two images share is counted once
    for image in images:
        registry = image.registry
        for layer in image.blobs:
            name = layer.digest.path
            if name in seen:
                continue
            seen.add(name)
            if layout.has_blob(dest, layer.digest, layer.size):
                result.present += 1
            elif cache is not None and cache.place(layer.digest, layer.size,
                                                   layout.blob_path(dest, layer.digest)):
                result.cached += 1
                result.cached_names.add(name)
            else:
                # a foreign layer comes from its own URL, without the registry's credentials
                url = layer.urls[0] if layer.urls else registry.blob_url(layer.digest)
                specs[name] = BlobSpec(name, url, layer.size, layer.digest.algorithm,
                                       layer.digest.hex)
                if not layer.urls:
                    auth[f"{registry.base}/v2/{registry.ref.repository}/"] = registry
    prefixes = sorted(auth, key=len, reverse=True)
    return BlobPlan(tuple(specs.values()),
                    tuple((prefix, auth[prefix].auth) for prefix in prefixes))


def engine_options(options: PullOptions, plan: BlobPlan) -> GetOptions:
    return GetOptions(
        source=plan.identity(), dest=options.dest, plan=plan,
        # Every blob goes the big-body way (streamed, hashed, in ranges when big): a
        # 1-byte in-memory limit stops the first attempt at its headers.
        limits=_with(options.limits, spool_above=1),
        sink=SinkOptions(kind="dir", fsync=True),
        retry=options.retry, timeouts=options.timeouts, tls=options.tls,
        shown_in_flight=256)


def _with(limits: Limits, **changes: object) -> Limits:
    from dataclasses import replace

    return replace(limits, **changes)  # type: ignore[arg-type]


def pull(options: PullOptions, say: Callable[[str], None],
         on_progress: Callable[[Progress], None] | None = None,
         on_plan: Callable[[list[Resolved], BlobPlan, PullResult], None] | None = None,
         ) -> PullResult:
    dest = Path(options.dest)
    cache = None
    if options.cache_dir != "":
        cache = BlobCache(Path(options.cache_dir) if options.cache_dir
                          else _default_cache())
    images = resolve(options, say, [dest] + ([cache.root] if cache else []))
    layout.prepare(dest)
    result = PullResult(images, [])
    plan = plan_blobs(images, dest, cache, result)
    if on_plan is not None:
        on_plan(images, plan, result)
    if plan.blobs:
        from bulkfetch.runners.local import run

        result.report = run(engine_options(options, plan), on_progress=on_progress)
    for spec in plan.blobs:
        path = dest / spec.name
        if layout.has_blob(dest, _digest(spec), spec.size):
            result.fetched += 1
            result.fetched_bytes += spec.size
            if cache is not None:
                try:
                    cache.keep(_digest(spec), spec.size, path)
                except OSError as exc:
                    result.cache_errors.append(f"{spec.name}: {exc.strerror or exc}")
            else:
                os.chmod(path, 0o444)
    for algorithm in ("sha256", "sha512"):
        fsync_directory(dest / "blobs" / algorithm)
    for image in images:
        if all(layout.has_blob(dest, layer.digest, layer.size) for layer in image.blobs):
            layout.put_blob(dest, image.image.config.digest, image.config)
            layout.put_blob(dest, image.manifest.digest, image.manifest.body)
            if cache is not None:
                config = image.image.config
                try:
                    cache.keep(config.digest, config.size, layout.blob_path(dest,
                                                                            config.digest))
                except OSError as exc:
                    result.cache_errors.append(f"{config.digest}: {exc.strerror or exc}")
            result.complete.append(image)
    if result.complete:
        layout.add_to_index(dest, [image.index_entry() for image in result.complete])
    if result.ok and (result.report is None or not result.report.files_failed):
        shutil.rmtree(dest / ".bulkfetch", ignore_errors=True)  # nothing left to resume
    return result


def _digest(spec: BlobSpec) -> Digest:
    return Digest(spec.algorithm, spec.hex)


def _default_cache() -> Path:
    from bulkfetch.oci.cache import default_cache_dir

    return default_cache_dir()


def check_unpack_target(rootfs: str, refs: tuple[str, ...]) -> None:
    if len(refs) != 1:
        raise UsageError("--unpack takes one image; give one REF")
    path = Path(rootfs)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--unpack {rootfs}: not an empty directory; give a new one")
