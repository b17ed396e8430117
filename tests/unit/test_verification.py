"""What the fetcher takes as the server's stated MD5, from raw header lines as libcurl hands
them over: every spelling of ETag and Content-MD5, and agreement of the fast reading with the
general one on many generated header blocks."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest

from bulkfetch.engine.stated import expected_md5, stated_md5
from bulkfetch.net.curl import header_values

MD5 = hashlib.md5(b"body").hexdigest()
OTHER = hashlib.md5(b"other").hexdigest()


def response(*headers: str, status: str = "HTTP/1.1 200 OK") -> list[bytes]:
    return [f"{line}\r\n".encode("latin-1") for line in (status, *headers)] + [b"\r\n"]


@pytest.mark.parametrize(("headers", "expected"), [
    ((f'ETag: "{MD5}"',), MD5),
    ((f'etag: "{MD5.upper()}"',), MD5),
    ((f"ETAG:{MD5}",), MD5),  # unquoted, no space
    ((f'eTaG:   "{MD5}"  ',), MD5),
    ((f'ETag: W/"{MD5}"',), None),  # weak: not a checksum
    ((f'ETag: w/"{MD5}"',), None),
    (('ETag: "6740f1a0-64"',), None),  # nginx: mtime-size
    ((f'ETag: "{MD5}-3"',), None),  # S3 multipart
    ((f'ETag: "{MD5[:31]}g"',), None),
    (("Content-Length: 4",), None),
    ((f'ETag: "{OTHER}"', f'ETag: "{MD5}"'), MD5),  # the last one wins
    ((f'ETag: "{MD5}"', 'etag: "6740f1a0-64"'), None),
    ((f"Content-MD5: {base64.b64encode(bytes.fromhex(MD5)).decode()}", f'ETag: "{OTHER}"'),
     MD5),  # Content-MD5 before the ETag
    ((f"content-md5: {base64.b64encode(bytes.fromhex(OTHER)).decode()}",), OTHER),
    (("Content-MD5: not base64!",), None),
    ((f'X-Not-ETag: "{OTHER}"', "X-ETag-Note: etag: x"), None),
    ((f'X-Meta: "{OTHER}" etag:', 'ETag: "6740f1a0-64"'), None),
])
def test_the_stated_md5_for_each_spelling(headers: tuple[str, ...], expected: str | None) -> None:
    lines = response(*headers)
    assert stated_md5(lines) == expected
    assert stated_md5(lines) == expected_md5(*header_values(lines, b"etag", b"content-md5"))


def test_a_last_line_without_its_line_end_keeps_every_digit() -> None:
    assert stated_md5([b"HTTP/1.1 200 OK\r\n", f'ETag: "{MD5}"'.encode()]) == MD5
    assert stated_md5([b"HTTP/1.1 200 OK\r\n", f"ETag: {MD5}".encode()]) == MD5


def test_the_md5_a_response_states_is_what_a_body_is_checked_against() -> None:
    # the fetcher fails a body whose MD5 differs from a stated one, and checks by size alone
    # when none is stated (an nginx ETag, a multipart S3 one, no ETag)
    assert stated_md5(response(f'ETag: "{OTHER}"')) == OTHER
    assert stated_md5(response(f'ETag: "{MD5}"')) == MD5
    assert stated_md5(response('ETag: "6740f1a0-64"')) is None
    assert stated_md5(response('ETag: "9c0bcd117e83a4ec240057ae1e4a78e9-3"')) is None
    assert stated_md5(response()) is None


def test_the_fast_reading_agrees_with_the_general_one_on_generated_blocks() -> None:
    rng = random.Random(7)
    names = ["ETag", "etag", "ETAG", "eTag", "Content-MD5", "content-md5", "X-ETag",
             "Server", "Content-Length", "Etag-Like", "Last-Modified"]
    values = [f'"{MD5}"', MD5, f'W/"{MD5}"', f'"{OTHER}"', '"6740f1a0-64"', f'"{MD5}-2"',
              base64.b64encode(bytes.fromhex(MD5)).decode(), "nginx", "100", "", '""',
              f' "{OTHER.upper()}" ', "\t" + MD5]
    for _ in range(3000):
        headers = [f"{rng.choice(names)}:{rng.choice(['', ' ', '  '])}{rng.choice(values)}"
                   for _ in range(rng.randrange(0, 6))]
        lines = response(*headers)
        if rng.random() < 0.2:  # a redirect's headers before the final response's
            lines = response('ETag: "' + OTHER + '"', status="HTTP/1.1 302 Found") + lines
        assert stated_md5(lines) == expected_md5(
            *header_values(lines, b"etag", b"content-md5")), lines
