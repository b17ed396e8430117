"""`bulkfetch get` over TLS against real nginx with a self-signed certificate (made by the
openssl binary): a refused certificate stops the run at once with exit status 2 and says how
to trust it, for the listing and for file transfers alike; --ca-bundle, each CA variable of
the environment and --insecure make the same run complete; connections are reused."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from getkit import assert_complete, expected_files
from test_nginx_export import Nginx, _export, _nginx_binary

from bulkfetch.net.tls import CA_VARIABLES
from bulkfetch.util.ports import free_port

pytestmark = pytest.mark.nginx

FILES, PAGE = 120, 20  # 6 list pages
WORKERS, CONCURRENCY = 2, 4


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the openssl binary is missing")
        pytest.skip("the openssl binary is not installed")
    return found


def _self_signed(directory: Path, name: str, subject_ip: str = "127.0.0.1") -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [_openssl(), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", f"/CN={subject_ip}",
         "-addext", f"subjectAltName=IP:{subject_ip}"],
        check=True, capture_output=True, timeout=60)
    return cert, key


@dataclass
class TlsServer:
    url: str
    port: int
    cert: Path  # the server's own certificate: what a client must trust
    other: Path  # a certificate of nobody involved (a bundle that does not help)
    run: Path  # nginx's logs

    def log_marks(self) -> tuple[int, int]:
        return ((self.run / "access.log").stat().st_size,
                (self.run / "error.log").stat().st_size)

    def since(self, marks: tuple[int, int]) -> tuple[list[str], set[str]]:
        """(requests answered, connections opened but never asked anything) since `marks`."""
        time.sleep(0.3)  # nginx logs a connection's end once it sees the client go
        with open(self.run / "access.log") as log:
            log.seek(marks[0])
            requests = log.read().splitlines()
        with open(self.run / "error.log") as log:
            log.seek(marks[1])
            lines = log.read().splitlines()
        # a client that gave up in or right after the handshake: "client closed connection
        # while waiting for request", "peer closed connection in SSL handshake", ...
        refused = {found[1] for line in lines if "keepalive" not in line
                   if (found := re.search(r"\*(\d+) ", line))}
        return requests, refused


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """The export of a data set, served by nginx over TLS with a self-signed certificate:
    the export's own nginx.conf with `ssl` on its listen line, an access log naming each
    request's connection, and the info-level error log where refused handshakes show."""
    _nginx_binary()
    base = tmp_path_factory.mktemp("tls")
    cert, key = _self_signed(base, "server")
    other, _ = _self_signed(base, "other")
    port = free_port()
    export = base / "export"
    done = _export(export, port, "--files", str(FILES), "--page-size", str(PAGE))
    assert done.returncode == 0, done.stderr
    run = export / "run"
    text = (export / "nginx.conf").read_text()
    for old, new in (
        (f"listen 127.0.0.1:{port} backlog=4096;",
         f"listen 127.0.0.1:{port} ssl backlog=4096;\n"
         f"        ssl_certificate '{cert}';\n        ssl_certificate_key '{key}';"),
        ("    access_log off;\n",
         "    log_format tls '$connection $request $status';\n"
         f"    access_log '{run}/access.log' tls;\n"),
        ("error.log' warn;", "error.log' info;"),
    ):
        assert text.count(old) == 1, f"the export's nginx.conf changed: no {old!r}"
        text = text.replace(old, new)
    config = export / "nginx-tls.conf"
    config.write_text(text)
    nginx = Nginx(config, port).start()
    try:
        (run / "access.log").touch()
        (run / "error.log").touch()
        # The readiness probe's connection (*1) is logged when nginx sees it close, which can
        # be after the first test took its marks: wait for it, so no test counts it.
        deadline = time.monotonic() + 10
        while "*1 " not in (run / "error.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield TlsServer(f"https://127.0.0.1:{port}", port, cert, other, run)
    finally:
        nginx.stop()


def _env(**variables: str) -> dict[str, str]:
    """This process's environment without any CA variable, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in CA_VARIABLES}
    return env | variables


def _get(*args: str, env: dict[str, str] | None = None,
         timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    """The real CLI, quiet, 2 workers; (the process, seconds it took)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bulkfetch", "get", *args, "--workers", str(WORKERS),
         "--concurrency", str(CONCURRENCY), "--quiet"],
        capture_output=True, text=True, timeout=timeout, env=env if env is not None else _env())
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, time.monotonic() - started


