"""Image references (`registry/repo:tag`, `repo@sha256:...`) and blob digests, checked.

Both come from the user or from a registry's manifests, and both end up in URLs and in file
paths (a blob is stored as blobs/ALGORITHM/HEX): nothing is used before it matches the
grammar of the distribution spec exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bulkfetch.errors import UsageError

DOCKER_HUB = "registry-1.docker.io"  # where docker.io and short names are pulled from
_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")

# The distribution spec's grammar (docker/distribution's reference package).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*"
                   r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
# Algorithms we verify, and the length of their hex digests.
DIGEST_LENGTHS = {"sha256": 64, "sha512": 128}
_DIGEST = re.compile(r"([a-z0-9]+(?:[.+_-][a-z0-9]+)*):([a-zA-Z0-9=_-]+)")


@dataclass(frozen=True, slots=True)
class Digest:
    algorithm: str  # "sha256" | "sha512"
    hex: str  # lower-case, exactly DIGEST_LENGTHS[algorithm] digits

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def short(self) -> str:
        """The 12 hex digits `docker pull` shows for a layer."""
        return self.hex[:12]

    @property
    def path(self) -> str:
        """Where the blob lives in an OCI layout (and in the cache): blobs/ALG/HEX."""
        return f"blobs/{self.algorithm}/{self.hex}"


def parse_digest(text: object, what: str = "digest") -> Digest:
    """A digest as `algorithm:hex`, or ValueError naming `what` and the problem. Only the
    algorithms we can verify are accepted: a blob we cannot check is never stored."""
    if not isinstance(text, str):
        raise ValueError(f"{what} {text!r} is not a string")
    match = _DIGEST.fullmatch(text)
    if match is None:
        raise ValueError(f"{what} {text!r} is not of the form algorithm:hex")
    algorithm, value = match[1], match[2]
    length = DIGEST_LENGTHS.get(algorithm)
    if length is None:
        raise ValueError(f"{what} {text!r} uses the algorithm {algorithm!r}; bulkfetch "
                         f"verifies {', '.join(DIGEST_LENGTHS)} only")
    if len(value) != length or not re.fullmatch(r"[0-9a-f]+", value):
        raise ValueError(f"{what} {text!r}: a {algorithm} digest is {length} lower-case hex "
                         "digits")
    return Digest(algorithm, value)


@dataclass(frozen=True, slots=True)
class Reference:
    registry: str  # host[:port], as URLs use it
    repository: str  # e.g. library/alpine
    tag: str | None
    digest: Digest | None

    @property
    def reference(self) -> str:
        """What the manifest URL asks for: the digest when pinned, else the tag."""
        return str(self.digest) if self.digest is not None else self.tag or "latest"

    @property
    def ref_name(self) -> str:
        """The name index.json records (org.opencontainers.image.ref.name): the tag, as
        skopeo's oci:DIR:TAG reads it, or the digest when only a digest was given."""
        return self.tag if self.tag is not None else str(self.digest)

    @property
    def loopback(self) -> bool:
        host = self.registry.rsplit(":", 1)[0] if not self.registry.startswith("[") \
            else self.registry.split("]")[0] + "]"
        return host in LOOPBACK_HOSTS

    def base_url(self, plain_http: bool) -> str:
        """A registry on loopback is spoken to over plain HTTP, as Docker does; any other
        over HTTPS unless the user asked for plain HTTP."""
        scheme = "http" if plain_http or self.loopback else "https"
        return f"{scheme}://{self.registry}"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> Reference:
    """REF as Docker reads it: `[registry/]repo[:tag][@digest]`; a first component with a
    dot or a port, or `localhost`, is a registry, else the image is on Docker Hub, where a
    one-component name is an official image (`alpine` -> `library/alpine`). Raises
    UsageError naming REF."""
    def refuse(why: str) -> UsageError:
        return UsageError(f"image reference {text!r}: {why}")

    rest, at, digest_text = text.strip().partition("@")
    digest = None
    if at:
        try:
            digest = parse_digest(digest_text, "the digest")
        except ValueError as exc:
            raise refuse(str(exc)) from None
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"
                  or first.startswith("[")):
        registry, path = first, remainder
        if not _HOST.fullmatch(registry):
            raise refuse(f"{registry!r} is not a registry host[:port]")
    else:
        registry, path = "docker.io", rest
    tag = None
    name, colon, maybe_tag = path.rpartition(":")
    if colon and "/" not in maybe_tag:
        path, tag = name, maybe_tag
        if not _TAG.fullmatch(tag):
            raise refuse(f"tag {tag!r} is not a valid tag (letters, digits, _ . -, at most "
                         "128, not starting with . or -)")
    if not path:
        raise refuse("no repository name")
    if not _REPOSITORY.fullmatch(path):
        raise refuse(f"repository {path!r} is not a valid name (lower-case letters, digits "
                     "and separators . _ __ -, in components joined by /)")
    if registry in _HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, path, tag, digest)
