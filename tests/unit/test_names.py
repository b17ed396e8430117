"""Name checks: the one-regex fast paths agree with the full check, page by page."""

from __future__ import annotations

import pytest

from bulkfetch.config import SourceShape, Timeouts
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.util.names import PATH_MAX, all_plain, check_name, is_plain, local_parts

PLAIN = ["f0000000001", "a/b/c.txt", "x-y_z.tar.gz", "A" * 255, "/".join(["d" * 200] * 19)]
NOT_PLAIN = ["", ".hidden", "a/../b", "../x", "/abs", "a//b", "trailing.", "sp ace", "caf\u00e9",
             "a\nb", "x/" * 2000 + "y", ".bulkfetch/journal", "a\\b", "~home", "C:x", "a/"]


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names_pass_every_check(name: str) -> None:
    assert is_plain(name) and check_name(name) is None and all_plain([name])


@pytest.mark.parametrize("name", NOT_PLAIN)
def test_one_odd_name_makes_the_page_not_plain(name: str) -> None:
    assert not is_plain(name)
    assert not all_plain([*PLAIN, name, *PLAIN])


def test_page_checks() -> None:
    assert not all_plain([])
    assert not all_plain(["a", 3])  # type: ignore[list-item]
    too_long = "/".join(["p" * 99] * 41)
    assert len(too_long) > PATH_MAX and not all_plain([too_long])
    assert check_name(too_long) is not None


def test_plain_urls_match_resolve_one_by_one() -> None:
    source = FileServerSource("http://h:1/base/", SourceShape(get_template="/get/{name}?x=%41"),
                              Timeouts())
    names = ["f1", "d/e.txt"]
    assert list(source.plain_urls(names)) == [source.resolve(n)[1] for n in names] == [
        "http://h:1/base/get/f1?x=%41", "http://h:1/base/get/d/e.txt?x=%41"]
    assert source.plain_urls(["ok", "not ok"]) is None


# Each refusal by its reason (issue 50: '~x' and 'C:x' were refused only in an e2e test,
# so a check_name that let them through kept every unit test green).
@pytest.mark.parametrize(("name", "reason"), [
    ("~x", "starts with ~"), ("~/.ssh/id_rsa", "starts with ~"),
    ("C:x", "drive letter"), ("c:/windows", "drive letter"),
    ("/etc/passwd", "absolute path"), ("a\\b", "backslash"), ("a\x00b", "control"),
    ("a/../b", "'..'"), ("a//b", "empty, '.' or '..'"), ("\uff0e\uff0e/x", "normalises"),
    (".bulkfetch/journal.sqlite", "bulkfetch's own state"), ("dir./x", "ends with a dot"),
    ("x" * 256, "longer than 255"), ("", "empty name"),
])
def test_each_unsafe_name_is_refused_for_its_own_reason(name: str, reason: str) -> None:
    found = check_name(name)
    assert found is not None and reason in found, (name, found)


def test_names_beside_the_refused_ones_are_taken() -> None:
    for name in ("x~", "a/~b", "Cx", "ab:c", "a.bulkfetch/x", "dir/.bulkfetch"):
        assert check_name(name) is None, name


def test_the_fanout_layout_is_the_names_md5_two_hex_digits_a_level() -> None:
    # DEST's layout on disk: a rerun, `ls` and `--sync` find files by it, so it never moves
    assert local_parts("a/b.txt") == ["a", "b.txt"]
    assert local_parts("f0000000001", 2) == ["a3", "09", "f0000000001"]
    assert local_parts("é", 1) == ["66", "é"]


def test_a_name_that_is_not_utf8_or_not_a_string_is_refused_with_its_reason() -> None:
    assert check_name("bad\udcff.bin") == "name is not valid UTF-8"  # a lone surrogate
    assert all_plain(["a", 1]) is False  # type: ignore[list-item]  # the per-name path says why
