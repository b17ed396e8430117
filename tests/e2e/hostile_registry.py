"""A registry that lies, for `bulkfetch pull`'s hostile cases a real registry cannot be made
to produce (a well-formed manifest naming `sha256:../../x`, a Docker-Content-Digest that is
not the body's, a foreign layer at file://). It speaks just enough of the distribution API:
GET /v2/, manifests by tag or digest, blobs by digest, from a table the test fills.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Answer:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200


class HostileRegistry:
    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.requests: list[str] = []
        self.throttled: dict[str, int] = {}  # path -> 429s still to answer before the rest
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append(self.path)
                answer = registry.answers.get(self.path)
                if registry.throttled.get(self.path, 0) > 0:
                    registry.throttled[self.path] -= 1
                    answer = Answer(b"slow down", {"Retry-After": "1"}, status=429)
                if self.path == "/v2/":
                    answer = Answer(b"{}")
                if answer is None:
                    answer = Answer(b'{"errors":[{"code":"NOT_FOUND"}]}', status=404)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    if value:  # an empty value leaves the header out (Content-Length: none)
                        self.send_header(name, value)
                if "Content-Length" not in answer.headers:
                    self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def blob(self, repo: str, digest: str, body: bytes, **headers: str) -> None:
        self.answers[f"/v2/{repo}/blobs/{digest}"] = Answer(body, dict(headers))

    def image(self, repo: str, tag: str, layers: list[tuple[bytes, dict[str, object]]],
              manifest_digest_header: str | None = None,
              extra_headers: dict[str, str] | None = None) -> bytes:
        """Serve an image whose layers are (body, descriptor overrides); returns the
        manifest. Each layer's blob is served under the descriptor's digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        self.blob(repo, sha256(config), config)
        descriptors = []
        for body, overrides in layers:
            descriptor = {"mediaType": LAYER, "digest": sha256(body), "size": len(body),
                          **overrides}
            descriptors.append(descriptor)
            self.blob(repo, str(descriptor["digest"]), body)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": CONFIG, "digest": sha256(config), "size": len(config)},
            "layers": descriptors}).encode()
        headers = {"Content-Type": OCI_MANIFEST,
                   "Docker-Content-Digest": manifest_digest_header or sha256(manifest),
                   **(extra_headers or {})}
        self.answers[f"/v2/{repo}/manifests/{tag}"] = Answer(manifest, headers)
        self.answers[f"/v2/{repo}/manifests/{sha256(manifest)}"] = Answer(manifest, headers)
        return manifest
