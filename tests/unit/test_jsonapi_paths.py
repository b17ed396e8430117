"""JMESPath into listing pages (sources/jsonpaths.py) and the values they must give."""

from __future__ import annotations

import base64
import hashlib

import jmespath
import pytest

from bulkfetch.errors import UsageError
from bulkfetch.sources.jsonpaths import column, compile_path, digest_hex, hex_digests, size_of

ITEMS = [
    {"name": "a", "size": 3, "lfs": {"oid": "x"}, "type": "file"},
    {"name": "b", "lfs": None, "type": "directory"},
    {"name": 7, "lfs": "not an object"},
    "a string item",
    None,
    [1, 2],
    {"lfs": {"oid": {"deeper": 1}}},
]


@pytest.mark.parametrize("expression", ["name", "size", "lfs.oid", "lfs.oid.deeper", "missing",
                                        "@", "type"])
def test_the_fast_path_answers_as_jmespath_does(expression: str) -> None:
    path = compile_path(expression, "--x")
    for item in ITEMS:
        assert path(item) == jmespath.search(expression, item), (expression, item)


@pytest.mark.parametrize("expression", ["[?type=='file']", "items[].name", "length(@)",
                                        '"quoted-key"', "a.b[0]"])
def test_other_expressions_go_through_jmespath(expression: str) -> None:
    page = {"items": [{"name": "n"}], "quoted-key": 1, "a": {"b": [5]}}
    assert compile_path(expression, "--x")(page) == jmespath.search(expression, page)
    assert compile_path(expression, "--x")(ITEMS) == jmespath.search(expression, ITEMS)


def test_a_filter_keeps_only_files() -> None:
    assert compile_path("[?type=='file']", "--items")(ITEMS) == [ITEMS[0]]


def test_a_broken_expression_is_a_usage_error_naming_the_flag() -> None:
    with pytest.raises(UsageError, match=r"--size 'items\[' is not a JMESPath"):
        compile_path("items[", "--size")


def test_column_of_identity_is_the_list_itself() -> None:
    items = ["a", "b"]
    assert column(compile_path("@", "--name"), items) is items
    assert column(compile_path("name", "--name"), [{"name": "x"}, {}]) == ["x", None]


@pytest.mark.parametrize(("value", "size"), [(0, 0), (12, 12), ("12345", 12345), (None, -1),
                                             (3.0, 3)])
def test_sizes_are_numbers_or_decimal_strings(value: object, size: int) -> None:
    assert size_of(value) == size


@pytest.mark.parametrize("value", [-1, "12a", "", "١٢", 1.5, True, {}, [3]])
def test_anything_else_is_not_a_size(value: object) -> None:
    # (True among them: a bool is an int to Python, never a size)
    with pytest.raises(ValueError):
        size_of(value)


def test_digests_in_hex_base64_or_labelled_come_out_as_lower_hex() -> None:
    raw = hashlib.md5(b"x").digest()
    assert digest_hex(raw.hex().upper(), 16, "md5") == raw.hex()
    assert digest_hex(base64.b64encode(raw).decode(), 16, "md5") == raw.hex()
    sha = hashlib.sha256(b"x").digest()
    assert digest_hex("sha256:" + sha.hex(), 32, "sha256") == sha.hex()
    assert digest_hex(base64.b64encode(sha).decode(), 32, "sha256") == sha.hex()
    assert digest_hex(None, 16, "md5") == digest_hex("", 16, "md5") == ""


@pytest.mark.parametrize("value", ["abc", "0" * 31, base64.b64encode(b"short").decode(),
                                   "sha1:" + "0" * 40, 5, "!!!!"])
def test_a_digest_of_the_wrong_length_or_form_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        digest_hex(value, 16, "md5")


def test_the_batch_of_digests_answers_as_one_by_one() -> None:
    raw = hashlib.md5(b"y").digest()
    values = [raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(), None, ""]
    assert hex_digests(values, 16, "md5") == [digest_hex(v, 16, "md5") for v in values]
    spaced = " ".join(raw.hex()[i:i + 2] for i in range(0, 32, 2))[:32]  # fromhex skips spaces
    with pytest.raises(ValueError):
        hex_digests([spaced], 16, "md5")
