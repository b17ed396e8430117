"""Which environment variables make libcurl choose a proxy (net/curl.py)."""

from __future__ import annotations

import pytest

from bulkfetch.net.curl import PROXY_VARIABLES, error_code, proxy_configured


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*PROXY_VARIABLES, "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_proxy_variables(clean_env: pytest.MonkeyPatch) -> None:
    assert not proxy_configured()


@pytest.mark.parametrize("name", PROXY_VARIABLES)
def test_each_variable_libcurl_reads_counts(clean_env: pytest.MonkeyPatch, name: str) -> None:
    clean_env.setenv(name, "http://127.0.0.1:3128")
    assert proxy_configured()


def test_empty_values_and_upper_case_http_proxy_do_not(clean_env: pytest.MonkeyPatch) -> None:
    # libcurl ignores HTTP_PROXY (a CGI request header could set it) and empty values.
    clean_env.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    clean_env.setenv("http_proxy", "")
    clean_env.setenv("no_proxy", "*")
    assert not proxy_configured()


def test_an_s3_error_body_names_its_code_and_others_nothing() -> None:
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message></Error>")
    assert error_code([body[:50], body[50:]]) == ""  # only a whole first chunk is read
    assert error_code([body]) == " AccessDenied"
    assert error_code([b"<html>403 Forbidden</html>"]) == ""
    assert error_code([b"<Code>a b</Code>"]) == ""  # not a code: never free text
    assert error_code([]) == ""
