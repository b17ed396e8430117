"""bulkfetch.util.redact: secrets in URLs are masked wherever a URL becomes text (journal, report,
summary), and nothing else changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkfetch.cli.report import report_dict
from bulkfetch.dest.journal import Journal
from bulkfetch.models import Failure, PageReport, Report
from bulkfetch.util.redact import MASK, redact_text, redact_url, redact_value, safe_name, safe_text

SECRETS = ("s3cr3t", "SECRETSIG", "AKIDSECRET", "ghp_TOKEN", "SESSIONTOKEN")
SIGNED = ("https://bucket.s3.amazonaws.com/a/b.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256"
          "&X-Amz-Credential=AKIDSECRET%2F20260101%2Fus-east-1&X-Amz-Date=20260101T000000Z"
          "&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token=SESSIONTOKEN"
          "&X-Amz-Signature=SECRETSIG#part")


@pytest.mark.parametrize(("url", "masked"), [
    ("http://user:s3cr3t@127.0.0.1:8000/get/f", f"http://user:{MASK}@127.0.0.1:8000/get/f"),
    ("https://ghp_TOKEN@github.com/o/r.git", f"https://{MASK}@github.com/o/r.git"),
    ("http://127.0.0.1:8000/get/f?page=2&sig=SECRETSIG",
     f"http://127.0.0.1:8000/get/f?page=2&sig={MASK}"),
    ("http://h/x?token=SECRETSIG&api_key=SECRETSIG&password=s3cr3t&n=1",
     f"http://h/x?token={MASK}&api_key={MASK}&password={MASK}&n=1"),
    ("http://127.0.0.1:8000/get/f", "http://127.0.0.1:8000/get/f"),  # nothing to mask
    ("http://h/x?flag&empty=", "http://h/x?flag&empty="),
])
def test_redact_url(url: str, masked: str) -> None:
    assert redact_url(url) == masked
    assert redact_url(masked) == masked  # idempotent


def test_a_presigned_s3_url_keeps_its_shape_and_loses_its_secrets() -> None:
    masked = redact_url(SIGNED)
    for secret in SECRETS:
        assert secret not in masked
    assert masked.startswith("https://bucket.s3.amazonaws.com/a/b.bin?X-Amz-Algorithm=AWS4")
    assert f"X-Amz-Credential={MASK}&" in masked and f"X-Amz-Signature={MASK}#part" in masked
    assert "X-Amz-Expires=900" in masked  # not a secret: kept


def test_redact_text_masks_every_url_in_a_message_and_nothing_else() -> None:
    message = (f"cannot fetch {SIGNED} (curl error 7); redirected to "
               "'ftp://user:s3cr3t@example.com/x' after 3 attempts")
    masked = redact_text(message)
    for secret in SECRETS:
        assert secret not in masked
    assert masked.startswith("cannot fetch https://bucket.s3.amazonaws.com/a/b.bin?")
    assert f"'ftp://user:{MASK}@example.com/x' after 3 attempts" in masked
    plain = "MD5 of the body does not match; name with : and @ and ?x=1"
    assert redact_text(plain) is plain
    hostile = "n\udcff\x00 http://x:y@z\udcff"  # lone surrogates and NUL do not break it
    assert redact_text(hostile) == f"n\udcff\x00 http://x:{MASK}@z\udcff"


def test_redact_value_walks_nested_options() -> None:
    options = {"source": "http://user:s3cr3t@h:1", "limits": {"workers": 2},
               "list": ["x", f"{SIGNED}"], "verify": True, "none": None}
    masked = redact_value(options)
    assert masked == {"source": f"http://user:{MASK}@h:1", "limits": {"workers": 2},
                      "list": ["x", redact_url(SIGNED)], "verify": True, "none": None}
    assert options["source"] == "http://user:s3cr3t@h:1"  # the input is not changed


def test_the_report_masks_source_options_error_and_failures() -> None:
    report = Report(source="http://user:s3cr3t@h:1", dest="/d", error=f"listing {SIGNED}",
                    options={"source": "http://user:s3cr3t@h:1"},
                    failures=[Failure("ftp://u:s3cr3t@h/x?sig=SECRETSIG", f"bad {SIGNED}", 1,
                                      f"{SIGNED}"),
                              Failure("plain/name", "HTTP 404", 1)])
    text = repr(report_dict(report))
    for secret in SECRETS:
        assert secret not in text
    assert report_dict(report)["failures"][1] == {"name": "plain/name", "reason": "HTTP 404",
                                                  "attempts": 1, "url": None}
    assert "s3cr3t" not in safe_text(report.source) + safe_name(report.failures[0].name)


def test_the_journal_stores_no_secret_and_still_recognises_the_run(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    fingerprint = {"source": "http://user:s3cr3t@h:1", "from_file": False}
    journal = Journal.open(dest, fingerprint)
    try:
        journal.add_page(0, None, None, 2)
        journal.page_done(PageReport(0, 0, 0, (
            Failure("ftp://user:s3cr3t@h/x?X-Amz-Signature=SECRETSIG", f"cannot {SIGNED}", 1),
            Failure("f1", f"redirect to {SIGNED}", 2))))
        journal.record_error("listing http://user:s3cr3t@h:1/list?sig=SECRETSIG: HTTP 503")
        names = [f.name for f in journal.failures()]
    finally:
        journal.close()
    assert names == ["f1", f"ftp://user:{MASK}@h/x?X-Amz-Signature={MASK}"]
    for path in (dest / ".bulkfetch").iterdir():
        if path.is_file():
            for secret in SECRETS:
                assert secret.encode() not in path.read_bytes(), (secret, path)
    # the same source (same secret) is the same run; the masked form is what is compared
    Journal.open(dest, fingerprint).close()


def test_a_secret_of_exactly_the_shortest_length_is_masked_and_a_shorter_one_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bulkfetch.util import redact

    monkeypatch.setattr(redact, "_SECRETS", [])  # this test's secrets only
    shortest = "k" * redact.MIN_SECRET
    redact.register_secret(f"  {shortest} ")  # as a header value comes, spaces around
    redact.register_secret("q" * (redact.MIN_SECRET - 1))  # would mask every "qqqqq"
    assert redact_text(f"token {shortest} sent") == f"token {MASK} sent"
    assert redact_text("qqqqq and qqqqqq") == "qqqqq and qqqqqq"
    # a longer secret holding a shorter one is masked whole, not around the shorter
    redact.register_secret(shortest + "-longer")
    assert redact_text(f"x {shortest}-longer y") == f"x {MASK} y"


def test_terminal_text_is_cut_at_its_limit_and_says_how_long_it_was() -> None:
    from bulkfetch.util.redact import TEXT_LIMIT, USAGE_TEXT_LIMIT, safe_name, safe_text

    exact = "x" * TEXT_LIMIT
    assert safe_text(exact) == exact and safe_name(exact) == exact  # nothing cut, no note
    long = "y" * 1000
    assert safe_text(long) == "y" * 200 + "… (1,000 characters)"
    assert safe_text(long, USAGE_TEXT_LIMIT) == "y" * 600 + "… (1,000 characters)"
    assert safe_name(long) == "y" * 200 + "… (1,000 characters)"


def test_a_name_is_quoted_when_it_holds_an_escape_or_a_backslash_and_never_otherwise() -> None:
    from bulkfetch.util.redact import safe_name, safe_text

    assert safe_name("plain name.txt") == "plain name.txt"
    assert safe_name("bell\x07.txt") == "'bell\\x07.txt'"
    assert safe_name("reads \\x1b") == "'reads \\\\x1b'"  # cannot pass for an escaped ESC
    assert safe_text("bell\x07 here") == "bell\\x07 here"  # text: escaped in place


def test_six_characters_are_enough_to_be_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    from bulkfetch.util import redact

    monkeypatch.setattr(redact, "_SECRETS", [])
    redact.register_secret("s3cr3t")  # six: an API key this short is still a secret
    assert redact_text("key=s3cr3t") == f"key={MASK}"