def _nothing_stored(dest: Path) -> None:
    """Stopped on the user's mistake before anything was stored: no DEST, no journal."""
    assert not dest.exists(), os.listdir(dest)


def _says_how_to_trust(stderr: str, server: TlsServer) -> None:
    text = " ".join(stderr.split())  # as one line, whatever the wrapping
    assert "Exit status 2:" in text, stderr
    assert f"TLS certificate of 127.0.0.1:{server.port} was refused" in text, stderr
    assert "self-signed certificate" in text, stderr
    assert "--ca-bundle FILE" in text and "--insecure" in text, stderr
    for name in CA_VARIABLES:
        assert name in text, stderr
    assert "Rerun the same command" not in text, stderr


def test_an_untrusted_certificate_stops_the_listing_at_once(
        tls_server: TlsServer, tmp_path: Path) -> None:
    dest, report = tmp_path / "dest", tmp_path / "r.json"
    marks = tls_server.log_marks()
    proc, took = _get(tls_server.url, str(dest), "--report", str(report))
    requests, refused = tls_server.since(marks)
    assert proc.returncode == 2, proc.stderr
    _says_how_to_trust(proc.stderr, tls_server)
    assert requests == []
    assert len(refused) == 1, refused  # one handshake: the page was not tried again
    assert took < 10, took  # 9 attempts with backoff took about 10 s more than this
    _nothing_stored(dest)
    data = json.loads(report.read_text())
    assert data["exit_code"] == 2 and data["retries"] == 0
    assert "was refused: self-signed certificate" in data["error"]


def test_ca_bundle_completes_over_reused_connections(
        tls_server: TlsServer, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    marks = tls_server.log_marks()
    proc, _ = _get(tls_server.url, str(dest), "--ca-bundle", str(tls_server.cert))
    requests, _ = tls_server.since(marks)
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, expected_files(FILES))
    assert len(requests) == FILES + FILES // PAGE, len(requests)
    connections = {line.split()[0] for line in requests}
    # one for the lister, at most one per handle of each worker: no handshake per file
    assert len(connections) <= 1 + WORKERS * CONCURRENCY, len(connections)


@pytest.mark.parametrize("variable", CA_VARIABLES)
def test_each_ca_variable_is_honoured(tls_server: TlsServer, tmp_path: Path,
                                      variable: str) -> None:
    dest = tmp_path / "dest"
    proc, _ = _get(tls_server.url, str(dest), env=_env(**{variable: str(tls_server.cert)}))
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, expected_files(FILES))


@pytest.mark.parametrize(("chosen", "ignored"), [
    ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
    ("CURL_CA_BUNDLE", "SSL_CERT_FILE"),
])
def test_the_variable_first_in_precedence_wins(tls_server: TlsServer, tmp_path: Path,
                                               chosen: str, ignored: str) -> None:
    good, useless = str(tls_server.cert), str(tls_server.other)
    proc, _ = _get(tls_server.url, str(tmp_path / "a"),
                   env=_env(**{chosen: good, ignored: useless}))
    assert proc.returncode == 0, proc.stderr
    proc, _ = _get(tls_server.url, str(tmp_path / "b"),
                   env=_env(**{chosen: useless, ignored: good}))
    assert proc.returncode == 2, proc.stderr
    assert f"this run trusted {useless}, from {chosen}" in " ".join(proc.stderr.split())


def test_ca_bundle_beats_every_variable(tls_server: TlsServer, tmp_path: Path) -> None:
    useless = str(tls_server.other)
    proc, _ = _get(tls_server.url, str(tmp_path / "dest"), "--ca-bundle", str(tls_server.cert),
                   env=_env(**dict.fromkeys(CA_VARIABLES, useless)))
    assert proc.returncode == 0, proc.stderr


