"""DEST/.bulkfetch/status.json: a running `get`'s numbers of the last second, written by its
coordinator (runners/live.py) and read by `bulkfetch status` (dest/journal_reader.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bulkfetch.dest.journal import STATE_DIR

STATUS_NAME = "status.json"
STATUS_VERSION = 1


def read_live(dest: Path) -> dict[str, Any] | None:
    """DEST's status.json as written by the last run, or None when there is none or it
    cannot be read (a run that never got that far, or a damaged file)."""
    try:
        found = json.loads((Path(dest) / STATE_DIR / STATUS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
