"""URL tables on their own (issue 19): CSV, TSV and JSONL rows to (name, URL), pages that
resume at a byte offset, names from a column or a template, and rows that cannot give a URL
failing on their own."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bulkfetch.config import TableOptions
from bulkfetch.errors import UsageError
from bulkfetch.sources.table import TableSource

URLS = [f"http://h{i % 2}.example/img/{i}/photo.jpg" for i in range(7)]


def write_csv(path: Path, delimiter: str = ",") -> Path:
    with path.open("w", newline="", encoding="utf-8-sig") as handle:  # a BOM, as Excel writes
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["caption", "url", "key"])
        for i, url in enumerate(URLS):
            writer.writerow([f'line one, "two"\nline {i}', url, f"k/{i}.jpg"])
    return path


def listed(source: TableSource) -> tuple[list[tuple[str, str]], list[str | None]]:
    """Every (name, url) over all pages, and the tokens the pages were listed with."""
    got, tokens, token = [], [], None
    while True:
        tokens.append(token)
        page = source.list_page(token)
        got += [source.resolve(item) for item in page.items]
        if page.next_token is None:
            return got, tokens
        token = page.next_token


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_rows_with_quoted_newlines_page_by_byte_offset(tmp_path: Path, suffix: str) -> None:
    path = write_csv(tmp_path / f"t{suffix}", "," if suffix == ".csv" else "\t")
    source = TableSource(str(path), TableOptions(name_template="{index:09d}{ext}"),
                         rows_per_page=3)
    got, tokens = listed(source)
    assert got == [(f"{i:09d}.jpg", url) for i, url in enumerate(URLS)]
    # a page's token is where its first row starts (byte, row, lines before it): listing
    # from it alone gives that page
    assert len(tokens) == 3 and tokens[2] is not None and tokens[2].endswith(":6:13")
    assert [source.resolve(i) for i in source.list_page(tokens[2]).items] == [
        ("000000006.jpg", URLS[6])]


def test_names_come_from_a_column_or_the_url_path(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv")
    by_column, _ = listed(TableSource(str(path), TableOptions(name_col="key")))
    assert [name for name, _ in by_column] == [f"k/{i}.jpg" for i in range(7)]
    by_url, _ = listed(TableSource(str(path), TableOptions()))
    assert by_url[3] == ("img/3/photo.jpg", URLS[3])


def outcomes_of(source: TableSource) -> list[tuple[str, str] | str]:
    """What each item of the first page resolves to: (name, URL), or why it cannot."""
    outcomes: list[tuple[str, str] | str] = []
    for item in source.list_page(None).items:
        try:
            outcomes.append(source.resolve(item))
        except ValueError as exc:
            outcomes.append(str(exc))
    return outcomes


def test_jsonl_rows_that_give_no_url_fail_on_their_own(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([json.dumps({"url": URLS[0], "w": 3}), "", "not json",
                               json.dumps(["a list"]), json.dumps({"link": URLS[1]}),
                               json.dumps({"url": "ftp://x/y"}), json.dumps({"url": URLS[2]})])
                    + "\n")
    source = TableSource(str(path), TableOptions(name_template="{index}{ext}"))
    assert outcomes_of(source) == [
        ("0.jpg", URLS[0]),
        "row 1 (line 3): not JSON: Expecting value: line 1 column 1 (char 0)",
        "row 2 (line 4): not a JSON object", "row 3 (line 5): no URL in column 'url'",
        "not an http:// or https:// URL: 'ftp://x/y'", ("5.jpg", URLS[2])]


def test_a_row_without_a_name_in_the_name_column_fails_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [
        {"url": URLS[0], "key": "a.jpg"}, {"url": URLS[1], "key": None}, {"url": URLS[2]},
        {"url": URLS[2], "key": ""}]) + "\n")
    source = TableSource(str(path), TableOptions(name_col="key"))
    assert outcomes_of(source) == [("a.jpg", URLS[0])] + [
        f"row {row} (line {row + 1}): no name in column 'key'" for row in (1, 2, 3)]


def test_bad_columns_and_templates_are_usage_errors_naming_them(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv")
    with pytest.raises(UsageError, match=r"--url-col 'link' is not a column .*'caption', 'url'"):
        TableSource(str(path), TableOptions(url_col="link"))
    with pytest.raises(UsageError, match=r"--name-template '\{row\}'"):
        TableOptions(name_template="{row}")
    with pytest.raises(UsageError, match="not both"):
        TableOptions(name_col="key", name_template="{index}")
    with pytest.raises(UsageError, match=r"not a \.csv, \.tsv, \.jsonl or \.parquet"):
        TableSource(str(tmp_path / "t.txt"), TableOptions())


def test_a_row_whose_url_cannot_be_fetched_fails_alone_and_gets_no_json(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"url": "http://[::1/x.jpg", "w": 1},  # a broken host: no name from its path
            {"url": "ftp://h/y.jpg", "w": 2},
            {"url": "data:application/json;base64,e30=", "w": 3},  # not ours to store
            {"url": URLS[0], "w": 4}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for options in (TableOptions(), TableOptions(save_cols=("w",))):
        source = TableSource(str(path), options)
        outcomes = []
        for item in source.list_page(None).items:
            try:
                outcomes.append(source.resolve(item)[0])
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[:3] == [
            "Invalid IPv6 URL: 'http://[::1/x.jpg'",
            "not an http:// or https:// URL: 'ftp://h/y.jpg'",
            "not an http:// or https:// URL: 'data:application/json;base64,e30='"]
        # only the row with a URL to fetch has its JSON, right after it
        assert outcomes[3:] == ["img/0/photo.jpg", *(["img/0/photo.json"] if
                                                     options.save_cols else [])]


def test_a_malformed_or_ragged_csv_row_fails_by_its_lines_and_the_rows_after_it_are_read(
        tmp_path: Path) -> None:
    """An unterminated quote once took the next row into its field, and the row was lost
    without a word: now the broken row fails, named by its line, and no other row is lost."""
    path = tmp_path / "t.csv"
    path.write_text("url,caption\n"  # line 1: the header
                    f"{URLS[0]},fine\n"  # line 2: row 0
                    f'{URLS[1]},"an unterminated quote\n'  # line 3: row 1 ...
                    f'{URLS[2]},"the next row"\n'  # line 4: row 2
                    f"{URLS[3]},fine,an extra field\n"  # line 5: row 3, ragged
                    f"{URLS[4]}\n"  # line 6: row 4, ragged
                    f"{URLS[5]},fine\n")  # line 7: row 5
    source = TableSource(str(path), TableOptions(name_template="{index}{ext}"))
    outcomes = outcomes_of(source)
    assert outcomes[0] == ("0.jpg", URLS[0])
    assert outcomes[1].startswith("row 1 (line 3): malformed (") \
        and outcomes[1].endswith("read on from the line after it"), outcomes[1]
    assert outcomes[2:] == [("2.jpg", URLS[2]),  # line 4, read again as a row of its own
                            "row 3 (line 5): 3 fields where the header has 2",
                            "row 4 (line 6): 1 fields where the header has 2",
                            ("5.jpg", URLS[5])]


def test_line_numbers_follow_the_pages_and_a_journal_without_them_still_resumes(
        tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv")  # each row takes two lines (a quoted newline)
    path.write_text(path.read_text(encoding="utf-8-sig") + "oops,\n", encoding="utf-8")
    source = TableSource(str(path), TableOptions(name_template="{index}{ext}"),
                         rows_per_page=3)
    tokens, token = [], None
    while True:
        tokens.append(token)
        token = source.list_page(token).next_token
        if token is None:
            break
    assert len(tokens) == 3
    last = source.list_page(tokens[-1]).items
    assert last[-1].endswith("row 7 (line 16): 2 fields where the header has 3")
    # a token journaled by an older bulkfetch (byte offset and row, no line): the same rows
    old = ":".join(tokens[-1].split(":")[:2])
    assert [item.partition("\0")[0] for item in source.list_page(old).items] == \
        [item.partition("\0")[0] for item in last]
    assert source.list_page(old).items[-1].endswith("row 7: 2 fields where the header has 3")
