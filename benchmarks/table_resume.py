"""A big URL table through kill -9 (issue 19's second acceptance):

    python benchmarks/table_resume.py [--rows 1000000] [--format parquet] [--kill-at 0.4]

The reference server serves ROWS files; a generated table (Parquet in row groups of
ROWS/10, or CSV, or JSONL) lists their URLs with a caption and a width column.
`bulkfetch get --from-file TABLE DEST --name-template '{index:09d}.bin' --save-cols
caption,width --sink tar --shard-files 10000 -w 2` runs until KILL_AT of its pages are
journaled done, is killed with SIGKILL (the whole process group), and runs again to the
end. Printed: the file requests the server got
in each run (the rerun must not start from row 0: it asks for about the rows not done),
peak RSS (the largest process, and the sum over the main process and its workers, polled
every 0.2 s), the peak of the tree's summed PSS (proportional set size: a page shared by
the forked workers counts once in all, where summed RSS counts it in each), and the
check: the webdataset package reads exactly ROWS samples from the shards, each with its
.bin (bytes equal) and its .json (the row's columns).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec
from harness import pages_done, tree_pids

RSS_BAR_MB = 150


def write_table(path: Path, base: str, names: list[str], kind: str) -> None:
    rows = ({"url": f"{base}/get/{name}", "caption": f"a photo, number {i}",
             "width": 100 + i % 900} for i, name in enumerate(names))
    if kind == "csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, ["url", "caption", "width"])
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "jsonl":
        with path.open("w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        group = max(1, len(names) // 10)
        with pq.ParquetWriter(path, pa.schema([("url", pa.string()), ("caption", pa.string()),
                                               ("width", pa.int64())])) as writer:
            batch: list[dict[str, object]] = []
            for row in rows:
                batch.append(row)
                if len(batch) == group:
                    writer.write_table(pa.Table.from_pylist(batch), row_group_size=group)
                    batch = []
            if batch:
                writer.write_table(pa.Table.from_pylist(batch), row_group_size=group)


def file_requests(log: Path) -> int:
    with log.open("rb") as handle:
        return sum(b" /get/" in line for line in handle)


def tree_rss_kb(root: int) -> dict[int, int]:
    """VmHWM (peak RSS, KiB) of `root` and its descendants."""
    found = {}
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    found[pid] = int(line.split()[1])
        except OSError:
            continue
    return found


def tree_pss_kb(root: int) -> int:
    """The PSS (KiB) of `root` and its descendants, summed: memory the tree uses, pages
    shared after fork divided among their sharers."""
    total = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def run(cmd: list[str], dest: Path, stop_at_pages: int | None
        ) -> tuple[int, dict[int, int], int]:
    """Run `cmd`; SIGKILL its group once `stop_at_pages` pages are done. (exit code or -9,
    peak RSS KiB by pid with the main process under -1, the tree's peak summed PSS KiB)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    peaks: dict[int, int] = {}
    pss_peak = 0
    while proc.poll() is None:
        for pid, kb in tree_rss_kb(proc.pid).items():
            key = -1 if pid == proc.pid else pid  # -1: the main process
            peaks[key] = max(peaks.get(key, 0), kb)
        pss_peak = max(pss_peak, tree_pss_kb(proc.pid))
        if stop_at_pages is not None and pages_done(dest) >= stop_at_pages:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -9, peaks, pss_peak
        time.sleep(0.2)
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    return 0, peaks, pss_peak


def check(dest: Path, data: SyntheticDataSet, rows: int) -> tuple[int, int]:
    """(samples webdataset reads, samples whole and right)."""
    import webdataset

    shards = sorted(str(p) for p in dest.glob("shard-*.tar"))
    count = right = 0
    for sample in webdataset.WebDataset(shards, shardshuffle=False, empty_check=False):
        count += 1
        index = int(sample["__key__"])
        meta = json.loads(sample.get("json", b"null"))
        body = sample.get("bin")
        if (body is not None and hashlib.md5(body).digest() == hashlib.md5(
                data.body(index)).digest() and meta is not None
                and str(meta.get("caption")) == f"a photo, number {index}"
                and int(meta.get("width")) == 100 + index % 900):
            right += 1
    return count, right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("parquet", "csv", "jsonl"), default="parquet")
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of pages done")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-table-resume-"))
    data = SyntheticDataSet(args.rows, 1000, 0, parse_size_spec("100"), False)
    pages = -(-args.rows // 1000)
    stop_at = max(1, int(pages * args.kill_at * random.uniform(0.8, 1.2)))
    with ReferenceServer("--files", str(args.rows), access_log=True) as server:
        assert server.log_path is not None
        table = work / f"table.{args.format}"
        started = time.monotonic()
        write_table(table, server.url, [data.name(i) for i in range(args.rows)], args.format)
        made = time.monotonic() - started
        dest = work / "dest"
        cmd = [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(table), str(dest),
               "--name-template", "{index:09d}.bin", "--save-cols", "caption,width",
               "--sink", "tar", "--shard-files", "10000", "-w", str(args.workers), "--quiet"]
        rows_out = []
        for label, stop in (("killed", stop_at), ("rerun", None)):
            before = file_requests(server.log_path)
            started = time.monotonic()
            code, peaks, pss = run(cmd, dest, stop)
            elapsed = time.monotonic() - started
            asked = file_requests(server.log_path) - before
            done = pages_done(dest)
            main = peaks.pop(-1, 0)
            rows_out.append((label, code, done, asked, elapsed, main / 1024,
                             max(peaks.values(), default=0) / 1024,
                             (main + sum(peaks.values())) / 1024, pss / 1024))
    count, right = check(dest, data, args.rows)
    print(f"{args.rows:,}-row {args.format} table ({made:.1f} s to write), "
          f"`get --from-file ... --name-template '{{index:09d}}.bin' --save-cols caption,width "
          f"--sink tar --shard-files 10000 -w {args.workers}`, killed at {stop_at} of {pages} "
          "pages done\n")
    print("| run | exit | pages done after | file requests | s | peak RSS MB: main process "
          "| largest worker | sum | tree PSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, code, done, asked, elapsed, main, largest, total, pss in rows_out:
        print(f"| {label} | {code} | {done:,} | {asked:,} | {elapsed:.1f} | {main:.0f} "
              f"| {largest:.0f} | {total:.0f} | {pss:.0f} |")
    killed_done, rerun_asked = rows_out[0][2], rows_out[1][3]
    not_done_rows = args.rows - killed_done * 1000
    print(f"\n- [{'x' if count == right == args.rows else ' '}] webdataset reads {count:,} "
          f"samples, {right:,} whole and right (bar: exactly {args.rows:,})")
    # the rerun asks for the rows not done, plus retries of faults (none here): not row 0
    print(f"- [{'x' if rerun_asked <= not_done_rows * 1.02 else ' '}] the rerun asked for "
          f"{rerun_asked:,} files; rows not done at the kill: {not_done_rows:,} (bar: not "
          f"from row 0, so at most these, 2% slack)")
    peak = max(max(r[5], r[6]) for r in rows_out)
    print(f"- [{'x' if peak < RSS_BAR_MB else ' '}] peak RSS of the largest process "
          f"{peak:.0f} MB (bar: under {RSS_BAR_MB} MB)")
    tree = max(r[8] for r in rows_out)
    print(f"- [{'x' if tree < RSS_BAR_MB else ' '}] peak memory of the whole tree (summed "
          f"PSS) {tree:.0f} MB (bar: under {RSS_BAR_MB} MB)")


if __name__ == "__main__":
    main()
