"""--from-file TABLE.parquet (row groups, resume by row index) and --save-cols."""

from __future__ import annotations

import base64
import gc
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa  # the test extra: CI always has it
import pyarrow.parquet as pq
import pytest

from bulkfetch.config import TableOptions
from bulkfetch.errors import UsageError
from bulkfetch.sources.table import JSON_DATA, TableSource, sidecar_name

ROWS = 2500


def write(path: Path, rows: int = ROWS, group: int = 1000) -> Path:
    table = pa.table({"url": [f"http://h/get/f{i}.jpg" if i != 7 else None for i in range(rows)],
                      "caption": [f"photo {i}" for i in range(rows)],
                      "width": list(range(rows))})
    pq.write_table(table, path, row_group_size=group)
    return path


def all_pages(source: TableSource, token: str | None = None) -> list[tuple[str | None, tuple]]:
    found = []
    while True:
        page = source.list_page(token)
        found.append((token, page.items))
        token = page.next_token
        if token is None:
            return found


def test_pages_cross_row_groups_and_every_row_comes_once(tmp_path: Path) -> None:
    source = TableSource(str(write(tmp_path / "t.parquet")),
                         TableOptions(name_template="{index:05d}{ext}"), rows_per_page=700)
    pages = all_pages(source)
    assert [token for token, _ in pages] == [None, "700", "1400", "2100"]
    items = [item for _, page in pages for item in page]
    assert len(items) == ROWS
    assert items[3] == "00003.jpg\0http://h/get/f3.jpg"
    assert items[7] == "00007\0\0row 7: no URL in column 'url'"  # a failure of its own


def test_resuming_at_a_row_reads_from_its_row_group_not_from_the_top(tmp_path: Path) -> None:
    # names from {index}: no names to check for collisions, so no first read of the table
    source = TableSource(str(write(tmp_path / "t.parquet")),
                         TableOptions(name_template="{index}{ext}"), rows_per_page=700)
    assert source.parquet is not None
    opened: list[list[int]] = []
    iter_batches = source.parquet.file.iter_batches

    def counted(**kwargs: Any) -> Any:
        opened.append(list(kwargs["row_groups"]))
        return iter_batches(**kwargs)

    source.parquet.file.iter_batches = counted  # type: ignore[method-assign]
    pages = all_pages(source, "1400")
    assert [token for token, _ in pages] == ["1400", "2100"]
    assert opened == [[1, 2]]  # one stream, from the group holding row 1400, never group 0
    assert pages[0][1][0] == "1400.jpg\0http://h/get/f1400.jpg"


def test_save_cols_add_the_rows_columns_as_a_json_member_of_the_same_sample(
        tmp_path: Path) -> None:
    source = TableSource(str(write(tmp_path / "t.parquet", rows=10)),
                         TableOptions(name_template="{index:03d}{ext}",
                                      save_cols=("caption", "width")))
    (page,) = [items for _, items in all_pages(source)]
    assert len(page) == 2 * 10 - 1  # row 7 has no URL: no JSON either
    name, url = source.resolve(page[1])
    assert name == "000.json" and url.startswith(JSON_DATA)
    assert json.loads(base64.b64decode(url[len(JSON_DATA):])) == {"caption": "photo 0",
                                                                   "width": 0}
    assert source.resolve(page[0]) == ("000.jpg", "http://h/get/f0.jpg")