def test_insecure_completes_with_one_warning(tls_server: TlsServer, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc, _ = _get(tls_server.url, str(dest), "--insecure",
                   env=_env(**dict.fromkeys(CA_VARIABLES, str(tls_server.other))))
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, expected_files(FILES))
    warnings = [line for line in proc.stderr.splitlines() if "--insecure" in line]
    assert len(warnings) == 1 and "not verified" in warnings[0], proc.stderr


def test_the_host_name_is_verified_too(tls_server: TlsServer, tmp_path: Path) -> None:
    """The certificate names 127.0.0.1 only: trusted, it still does not vouch for
    'localhost'; --insecure skips that check as well."""
    url = f"https://localhost:{tls_server.port}"
    proc, _ = _get(url, str(tmp_path / "a"), "--ca-bundle", str(tls_server.cert))
    assert proc.returncode == 2, proc.stderr
    text = " ".join(proc.stderr.split())
    assert f"TLS certificate of localhost:{tls_server.port} was refused" in text, text
    assert "'localhost'" in text, text
    proc, _ = _get(url, str(tmp_path / "b"), "--insecure")
    assert proc.returncode == 0, proc.stderr


def test_a_refused_certificate_stops_file_transfers_and_the_rerun_resumes(
        tls_server: TlsServer, tmp_path: Path) -> None:
    """--from-file: no listing request, so the fetcher meets the certificate. The run stops
    at once without failing any file; the same DEST with --ca-bundle then completes (trust
    is not part of the run's identity)."""
    urls = tmp_path / "urls.txt"
    names = sorted(expected_files(FILES))
    urls.write_text("".join(f"{tls_server.url}/get/{name}\n" for name in names))
    dest = tmp_path / "dest"
    marks = tls_server.log_marks()
    proc, took = _get("--from-file", str(urls), str(dest))
    requests, refused = tls_server.since(marks)
    assert proc.returncode == 2, proc.stderr
    _says_how_to_trust(proc.stderr, tls_server)
    assert "fetching " in proc.stderr
    assert requests == []
    # each handle tried once at most: no retries, no file after file (120 x 9 before)
    assert 1 <= len(refused) <= WORKERS * CONCURRENCY, refused
    assert took < 10, took
    _nothing_stored(dest)  # no journal: no failure recorded for the rerun to retry

    proc, _ = _get("--from-file", str(urls), str(dest), "--ca-bundle", str(tls_server.cert))
    assert proc.returncode == 0, proc.stderr
    expected = {f"get/{name}": digest for name, digest in expected_files(FILES).items()}
    assert_complete(dest, expected)


@pytest.mark.parametrize("origin", ["--ca-bundle", *CA_VARIABLES])
def test_a_missing_bundle_is_a_usage_error_naming_it(tls_server: TlsServer, tmp_path: Path,
                                                     origin: str) -> None:
    missing = str(tmp_path / "no-such-ca.pem")
    dest = tmp_path / "dest"
    if origin == "--ca-bundle":
        proc, took = _get(tls_server.url, str(dest), "--ca-bundle", missing)
    else:
        proc, took = _get(tls_server.url, str(dest), env=_env(**{origin: missing}))
    assert proc.returncode == 2, proc.stderr
    assert f"{origin} names {missing!r}, which does not exist" in proc.stderr, proc.stderr
    assert not dest.exists()  # refused before anything started
    assert took < 10


def test_a_bundle_without_certificates_is_refused(tls_server: TlsServer,
                                                  tmp_path: Path) -> None:
    bundle = tmp_path / "key-not-cert.pem"
    bundle.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    proc, _ = _get(tls_server.url, str(tmp_path / "dest"), "--ca-bundle", str(bundle))
    assert proc.returncode == 2, proc.stderr
    assert "holds no PEM certificate" in proc.stderr, proc.stderr
