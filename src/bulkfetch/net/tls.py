"""Whom https:// trusts: --ca-bundle, the CA variables of the environment, --insecure; and
what a certificate libcurl refused is called in a message.

The pycurl wheel's libcurl reads no CA variable by itself (curl the program does, not the
library), so they are resolved here, once, at the start of a run. Precedence: --ca-bundle,
then REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE (the first one set and not empty),
then libcurl's own store. It agrees with both tools that read more than one of them: curl
takes --cacert over CURL_CA_BUNDLE over SSL_CERT_FILE, requests REQUESTS_CA_BUNDLE over
CURL_CA_BUNDLE (and ignores SSL_CERT_FILE); the AWS CLI's --ca-bundle, too, overrides its
variable. --insecure ignores the variables (as curl's -k does)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from bulkfetch.config import TlsOptions
from bulkfetch.errors import UsageError

# In order of precedence, after --ca-bundle.
CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")
_PEM_MARKERS = (b"-----BEGIN CERTIFICATE-----", b"-----BEGIN TRUSTED CERTIFICATE-----")

# Kept short: with "page N: " and libcurl's reason it must fit an exit status 2 line.
HOW_TO_TRUST = (f"Trust it with --ca-bundle FILE (or {', '.join(CA_VARIABLES)}), or test with "
                "--insecure")

INSECURE_WARNING = ("bulkfetch: warning: --insecure: TLS certificates and host names are not "
                    "verified; anyone on the network path can read or alter what is downloaded")


def resolve_tls(ca_bundle: str | os.PathLike[str] | None = None, insecure: bool = False,
                environ: Mapping[str, str] | None = None) -> TlsOptions:
    """The run's TlsOptions. Raises UsageError (exit status 2), naming the flag or variable
    and the file, when the chosen bundle does not exist, cannot be read or holds no PEM
    certificate."""
    if insecure:
        if ca_bundle is not None:
            raise UsageError("give --ca-bundle or --insecure, not both")
        return TlsOptions(insecure=True)
    if ca_bundle is not None:
        path, origin = os.fspath(ca_bundle), "--ca-bundle"
        if not path:
            raise UsageError("--ca-bundle: give the path of a PEM file of CA certificates")
    else:
        environ = os.environ if environ is None else environ
        found = next(((name, environ[name]) for name in CA_VARIABLES if environ.get(name)),
                     None)
        if found is None:
            return TlsOptions()
        origin, path = found
    check_bundle(path, origin)
    return TlsOptions(ca_bundle=os.path.abspath(path), origin=origin)


def check_bundle(path: str, origin: str) -> None:
    """Raises UsageError unless `path` is a readable file holding a PEM certificate, or a
    readable directory (libcurl's CAPATH: certificates named by `openssl rehash`)."""
    where = f"{origin} names {path!r}"
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"{where}, a directory that cannot be read")
        return
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise UsageError(f"{where}, which does not exist") from None
    except OSError as exc:
        raise UsageError(f"{where}, which cannot be read: {exc.strerror}") from None
    if not any(marker in data for marker in _PEM_MARKERS):
        raise UsageError(f"{where}, which holds no PEM certificate (no '-----BEGIN "
                         "CERTIFICATE-----' line)")
