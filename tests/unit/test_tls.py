"""Whom https:// trusts (bulkfetch.net.tls): --ca-bundle, then REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
SSL_CERT_FILE; bad bundles refused at the start; what a refused certificate is called."""

from __future__ import annotations

from pathlib import Path

import pycurl
import pytest

from bulkfetch.api import build_options
from bulkfetch.config import GetOptions, TlsOptions
from bulkfetch.errors import UsageError
from bulkfetch.net.curl import (
    RETRYABLE_CURL_ERRORS,
    TLS_FATAL_ERRORS,
    host_port,
    new_handle,
    tls_failure,
)
from bulkfetch.net.tls import CA_VARIABLES, resolve_tls

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def bundles(tmp_path: Path) -> dict[str, str]:
    """A PEM file per origin, so the chosen one is known by its path."""
    found = {}
    for origin in ("--ca-bundle", *CA_VARIABLES):
        path = tmp_path / f"{origin.strip('-')}.pem"
        path.write_bytes(PEM)
        found[origin] = str(path)
    return found


def test_the_precedence_is_flag_then_requests_curl_ssl(bundles: dict[str, str]) -> None:
    env = {name: bundles[name] for name in CA_VARIABLES}
    assert resolve_tls(bundles["--ca-bundle"], environ=env) == TlsOptions(
        bundles["--ca-bundle"], False, "--ca-bundle")
    order = list(CA_VARIABLES)
    while order:
        chosen = resolve_tls(environ={name: bundles[name] for name in order})
        assert (chosen.ca_bundle, chosen.origin) == (bundles[order[0]], order[0])
        order.pop(0)
    assert resolve_tls(environ={}) == TlsOptions()


def test_empty_variables_count_as_unset(bundles: dict[str, str]) -> None:
    env = {"REQUESTS_CA_BUNDLE": "", "CURL_CA_BUNDLE": "", "SSL_CERT_FILE": bundles[
        "SSL_CERT_FILE"]}
    assert resolve_tls(environ=env).origin == "SSL_CERT_FILE"
    assert resolve_tls(environ=dict.fromkeys(CA_VARIABLES, "")) == TlsOptions()


def test_other_variables_are_not_read(bundles: dict[str, str]) -> None:
    env = {"AWS_CA_BUNDLE": bundles["--ca-bundle"], "SSL_CERT_DIR": "/nonexistent",
           "ssl_cert_file": bundles["--ca-bundle"]}
    assert resolve_tls(environ=env) == TlsOptions()


def test_a_relative_bundle_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    (tmp_path / "ca.pem").write_bytes(PEM)
    monkeypatch.chdir(tmp_path)
    assert resolve_tls("ca.pem").ca_bundle == str(tmp_path / "ca.pem")


def test_a_directory_is_taken_as_is(tmp_path: Path) -> None:
    assert resolve_tls(environ={"REQUESTS_CA_BUNDLE": str(tmp_path)}).ca_bundle == str(tmp_path)


@pytest.mark.parametrize("origin", ["--ca-bundle", *CA_VARIABLES])
def test_a_missing_bundle_names_its_origin_and_path(tmp_path: Path, origin: str) -> None:
    missing = str(tmp_path / "gone.pem")
    with pytest.raises(UsageError) as caught:
        if origin == "--ca-bundle":
            resolve_tls(missing, environ={})
        else:
            resolve_tls(environ={origin: missing})
    assert str(caught.value) == f"{origin} names {missing!r}, which does not exist"


def test_an_unreadable_or_empty_bundle_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file.pem"
    not_a_dir.write_bytes(PEM)
    with pytest.raises(UsageError, match=r"which cannot be read: Not a directory"):
        resolve_tls(str(not_a_dir / "ca.pem"))
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    with pytest.raises(UsageError, match=r"CURL_CA_BUNDLE names .*empty\.pem.*no PEM cert"):
        resolve_tls(environ={"CURL_CA_BUNDLE": str(empty)})
    with pytest.raises(UsageError, match="--ca-bundle: give the path"):
        resolve_tls("")


def test_a_bad_variable_below_the_chosen_one_is_not_looked_at(bundles: dict[str, str]) -> None:
    env = {"REQUESTS_CA_BUNDLE": bundles["REQUESTS_CA_BUNDLE"], "SSL_CERT_FILE": "/no/such"}
    assert resolve_tls(environ=env).origin == "REQUESTS_CA_BUNDLE"
    assert resolve_tls(bundles["--ca-bundle"], environ={"CURL_CA_BUNDLE": "/no/such"}).origin \
        == "--ca-bundle"


def test_insecure_ignores_the_variables_and_refuses_a_bundle(bundles: dict[str, str]) -> None:
    assert resolve_tls(insecure=True, environ={"CURL_CA_BUNDLE": "/no/such"}) == TlsOptions(
        insecure=True)
    with pytest.raises(UsageError, match="not both"):
        resolve_tls(bundles["--ca-bundle"], insecure=True)
    with pytest.raises(UsageError, match="not both"):
        TlsOptions("/x.pem", insecure=True)


