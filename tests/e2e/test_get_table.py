"""`bulkfetch get --from-file TABLE` end to end (issue 19): a CSV and a JSONL table of URLs
against the reference server, names from a template so that URLs sharing a last path
component on two hosts are both kept, and a rerun that fetches nothing again."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from getkit import kill_after_pages, read_journal

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.sizes import parse_size_spec
from bulkfetch.testing import ReferenceServer

FILES = 1250  # each served file is listed twice: once per host name
ROWS = 2 * FILES


def table(path: Path, port: int, files: int = FILES) -> Path:
    """Row r: file r // 2, on 127.0.0.1 for even r and on localhost for odd r."""
    rows = [{"url": f"http://{'127.0.0.1' if r % 2 == 0 else 'localhost'}:{port}/get/"
                    f"f{r // 2:010d}", "caption": f"row {r}, \"quoted\"\nsecond line"}
            for r in range(2 * files)]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    elif path.suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, ["caption", "url"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def get(source: Path, dest: Path, report: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(source), str(dest),
         "--name-template", "{index:06d}{ext}.bin", "-w", "2", "--quiet", "--report",
         str(report)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_table_of_urls_lands_under_template_names_and_resumes(tmp_path: Path,
                                                                suffix: str) -> None:
    data = SyntheticDataSet(FILES, 1000, 0, parse_size_spec("uniform:10:2k"))
    dest = tmp_path / "d"
    with ReferenceServer("--files", str(FILES), "--file-size", "uniform:10:2k",
                         access_log=True) as server:
        source = table(tmp_path / f"urls{suffix}", server.port)
        proc, report = get(source, dest, tmp_path / "r.json")
        assert proc.returncode == 0, proc.stderr
        assert report["files_ok"] == ROWS and report["files_failed"] == 0
        before = len(server.requests())
        again, second = get(source, dest, tmp_path / "r2.json")
        fetched_again = [r for r in server.requests()[before:] if r.target.startswith("/get/")]
    assert again.returncode == 0, again.stderr
    assert fetched_again == [] and second["files_ok"] == ROWS
    # both rows of every file are kept, each under its own name
    for row in range(ROWS):
        assert (dest / f"{row:06d}.bin").read_bytes() == data.body(row // 2), row
    assert len([p for p in dest.iterdir() if p.name != ".bulkfetch"]) == ROWS


@pytest.mark.parametrize("sink", ["tar", "dir"])
def test_save_cols_store_each_rows_columns_beside_its_file_as_one_sample(
        tmp_path: Path, sink: str) -> None:
    files = 300
    data = SyntheticDataSet(files, 1000, 0, parse_size_spec("uniform:10:2k"))
    dest = tmp_path / "d"
    with ReferenceServer("--files", str(files), "--file-size", "uniform:10:2k") as server:
        source = table(tmp_path / "urls.parquet", server.port, files=files)
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(source), str(dest),
             "--name-template", "{index:06d}.bin", "--save-cols", "caption", "--sink", sink,
             "-w", "2", "--quiet"],
            capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    captions = [f"row {r}, \"quoted\"\nsecond line" for r in range(2 * files)]
    if sink == "dir":
        for row in range(2 * files):
            assert (dest / f"{row:06d}.bin").read_bytes() == data.body(row // 2)
            assert json.loads((dest / f"{row:06d}.json").read_bytes()) == {
                "caption": captions[row]}
        return
    import webdataset  # what users read shards with: every sample whole

    shards = sorted(str(p) for p in dest.glob("shard-*.tar"))
    samples = list(webdataset.WebDataset(shards, shardshuffle=False, empty_check=False))
    assert len(samples) == 2 * files
    for sample in samples:
        row = int(sample["__key__"])
        assert sample["bin"] == data.body(row // 2)
        assert json.loads(sample["json"]) == {"caption": captions[row]}


def test_a_changed_table_is_a_different_run(tmp_path: Path) -> None:
    with ReferenceServer("--files", "10") as server:
        source = table(tmp_path / "urls.csv", server.port, files=10)
        proc, _ = get(source, tmp_path / "d", tmp_path / "r.json")
        assert proc.returncode == 0, proc.stderr
        with source.open("a") as handle:
            handle.write(f"extra,http://127.0.0.1:{server.port}/get/f0000000001\n")
        changed = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(source),
             str(tmp_path / "d"), "--name-template", "{index:06d}{ext}.bin", "-w", "2"],
            capture_output=True, text=True, timeout=120)
    assert changed.returncode == 2, changed.stderr
    assert "--restart" in changed.stderr


def test_retry_failed_asks_again_for_the_rows_that_failed(tmp_path: Path) -> None:
    with ReferenceServer("--files", "10", access_log=True) as server:
        source = table(tmp_path / "urls.jsonl", server.port, files=10)
        with source.open("a") as handle:  # a row whose file the server does not have
            handle.write(json.dumps({"url": f"http://127.0.0.1:{server.port}/get/missing"})
                         + "\n" + json.dumps({"caption": "no url"}) + "\n")
        proc, report = get(source, tmp_path / "d", tmp_path / "r.json")
        assert proc.returncode == 1 and report["files_ok"] == 20
        assert sorted(f["name"] for f in report["failures"]) == ["000020.bin", "000021.bin"]
        before = len(server.requests())
        retried = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(source),
             str(tmp_path / "d"), "--name-template", "{index:06d}{ext}.bin", "-w", "2",
             "--quiet", "--retry-failed"], capture_output=True, text=True, timeout=120)
        asked = [r.target for r in server.requests()[before:] if r.target.startswith("/get/")]
    assert retried.returncode == 1, retried.stderr
    assert asked == ["/get/missing"]  # only the failed row with a URL, nothing else


def test_kill_9_midway_then_the_rerun_asks_only_for_the_pages_not_done(tmp_path: Path) -> None:
    files, dest = 15_000, tmp_path / "d"
    data = SyntheticDataSet(files, 1000, 0, parse_size_spec("100"))
    with ReferenceServer("--files", str(files), "--latency", "20", access_log=True) as server:
        source = table(tmp_path / "urls.csv", server.port, files=files)
        first = subprocess.Popen(
            [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(source), str(dest),
             "--name-template", "{index:06d}{ext}.bin", "-w", "2", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        kill_after_pages(first, dest, 10)  # of 30 pages
        done = read_journal(dest, "SELECT count(*) FROM pages WHERE status = 'done'")[0][0]
        before = len(server.requests())
        proc, _ = get(source, dest, tmp_path / "r.json")
        asked = [r for r in server.requests()[before:] if r.target.startswith("/get/")]
    assert proc.returncode == 0, proc.stderr
    assert len(asked) <= 2 * files - done * 1000, (len(asked), done)  # not from row 0
    for row in range(2 * files):
        assert (dest / f"{row:06d}.bin").read_bytes() == data.body(row // 2), row
