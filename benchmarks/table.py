"""URL tables beside a plain URL list, in one run:

    python benchmarks/table.py [--files 200000] [--rounds 3] [--export-dir DIR]

nginx serves a static export of FILES 100-byte files, pinned to core 0. `bulkfetch get
--from-file ... --sink null -w 1`, pinned to core 1, fetches the same URLs listed three
ways: urls.txt (one per line), urls.csv, urls.jsonl and urls.parquet (row groups of
FILES/10; a caption column beside the URL, names from `--name-template '{index:09d}{ext}'`);
the rows run in a rotated order each round. Issue 19's bar: a run from a 200,000-row
Parquet table at least 0.9x the files/s of the same run from a .txt list (CSV and JSONL are
held to it too).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import tempfile
from pathlib import Path

from harness import (
    bulkfetch_command,
    cached_export,
    fit_open_file_cache,
    log,
    pinning,
    run_measured,
    settle,
    start_nginx,
)

BAR = 0.9


def write_lists(base: str, names: list[str], work: Path) -> dict[str, Path]:
    urls = [f"{base}/get/{name}" for name in names]
    lists = {"txt": work / "urls.txt", "csv": work / "urls.csv", "jsonl": work / "urls.jsonl"}
    lists["txt"].write_text("".join(url + "\n" for url in urls))
    with lists["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["url", "caption"])
        writer.writerows((url, f"a photo, number {i}") for i, url in enumerate(urls))
    lists["jsonl"].write_text("".join(json.dumps({"url": url, "caption": f"photo {i}"}) + "\n"
                                      for i, url in enumerate(urls)))
    import pyarrow as pa
    import pyarrow.parquet as pq

    lists["parquet"] = work / "urls.parquet"
    pq.write_table(pa.table({"url": urls, "caption": [f"photo {i}" for i in range(len(urls))]}),
                   lists["parquet"], row_group_size=max(1, len(urls) // 10))
    return lists


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--export-dir", type=Path, default=None)
    args = parser.parse_args()
    place = pinning()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-table-"))
    config, note = cached_export(args.files, args.export_dir or work / "export")
    if config is None:
        raise SystemExit(note)
    conf, _ = fit_open_file_cache(config, work, 64)
    nginx = start_nginx(place.server, conf)
    names = sorted(os.listdir(Path(config).parent / "files"))
    lists = write_lists(nginx.url, names, work)
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in lists}
    try:
        for number in range(args.rounds):
            order = list(lists)[number % len(lists):] + list(lists)[:number % len(lists)]
            for kind in order:
                dest, report = work / f"d-{kind}", work / f"r-{kind}.json"
                settle(dest, report, pause=1.0)
                extra = [] if kind == "txt" else ["--name-template", "{index:09d}{ext}"]
                got = run_measured([*place.client, *bulkfetch_command(), "get", "--from-file",
                                    str(lists[kind]), str(dest), "--sink", "null", "-w", "1",
                                    "-q", "--report", str(report), *extra])
                ok = json.loads(report.read_text())["files_ok"] if report.exists() else 0
                if got.returncode != 0 or ok != args.files:
                    raise SystemExit(f"{kind}: exit {got.returncode}, {ok} files ok")
                results[kind].append((args.files / got.seconds,
                                      got.cpu_seconds / args.files * 1e6))
                log(f"round {number + 1} {kind}: {args.files / got.seconds:,.0f} files/s")
    finally:
        nginx.stop()
    print(f"\n## {args.files:,} files of 100 bytes from nginx, `--sink null -w 1` (server on "
          f"core 0, client on core 1; median of {args.rounds} rounds)\n")
    print("| --from-file | files/s | CPU µs/file | files/s × .txt |")
    print("|---|---:|---:|---:|")
    ratios = {kind: [r[0] / t[0] for r, t in zip(rows, results["txt"], strict=True)]
              for kind, rows in results.items()}
    for kind, rows in results.items():
        print(f"| urls.{kind} | {statistics.median(r[0] for r in rows):,.0f} | "
              f"{statistics.median(r[1] for r in rows):.1f} | "
              f"{statistics.median(ratios[kind]):.3f} |")
    print()
    for kind in ("parquet", "csv", "jsonl"):
        median = statistics.median(ratios[kind])
        rounds = ", ".join(f"{value:.3f}" for value in ratios[kind])
        print(f"- [{'x' if median >= BAR else ' '}] {kind} files/s × txt {median:.3f} "
              f"(>= {BAR}; rounds {rounds})")


if __name__ == "__main__":
    main()