def test_build_options_reads_the_environment(bundles: dict[str, str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert build_options("https://h", tmp_path).tls == TlsOptions()
    monkeypatch.setenv("SSL_CERT_FILE", bundles["SSL_CERT_FILE"])
    assert build_options("https://h", tmp_path).tls.origin == "SSL_CERT_FILE"
    tls = build_options("https://h", tmp_path, ca_bundle=bundles["--ca-bundle"]).tls
    assert (tls.ca_bundle, tls.origin) == (bundles["--ca-bundle"], "--ca-bundle")
    assert build_options("https://h", tmp_path, insecure=True).tls.insecure


def test_trust_is_not_part_of_the_run_fingerprint() -> None:
    plain = GetOptions("https://h", "/d")
    trusting = GetOptions("https://h", "/d", tls=TlsOptions("/etc/ca.pem", origin="--ca-bundle"))
    assert plain.fingerprint() == trusting.fingerprint()
    assert trusting.as_dict()["tls"]["ca_bundle"] == "/etc/ca.pem"  # the report says it


def test_certificate_errors_are_fatal_and_never_retried() -> None:
    assert pycurl.E_PEER_FAILED_VERIFICATION in TLS_FATAL_ERRORS
    assert pycurl.E_SSL_CACERT_BADFILE in TLS_FATAL_ERRORS
    assert not TLS_FATAL_ERRORS & RETRYABLE_CURL_ERRORS
    # a handshake cut short (reset, overloaded server) may succeed on another attempt
    assert pycurl.E_SSL_CONNECT_ERROR in RETRYABLE_CURL_ERRORS
    assert tls_failure(pycurl.E_SSL_CONNECT_ERROR, "reset", "https://h", None) is None
    assert tls_failure(pycurl.E_COULDNT_CONNECT, "refused", "https://h", None) is None


def test_a_refused_certificate_is_named_with_the_remedy() -> None:
    text = tls_failure(60, "SSL certificate OpenSSL verify result: self-signed certificate "
                       "(18)", "https://127.0.0.1:8443/list?next-marker=x", None)
    assert text is not None
    assert text.startswith("the TLS certificate of 127.0.0.1:8443 was refused: self-signed "
                           "certificate (18) (curl error 60). Trust it with --ca-bundle FILE")
    assert all(name in text for name in CA_VARIABLES) and "--insecure" in text
    assert "trusted" not in text  # the system's store: nothing to name
    assert "next-marker" not in text  # host and port only: a query may hold a signature
    assert len("page 0: " + text) < 600  # the exit status 2 line shows all of it
    named = tls_failure(60, "SSL: no alternative certificate subject name matches target "
                        "hostname 'localhost'", "https://localhost/x",
                        TlsOptions("/ca.pem", origin="SSL_CERT_FILE"))
    assert named is not None
    assert "localhost:443 was refused: no alternative certificate subject name" in named
    assert named.endswith("(this run trusted /ca.pem, from SSL_CERT_FILE)")
    bad = tls_failure(77, "error adding trust anchors from file: /ca.pem", "https://h:1/",
                      TlsOptions("/ca.pem", origin="--ca-bundle"))
    assert bad == ("the CA certificates /ca.pem (--ca-bundle) cannot be used for h:1: error "
                   "adding trust anchors from file: /ca.pem (curl error 77)")


def test_host_port() -> None:
    assert host_port("https://example.com/a") == "example.com:443"
    assert host_port("http://example.com/a") == "example.com:80"
    assert host_port("https://user:pw@[::1]:8443/a?b") == "[::1]:8443"
    assert host_port("https://h:99999/") == "h:443"  # a bad port never raises here


def test_new_handle_takes_each_kind_of_trust(tmp_path: Path) -> None:
    """Every kind is accepted by libcurl (pycurl raises on a rejected option)."""
    from bulkfetch.config import Timeouts

    for tls in (None, TlsOptions(), TlsOptions(insecure=True),
                TlsOptions(str(tmp_path / "ca.pem"), origin="--ca-bundle"),
                TlsOptions(str(tmp_path), origin="REQUESTS_CA_BUNDLE")):
        new_handle(Timeouts(), tls).close()


@pytest.mark.parametrize(("message", "code"), [
    (("fatal", "the TLS certificate of h:443 was refused", True), 2),
    (("fatal", "cannot write: No space left on device"), 1),  # a sink's: as before
])
def test_a_workers_fatal_message_says_whether_the_user_must_act(
        tmp_path: Path, message: tuple[object, ...], code: int) -> None:
    from bulkfetch.dest.journal import Journal
    from bulkfetch.runners.coordinator import Coordinator as _Coordinator
    from bulkfetch.sources import make_source

    options = build_options("https://127.0.0.1:9", tmp_path / "dest", workers=1, sink="null")
    (tmp_path / "dest").mkdir()
    journal = Journal.open(tmp_path / "dest", options.fingerprint())
    try:
        coordinator = _Coordinator(options, make_source(options), journal, None)
        coordinator.started_at = 0.0
        coordinator._handle(message)
        coordinator._handle(("fatal", "a later one", True))  # the first one stands
        report = coordinator._report(0.0, interrupted=False)
    finally:
        journal.close()
    assert report.error == message[1]
    assert report.exit_code == code


def test_a_directory_that_cannot_be_read_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from bulkfetch.net import tls

    # (root reads any directory, so its answer is what the check is told)
    monkeypatch.setattr(tls.os, "access", lambda path, mode: False)
    with pytest.raises(UsageError, match="a directory that cannot be read"):
        tls.check_bundle(str(tmp_path), "--ca-bundle")
