"""Failures as data: every file failed at the end of a run, one JSON object a line, in
DEST/.bulkfetch/failures.jsonl, for jq, pandas or a retry script:

    {"url": "http://h/get/x", "name": "get/x", "reason": "HTTP 404", "attempts": 1,
     "status": 404}

`status` is the HTTP status when the failure was the server's answer, else null. Streamed
from the journal (a run may have millions), written whole or not at all (a temporary file,
then rename), and removed when a run ends with none (a --retry-failed run that fixed all).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from bulkfetch.journal import STATE_DIR, Journal
from bulkfetch.redact import redact_text

FILE_NAME = "failures.jsonl"
_HTTP = re.compile(r"HTTP (\d{3})\b")


def http_status(reason: str) -> int | None:
    """The status of a failure that was an HTTP answer ("HTTP 404", "HTTP 503 ..."), or None
    for a transport or content failure (resets, timeouts, a wrong MD5, an unsafe name)."""
    found = _HTTP.match(reason)
    return int(found[1]) if found else None


def write_failures(journal: Journal, dest: Path) -> Path | None:
    """Write DEST/.bulkfetch/failures.jsonl from the journal; its path, or None (and no
    file) when nothing failed. Raises OSError and the journal's errors."""
    path = Path(dest) / STATE_DIR / FILE_NAME
    if journal.failure_count() == 0:
        path.unlink(missing_ok=True)
        return None
    temporary = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            for _, failure in journal.failure_rows():
                handle.write(json.dumps({
                    "url": redact_text(failure.url) or None,
                    "name": failure.name.encode("utf-8", "surrogateescape").decode(
                        "utf-8", "replace"),
                    "reason": failure.reason,
                    "attempts": failure.attempts,
                    "status": http_status(failure.reason),
                }, ensure_ascii=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