def test_save_cols_from_csv_keep_the_text(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("url,caption,width\nhttp://h/a/x.png,\"a, b\",12\nhttp://h/a/y.png,c,\n"
                    "http://h/a/z.png,d\n")  # (a row short of a field: a failure of its own)
    source = TableSource(str(path), TableOptions(save_cols=("caption", "width")))
    items = source.list_page(None).items
    assert [source.resolve(i)[0] for i in items[:4]] == ["a/x.png", "a/x.json", "a/y.png",
                                                         "a/y.json"]
    values = [json.loads(base64.b64decode(source.resolve(i)[1][len(JSON_DATA):]))
              for i in items[1:4:2]]
    assert values == [{"caption": "a, b", "width": "12"}, {"caption": "c", "width": ""}]
    with pytest.raises(ValueError, match=r"row 2 \(line 4\): 2 fields where the header has 3"):
        source.resolve(items[4])


def test_parquet_errors_name_the_file_and_what_to_do(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "t.parquet", rows=5)
    with pytest.raises(UsageError, match=r"--save-cols .height. is not a column of its "
                       r"schema \(.url., .caption., .width.\)"):
        TableSource(str(path), TableOptions(save_cols=("height",)))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(UsageError, match=r"broken\.parquet.*not a Parquet file"):
        TableSource(str(broken), TableOptions())
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(UsageError, match=r"pip install 'bulkfetch\[parquet\]'"):
        TableSource(str(path), TableOptions())


def test_sidecar_names() -> None:
    assert sidecar_name("a/b/000042.seg.png") == "a/b/000042.json"
    assert sidecar_name("000042") == "000042.json"
    assert sidecar_name("x.json") == "x.meta.json"


def test_a_name_two_urls_give_is_a_failure_of_the_later_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"url": ["http://a/x/1.jpg", "http://b/x/1.jpg", "http://a/x/2.jpg",
                                     "http://a/x/1.jpg"]}), path, row_group_size=2)
    source = TableSource(str(path), TableOptions(), rows_per_page=3)
    items = [item for _, page in all_pages(source) for item in page]
    assert [source.resolve(items[i]) for i in (0, 2, 3)] == [
        ("x/1.jpg", "http://a/x/1.jpg"), ("x/2.jpg", "http://a/x/2.jpg"),
        ("x/1.jpg", "http://a/x/1.jpg")]  # the same URL again is no collision
    with pytest.raises(ValueError, match=r"name collision: http://b/x/1\.jpg .*http://a/x/1"):
        source.resolve(items[1])


def test_listing_a_big_table_holds_about_one_row_group_of_the_needed_column(
        tmp_path: Path) -> None:
    rows, group = 300_000, 100_000
    path = tmp_path / "big.parquet"
    # a wide column nobody asked for: reading it, or the whole table, would show at once
    pq.write_table(pa.table({"url": [f"http://h/get/f{i:012d}.jpg" for i in range(rows)],
                             "caption": [f"caption {i:012d} " * 8 for i in range(rows)]}),
                   path, row_group_size=group)
    one_group = pq.ParquetFile(path).read_row_group(0, columns=["url"]).nbytes
    source = TableSource(str(path), TableOptions(name_template="{index:09d}{ext}"))
    gc.collect()  # a ParquetFile freed late would shrink what the listing seems to hold
    before, held, token, listed = pa.total_allocated_bytes(), 0, None, 0
    while True:
        page = source.list_page(token)
        listed += len(page.items)
        held = max(held, pa.total_allocated_bytes() - before)
        if (token := page.next_token) is None:
            break
    assert listed == rows
    # the bar is about one group's URLs; the stream of pages holds less (2.9 MB
    # here), reading a group at a time 6.6 MB, the whole table 14 MB
    assert held < 1.5 * one_group, (held, one_group)


def test_the_parquet_table_is_part_of_the_run(tmp_path: Path) -> None:
    from bulkfetch.config import GetOptions

    path = write(tmp_path / "t.parquet", rows=10)
    options = GetOptions(source=str(path), dest=str(tmp_path / "d"), from_file=True,
                         table=TableOptions(save_cols=("caption",)))
    first = options.fingerprint()
    assert first["table"] == {"url_col": "url", "name_col": None, "name_template": None,
                              "save_cols": ("caption",)}
    write(path, rows=11)  # another table at the same path: another run
    assert options.fingerprint()["table_identity"] != first["table_identity"] != []


def test_jsonl_values_keep_their_json_types(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"url": "http://h/1.jpg", "width": 640, "tags": ["a"],
                                "caption": None}) + "\n")
    source = TableSource(str(path), TableOptions(save_cols=("width", "tags", "caption", "x")))
    _, data = source.resolve(source.list_page(None).items[1])
    assert json.loads(base64.b64decode(data[len(JSON_DATA):])) == {
        "width": 640, "tags": ["a"], "caption": None, "x": None}


def test_save_cols_need_a_table_not_a_url_list(tmp_path: Path) -> None:
    from bulkfetch.config import GetOptions
    from bulkfetch.sources import make_source

    urls = tmp_path / "urls.txt"
    urls.write_text("http://h/1.jpg\n")
    with pytest.raises(UsageError, match=r"--save-cols .*urls\.txt"):
        make_source(GetOptions(source=str(urls), dest=str(tmp_path / "d"), from_file=True,
                               table=TableOptions(save_cols=("caption",))))
