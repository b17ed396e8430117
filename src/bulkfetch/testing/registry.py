"""Real registries on loopback for `bulkfetch pull`'s tests and benchmarks (../shared/docs/
REAL-SERVERS.md): Debian's docker-registry with no auth, htpasswd or token auth, a token
issuer signing RS256 JWTs (x5c), and nginx serving the registry's storage for its redirect
middleware (optionally paced per connection, as a CDN). The images they hold are built in
testing/images.py.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bulkfetch.testing.images import LayerSpec, build_image, build_index, push
from bulkfetch.util.ports import free_port, port_is_free


# -- servers -------------------------------------------------------------------------------
def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str,
                   log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{what} did not listen within 20 s: "
                       f"{log.read_text(errors='replace')[-2000:]}")


@dataclass(frozen=True)
class LogEntry:
    method: str
    path: str
    status: int
    bytes: int
    auth: bool | None = None  # whether an Authorization header came (blob host only)
    range: str = ""
    # when the request began (blob host only): nginx logs a request when it ends, and an
    # aborted one only once nginx notices, so a log position cannot split two runs; this can
    started: float = 0.0


class _Process:
    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """End the server and whatever it started (nginx's workers): it leads a session."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """The registry's token service: GET /token?service=S&scope=repository:R:pull[,push].
    Anonymous callers get pull (when `anonymous`); `users` with Basic get pull and push; a
    wrong password gets 401. Tokens live `ttl_s` seconds."""

    def __init__(self, workdir: Path, *, users: dict[str, str] | None = None,
                 anonymous: bool = True, ttl_s: int = 300, service: str = "bulkfetch-test",
                 issuer: str = "bulkfetch-test-issuer") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        workdir.mkdir(parents=True, exist_ok=True)
        self.users, self.anonymous, self.ttl_s = dict(users or {}), anonymous, ttl_s
        self.service, self.issuer = service, issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert_path = workdir / "issuer.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.tokens_issued = 0
        self.refused = 0
        self.scopes: list[str] = []
        self._lock = threading.Lock()
        issuer_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer_self._answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> TokenIssuer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        parts = urlsplit(request.path)
        query = parse_qs(parts.query)
        header = request.headers.get("Authorization", "")
        user = None
        if header.startswith("Basic "):
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(name) != password:
                return self._send(request, 401, {"details": "bad credentials"})
            user = name
        elif not self.anonymous:
            return self._send(request, 401, {"details": "credentials needed"})
        access = []
        for scope in query.get("scope", []):
            self.scopes.append(scope)
            kind, _, rest = scope.partition(":")
            repo, _, actions = rest.rpartition(":")
            granted = [a for a in actions.split(",") if a == "pull" or user is not None]
            access.append({"type": kind, "name": repo, "actions": granted})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": user or "", "aud": query.get("service", [""])[0],
                  "exp": now + self.ttl_s, "nbf": now - 5, "iat": now, "jti": uuid.uuid4().hex,
                  "access": access}
        head = {"alg": "RS256", "typ": "JWT", "x5c": [self.x5c]}
        signing = f"{_b64url(json.dumps(head).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        token = f"{signing}.{_b64url(signature)}"
        with self._lock:
            self.tokens_issued += 1
        issued = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._send(request, 200, {"token": token, "access_token": token,
                                  "expires_in": self.ttl_s, "issued_at": issued})

    def _send(self, request: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        if status == 401:
            with self._lock:
                self.refused += 1
        data = json.dumps(body).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


class BlobHost(_Process):
    """nginx serving the registry's storage directory where its redirect middleware sends
    blob GETs (distribution 2.8 keeps the base URL's scheme and host, and the path is the
    storage path: /docker/registry/v2/blobs/sha256/AB/HEX/data). `limit_rate` paces each
    connection. The access log records whether an Authorization header came, never it."""

    def __init__(self, data_dir: Path, *, limit_rate: int = 0, workdir: Path | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.work = Path(workdir) if workdir else self.data_dir.parent / \
            f"blobhost-{uuid.uuid4().hex[:8]}"
        self.limit_rate = limit_rate
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> BlobHost:
        self.work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = self.work / "access.log"
        self.log_path.touch()
        user = "user root;\n" if os.geteuid() == 0 else ""
        pace = f"limit_rate {self.limit_rate};" if self.limit_rate else ""
        config = self.work / "nginx.conf"
        config.write_text(f"""{user}worker_processes 1;
pid {self.work / 'nginx.pid'};
error_log {self.work / 'error.log'} warn;
events {{ worker_connections 1024; }}
http {{
  map $http_authorization $auth {{ "" no; default yes; }}
  log_format blobs '$request_method $uri $status $body_bytes_sent $msec $request_time '
                   'auth=$auth range=$http_range';
  access_log {self.log_path} blobs;
  client_body_temp_path {self.work}; proxy_temp_path {self.work};
  fastcgi_temp_path {self.work}; uwsgi_temp_path {self.work}; scgi_temp_path {self.work};
  server {{
    listen 127.0.0.1:{self.port};
    root {self.data_dir};
    location / {{ {pace} }}
  }}
}}
""")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        errors = self.work / "stderr"
        with open(errors, "wb") as err:
            self.process = subprocess.Popen([nginx, "-c", str(config), "-g", "daemon off;"],
                                            stdout=subprocess.DEVNULL, stderr=err,
                                            start_new_session=True)
        _wait_for_port(self.port, self.process, "nginx", errors)
        return self

    def access_log(self) -> list[LogEntry]:
        entries = []
        for line in self.log_path.read_text().splitlines():
            fields = line.split(" ", 7)
            if len(fields) < 8:
                continue
            entries.append(LogEntry(fields[0], fields[1], int(fields[2]), int(fields[3]),
                                    fields[6] == "auth=yes", fields[7][len("range="):],
                                    float(fields[4]) - float(fields[5])))
        return entries


_ACCESS = re.compile(r'"(\w+) (\S+) HTTP/[\d.]+" (\d{3}) (\d+|-)')


def _htpasswd(users: dict[str, str]) -> str:
    import bcrypt  # the registry reads bcrypt hashes only (test extra)

    return "".join(f"{name}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n"
                   for name, password in users.items())


@dataclass
class Registry(_Process):
    """docker-registry on 127.0.0.1 with a config of ours (never the packaged one, which
    listens on every interface). `data_dir` may be another registry's storage: a second
    registry over the same blobs (e.g. with redirects) without pushing again."""

    workdir: Path
    auth: str | None = None  # None | "htpasswd" | "token"
    users: dict[str, str] | None = None
    issuer: TokenIssuer | None = None
    redirect_to: BlobHost | str | None = None
    data_dir: Path | None = None
    port: int = 0
    log_path: Path = field(init=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Registry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = Path(self.data_dir or self.workdir / "data")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config: dict[str, Any] = {
            "version": 0.1, "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {"filesystem": {"rootdirectory": str(self.data_dir)},
                        "delete": {"enabled": True}},
            "http": {"addr": self.address}}
        if self.auth == "htpasswd":
            passwords = self.workdir / "htpasswd"
            passwords.write_text(_htpasswd(self.users or {}))
            config["auth"] = {"htpasswd": {"realm": "bulkfetch-test", "path": str(passwords)}}
        elif self.auth == "token":
            if self.issuer is None:
                raise ValueError("auth='token' needs an issuer")
            config["auth"] = {"token": {"realm": self.issuer.realm,
                                        "service": self.issuer.service,
                                        "issuer": self.issuer.issuer,
                                        "rootcertbundle": str(self.issuer.cert_path)}}
        if self.redirect_to is not None:
            base = self.redirect_to.url if isinstance(self.redirect_to, BlobHost) \
                else self.redirect_to
            config["middleware"] = {"storage": [{"name": "redirect",
                                                 "options": {"baseurl": base}}]}
        path = self.workdir / "config.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = self.workdir / "registry.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(["docker-registry", "serve", str(path)],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        _wait_for_port(self.port, self.process, "docker-registry", self.log_path)
        return self

    def access_log(self) -> list[LogEntry]:
        """The combined-log lines, in order."""
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = _ACCESS.search(line)
            if match and not line.startswith("time="):
                entries.append(LogEntry(match[1], match[2], int(match[3]),
                                        0 if match[4] == "-" else int(match[4])))
        return entries


# -- python -m bulkfetch.testing.registry: a registry holding sample images, for the docs ----
SAMPLE_APP_V1 = (LayerSpec(101, 100_000), LayerSpec(102, 1 << 20), LayerSpec(103, 24 << 20))
SAMPLE_APP_V2 = (LayerSpec(101, 100_000), LayerSpec(103, 24 << 20), LayerSpec(104, 300_000))
SAMPLE_PLATFORMS = {"linux/amd64": (LayerSpec(105, 200_000),),
                    "linux/arm64": (LayerSpec(106, 210_000),)}


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _sample_images(work: Path, port: int, users: dict[str, str] | None) -> list[str]:
    """Push the sample images into a registry on a private port (then stopped), so that
    the registry on `port` answers only once every image is there; one line each."""
    layout = work / "layout"
    v1 = build_image(layout, "v1", SAMPLE_APP_V1)
    v2 = build_image(layout, "v2", SAMPLE_APP_V2)
    build_index(work / "multi", "v1", SAMPLE_PLATFORMS)  # its own layout: tag v1 again
    creds = next(iter(users.items())) if users else None
    auth = "htpasswd" if users else None
    with Registry(work / "push", auth=auth, users=users, data_dir=work / "data") as pushing:
        push(layout, "v1", pushing.address, "sample/app", creds=creds)
        push(layout, "v2", pushing.address, "sample/app", creds=creds)
        push(work / "multi", "v1", pushing.address, "sample/multi", creds=creds,
             all_platforms=True)
    shutil.rmtree(layout)  # the registry holds the blobs now
    shutil.rmtree(work / "multi")
    shared = sum(1 for layer in v2.layers if layer in v1.layers)
    here = f"127.0.0.1:{port}"
    return [f"image {here}/sample/app:v1 ({len(v1.layers)} layers, "
            f"{_mb(sum(size for _, size in v1.layers))})",
            f"image {here}/sample/app:v2 ({len(v2.layers)} layers, "
            f"{_mb(sum(size for _, size in v2.layers))}; {shared} of them as in v1)",
            f"image {here}/sample/multi:v1 (an index: {', '.join(SAMPLE_PLATFORMS)})"]


def main(argv: Sequence[str] | None = None) -> int:
    """Serve Debian's docker-registry on 127.0.0.1:PORT holding sample images, print the
    references to pull, and serve until Ctrl-C or SIGTERM; the data goes with it."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bulkfetch.testing.registry",
        description="A container registry on loopback holding sample images to pull: "
                    "docker-registry (plain HTTP), images pushed with skopeo. Serves until "
                    "Ctrl-C; its data is removed then.")
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 "
                        "(default: 5000)")
    parser.add_argument("--user", metavar="NAME:PASSWORD", default=None,
                        help="require this user (Basic auth over htpasswd; needs bcrypt, "
                             "in the test extra)")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("docker-registry", "skopeo") if shutil.which(tool) is None]
    if missing:
        parser.exit(2, f"error: {' and '.join(missing)} not found: apt-get install "
                       "docker-registry skopeo (bash .ci/run installs them)\n")
    users = None
    if args.user is not None:
        name, colon, password = args.user.partition(":")
        if not (colon and name and password):
            parser.exit(2, "error: --user wants NAME:PASSWORD, both non-empty\n")
        users = {name: password}
    if not 0 < args.port < 65536 or not port_is_free(args.port):
        parser.exit(2, f"error: port {args.port} on 127.0.0.1 is in use or invalid: stop "
                       "what listens there, or give another --port\n")

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-registry-"))
    registry = Registry(work / "serve", auth="htpasswd" if users else None, users=users,
                        data_dir=work / "data", port=args.port)
    try:
        print(f"building and pushing the sample images (data in {work}) ...", file=sys.stderr)
        images = _sample_images(work, args.port, users)
        with registry:
            auth = f"Basic auth, user {args.user.partition(':')[0]}" if users else "no auth"
            print(f"serving {registry.address} (docker-registry, plain HTTP, {auth}; "
                  f"data in {work}, removed on exit)")
            for line in images:
                print(line)
            pull = f"bulkfetch pull {registry.address}/sample/app:v1 ./layout"
            if users:
                name, _, password = args.user.partition(":")
                pull = (f"echo {shlex.quote(password)} | bulkfetch pull --username "
                        f"{shlex.quote(name)} --password-stdin "
                        f"{registry.address}/sample/app:v1 ./layout")
            print(f"pull one: {pull}")
            print("Stop with Ctrl-C.", flush=True)
            assert registry.process is not None
            while registry.process.poll() is None:
                time.sleep(0.5)
            print(f"docker-registry exited: see {registry.log_path}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:  # docker-registry or skopeo failed: say what they said
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
