"""`bulkfetch demo`: the main job end to end on one machine, with a check of every file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rich.console import Console

from bulkfetch.errors import UsageError
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

JOURNAL_DIR = ".bulkfetch"
DEMO_MARK = f"{JOURNAL_DIR}/demo"  # what lets a later demo replace DEST


def _check_dest(dest: Path) -> None:
    """The demo replaces DEST, so it must be new, empty, or a demo's own (marked): a real
    download's DEST, journal and all, is not the demo's to remove."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise UsageError(f"DEST {str(dest)!r} exists and is not a directory")
    if any(dest.iterdir()) and not (dest / DEMO_MARK).is_file():
        raise UsageError(f"DEST {str(dest)!r} is not empty and was not made by the demo, "
                         "which removes its DEST before it starts: choose another directory "
                         "(or remove this one yourself if it is an older demo's)")


def _fresh_dest(dest: Path) -> None:
    """DEST emptied and marked as the demo's, so that the next demo may replace it."""
    try:
        if dest.exists():
            shutil.rmtree(dest)
        (dest / JOURNAL_DIR).mkdir(parents=True)
        (dest / DEMO_MARK).write_text("made by `bulkfetch demo`, which replaces this "
                                      "directory\n")
    except OSError as exc:
        raise UsageError(f"cannot make DEST {str(dest)!r}: {exc.strerror} "
                         f"({exc.filename}): choose a directory you can write to") from None


def verify_against_dataset(dest: Path, files: int, seed: int = 0) -> tuple[int, list[str]]:
    """Check every file under DEST byte for byte against the synthetic data set's formula.
    Returns (files verified, problems)."""
    dataset = SyntheticDataSet(files, 1000, seed, parse_size_spec("100"))
    problems: list[str] = []
    verified = 0
    for index in range(files):
        name = dataset.name(index)
        try:
            data = (dest / name).read_bytes()
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror}")
            continue
        if data != dataset.body(index):
            problems.append(f"{name}: content differs")
            continue
        verified += 1
    return verified, problems


def run_demo(files: int, dest_text: str, workers: int | None) -> int:
    from bulkfetch.api import build_options
    from bulkfetch.cli.run import run_download

    console = Console(stderr=True)
    dest = Path(dest_text)
    _check_dest(dest)
    _fresh_dest(dest)
    cores = os.cpu_count() or 1
    with ReferenceServer("--files", str(files)) as server:
        console.print(f"[bold]bulkfetch demo[/]: reference server {server.url} poses as "
                      f"{files:,} files of 100 bytes; downloading into {dest}/")
        options = build_options(server.url, dest, workers=workers or max(1, cores - 1))
        report = run_download(options, quiet=False, plain=False, report_path=None)
    console.print("checking every file against the data set's formula …")
    verified, problems = verify_against_dataset(dest, files)
    for problem in problems[:10]:
        console.print(f"  [red]{problem}[/]")
    console.print(f"verified {verified:,} of {files:,} files byte for byte "
                  f"({len(problems):,} problems)")
    console.print(
        "\nCheck it yourself: the server's ETag is the MD5 of each body, so\n"
        f"  bulkfetch serve --files {files} --port 8000 &\n"
        "  curl -sI http://127.0.0.1:8000/get/f0000000000 | grep -i etag\n"
        f"  md5sum {dest}/f0000000000\n"
        f"and `bulkfetch status {dest}` shows what the journal recorded."
    )
    if problems:
        return 1
    return report.exit_code
