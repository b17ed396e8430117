"""Failures as data: every file failed at the end of a run, one JSON object a line, in
DEST/.bulkfetch/failures.jsonl, for jq, pandas or a retry script:

    {"url": "http://h/get/x", "name": "get/x", "reason": "HTTP 404", "attempts": 1,
     "status": 404}

`status` is the HTTP status when the failure was the server's answer, else null. Streamed
from the journal (a run may have millions), written whole or not at all (a temporary file,
then rename), and removed when a run ends with none (a --retry-failed run that fixed all).
With `--report R.json`, a copy goes beside the report as R.failures.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from bulkfetch.dest.journal import STATE_DIR, Journal
from bulkfetch.models import Failure

FILE_NAME = "failures.jsonl"
# The whole reason, exactly as engine/fetcher.py and engine/big.py word an HTTP answer ("HTTP
# 503", "HTTP 403 AccessDenied" with an S3 error code; a piece of a split file adds " (bytes
# A-B)"): a prefix match would also take a sink's "HTTP 404 is a symlink ..." about a
# directory a hostile name called "HTTP 404".
_HTTP = re.compile(r"HTTP ([1-5]\d\d)(?: [A-Za-z][A-Za-z0-9.]{0,63})?(?: \(bytes \d+-\d+\))?")


def http_status(reason: str) -> int | None:
    """The status of a failure that was an HTTP answer ("HTTP 404", "HTTP 503 (bytes 0-9)"),
    or None for a transport or content failure (resets, timeouts, a wrong MD5, an unsafe
    name)."""
    found = _HTTP.fullmatch(reason)
    return int(found[1]) if found else None


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps' setup once, not per line


def failure_line(failure: Failure) -> bytes:
    """One failure as a UTF-8 JSON line. (URL secrets were masked when it was journaled.)"""
    record = {"url": failure.url or None, "name": failure.name, "reason": failure.reason,
              "attempts": failure.attempts, "status": http_status(failure.reason)}
    try:
        return _ENCODE(record).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # A hostile name with a lone surrogate: \u escapes keep the line valid UTF-8 and
        # JSON, and json.loads gives the name back exactly (jq shows U+FFFD).
        return json.dumps(record).encode("ascii") + b"\n"


def write_failures(journal: Journal, dest: Path) -> Path | None:
    """Write DEST/.bulkfetch/failures.jsonl from the journal; its path, or None (and no
    file) when nothing failed. Raises OSError and the journal's errors."""
    path = Path(dest) / STATE_DIR / FILE_NAME
    for stale in path.parent.glob(f".{FILE_NAME}.*.tmp"):  # a run killed while writing;
        stale.unlink(missing_ok=True)  # DEST's lock makes this run the only writer

    def lines(out: BinaryIO) -> None:
        for _, failure in journal.failure_rows():
            out.write(failure_line(failure))

    return _replace(path, lambda: journal.failure_count() > 0, lines)


def beside_report(report_path: Path, failures_file: str | None) -> str | None:
    """With --report R.json: the list copied to R.failures.jsonl beside it; the copy's path,
    or None (and no copy) when there is no list."""
    target = report_path.with_name(report_path.stem + ".failures.jsonl")

    def copy(out: BinaryIO) -> None:
        with open(str(failures_file), "rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)

    written = _replace(target, lambda: failures_file is not None, copy)
    return None if written is None else str(written)


def _replace(path: Path, wanted: Callable[[], bool], fill: Callable[[BinaryIO], None]
             ) -> Path | None:
    """`path` written by `fill` into a temporary file beside it, fsynced, then renamed over
    it (a reader, or a crash, sees the old list or the whole new one); removed instead when
    not `wanted`, and when anything fails: an older run's list would be read as this one's."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if not wanted():
            path.unlink(missing_ok=True)
            return None
        with open(temporary, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        for leftover in (temporary, path):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
        raise
    return path
