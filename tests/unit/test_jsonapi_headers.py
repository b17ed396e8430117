"""Request headers (sources/headers.py): parsing, the header file, --bearer-env, which hosts
get them, and that their values are masked everywhere (util/redact.py, config)."""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path

import pytest

from bulkfetch.api import build_options
from bulkfetch.config import RequestAuth
from bulkfetch.errors import UsageError
from bulkfetch.sources.headers import (
    HostHeaders,
    bearer_from_env,
    build_auth,
    parse_header,
    read_header_file,
)
from bulkfetch.util.redact import redact_text, redact_value, register_secret


def test_a_header_is_name_colon_value() -> None:
    assert parse_header("X-Api-Key:  abc def ", "--header #1") == ("X-Api-Key", "abc def")
    assert parse_header("Authorization: Bearer a:b", "w") == ("Authorization", "Bearer a:b")


@pytest.mark.parametrize("text", ["no colon", ": value-secret", "Bad Name: vvv-secret",
                                  "X-Key:", "X-Key:  ", "X(y): secret-zz"])
def test_a_malformed_header_is_a_usage_error_that_never_echoes_the_value(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_header(text, "--header #2")
    assert "--header #2" in str(caught.value)
    value = text.partition(":")[2].strip()
    if value:
        assert value not in str(caught.value)


def test_the_header_file_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "h"
    path.write_text("# a comment\n\nX-Api-Key: k-123456\r\n  # indented comment\n"
                    "Authorization: Bearer t-abcdefg\n")
    assert read_header_file(str(path)) == [("X-Api-Key", "k-123456"),
                                           ("Authorization", "Bearer t-abcdefg")]


def test_a_bad_header_file_line_is_named_by_number(tmp_path: Path) -> None:
    path = tmp_path / "h"
    path.write_text("X-Ok: fine\nsecret-without-colon\n")
    with pytest.raises(UsageError, match=r"line 2") as caught:
        read_header_file(str(path))
    assert "secret-without-colon" not in str(caught.value)
    with pytest.raises(UsageError, match="cannot be read"):
        read_header_file(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(UsageError, match="no 'Name: value' line"):
        read_header_file(str(tmp_path / "empty"))


def test_bearer_env_reads_the_variable_or_says_it_is_unset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "  tok-0123456789 ")
    assert bearer_from_env("MY_TOKEN") == ("Authorization", "Bearer tok-0123456789")
    monkeypatch.delenv("MY_TOKEN")
    with pytest.raises(UsageError, match="MY_TOKEN is not set"):
        bearer_from_env("MY_TOKEN")


def test_a_header_given_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T", "tok-0123456789")
    with pytest.raises(UsageError, match="authorization is given twice"):
        build_auth(["Authorization: Basic abcdefgh"], bearer_env="T")


def test_headers_go_to_allowed_origins_and_are_unset_elsewhere() -> None:
    auth = RequestAuth((("X-Api-Key", "k-123456"), ("Authorization", "Bearer t-1234567")))
    headers = HostHeaders(auth, ["https://api.example/v1/files"])
    sent = ["X-Api-Key: k-123456", "Authorization: Bearer t-1234567"]
    unset = ["X-Api-Key:", "Authorization:"]
    assert headers("https://api.example/v1/files/a?b") == sent
    assert headers("https://API.example:443/x") == sent  # the same origin, spelled otherwise
    for other in ("https://cdn.example/x", "http://api.example/x", "https://api.example:8443/x",
                  "https://api.example.evil/x", "https://evil/api.example/"):
        assert headers(other) == unset, other
    headers.allow("https://files.example/blob/1")
    assert headers("https://files.example/blob/2") == sent
    assert headers("https://cdn.example/x") == unset


def test_options_never_show_a_header_value(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("API_TOKEN", "tok-very-secret-1")
    file = tmp_path / "h"
    file.write_text("X-Api-Key: key-very-secret-2\n")
    options = build_options("https://api.example/v1/files", tmp_path / "d", api="drf",
                            bearer_env="API_TOKEN", header_file=file,
                            headers=["X-Other: other-secret-3"])
    shown = [repr(options), str(options.as_dict()), str(options.fingerprint()),
             repr(options.auth)]
    for secret in ("tok-very-secret-1", "key-very-secret-2", "other-secret-3"):
        assert all(secret not in text for text in shown), secret
    assert options.as_dict()["auth"] == {
        "headers": ["X-Other", "X-Api-Key", "Authorization"], "netrc": False,
        "from": ["--header", f"--header-file {file}", "--bearer-env API_TOKEN"]}
    # the workers get the values (forked, or pickled for Ray)
    assert pickle.loads(pickle.dumps(options)).auth.headers == options.auth.headers
    # and any text that holds one is masked
    assert redact_text("curl -H 'Authorization: Bearer tok-very-secret-1'") == \
        "curl -H 'Authorization: ***'"
    assert redact_text("token tok-very-secret-1 refused") == "token *** refused"
    assert redact_value({"e": ["x key-very-secret-2 y"]}) == {"e": ["x *** y"]}


def test_a_registered_secret_is_masked_in_any_text() -> None:
    register_secret("s3cr3t-value-xyz")
    assert redact_text("failed: s3cr3t-value-xyz at https://h/p?q=1") == \
        "failed: *** at https://h/p?q=1"
    register_secret("abc")  # too short to mask as free text: it would mask words
    assert redact_text("abc") == "abc"


def test_a_dash_reads_the_header_file_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"# from a secret store\nX-Api-Key: k-from-stdin\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert read_header_file("-") == [("X-Api-Key", "k-from-stdin")]
