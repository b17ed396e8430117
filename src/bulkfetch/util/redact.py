"""Secrets in URLs never become text: user-info and signed query strings are masked.

Applied wherever a URL (or a message that may hold one) leaves the process as text: the
journal (fingerprint, failure reasons, last error), the report (source, options, errors,
failures) and the terminal summary. RELIABILITY.md, hostile case 11.

- user-info: `scheme://user:password@host` -> `scheme://user:***@host`; a user-info without a
  password is often a token (`https://TOKEN@host`) and becomes `scheme://***@host`.
- query strings: the value of every parameter whose name looks like a credential
  (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, X-Goog-Signature, sig, token,
  key, secret, password, policy, ...) becomes `***`; other parameters are kept, so a
  message still says which URL it is about.

- secrets the run was given (a --header value, a --bearer-env token): register_secret()
  them once, and every occurrence in any text becomes `***`, URL or not.

Masking is idempotent, never raises, and leaves text without URLs or secrets untouched.
safe_text() and safe_name() add what a terminal needs on top: control characters escaped and
a length cut (kept here, not in cli/report.py, so `bulkfetch hash` prints names without loading
the report's JSON and table code).
"""

from __future__ import annotations

import re

__all__ = ["MASK", "TEXT_LIMIT", "USAGE_TEXT_LIMIT", "redact_text", "redact_url", "redact_value",
           "register_secret", "safe_name", "safe_text"]

MASK = "***"

# scheme://authority then the rest up to whitespace, a quote or an angle bracket
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/?#'\"<>]*)([^\s'\"<>]*)")
# parameter names that carry credentials (matched anywhere in the name, any case)
_SECRET_PARAM = re.compile(
    r"(?i)(sig|credential|token|secret|passw|pwd|key|auth|session|policy|^code$)")


def _authority(authority: str) -> str:
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return authority
    user, colon, _ = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}@{host}"
    return f"{MASK}@{host}"


def _query(query: str) -> str:
    parts = []
    for param in query.split("&"):
        name, eq, value = param.partition("=")
        if eq and value and value != MASK and _SECRET_PARAM.search(name):
            param = f"{name}={MASK}"
        parts.append(param)
    return "&".join(parts)


def _rest(rest: str) -> str:
    path, q, query = rest.partition("?")
    if not q:
        return rest
    query, hash_, fragment = query.partition("#")
    return f"{path}?{_query(query)}{hash_}{fragment}"


def _one(match: re.Match[str]) -> str:
    scheme, authority, rest = match.groups()
    return scheme + _authority(authority) + _rest(rest)


# Values this process was given as secrets (header values, tokens), longest first so a
# secret holding another is masked whole. A process-wide list: the workers are forked
# after the options are built, and inherit it.
_SECRETS: list[str] = []
# Shorter values are not masked as free text: "1" would mask every digit of a message.
MIN_SECRET = 6


def register_secret(value: str) -> None:
    """Mask `value` wherever it appears in text from now on (a header value or token)."""
    value = value.strip()
    if len(value) >= MIN_SECRET and value not in _SECRETS:
        _SECRETS.append(value)
        _SECRETS.sort(key=len, reverse=True)


def _mask_secrets(text: str) -> str:
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_url(url: str) -> str:
    """`url` with its user-info and credential-bearing query parameters masked."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL inside free text (an error message, a reason) masked; the rest kept."""
    if _SECRETS:
        text = _mask_secrets(text)
    if "://" not in text:
        return text
    return _URL.sub(_one, text)


def redact_value(value: object) -> object:
    """Strings anywhere in nested dicts, lists and tuples masked (for options, fingerprints)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


# -- text for the terminal --------------------------------------------------------------

TEXT_LIMIT = 200  # characters of a remote string shown on the terminal
# An exit status 2 message says what the user must change (how to trust a certificate...):
# it is ours, holding at most a short remote part, and cut at 200 it would lose the remedy.
USAGE_TEXT_LIMIT = 600


def safe_text(value: str, limit: int = TEXT_LIMIT) -> str:
    """`value` with URL secrets masked and every non-printable character escaped in place,
    cut to about `limit`."""
    value = redact_text(value)
    cut = value[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut + _cut_note(value, limit)


def safe_name(name: str, limit: int = TEXT_LIMIT) -> str:
    """A remote name for the terminal: as is when plain, else its Python repr (quoted).

    Names holding a backslash are quoted too, so a name that literally reads `\\x1b` cannot
    pass for an escaped ESC.
    """
    name = redact_text(name)
    cut = name[:limit]
    if not cut.isprintable() or "\\" in cut:
        cut = repr(cut)
    return cut + _cut_note(name, limit)


def _cut_note(value: str, limit: int) -> str:
    return f"… ({len(value):,} characters)" if len(value) > limit else ""
