"""The values a directory listing page states of an entry, read from the text the servers
write: a link as found (`Found`, before sources/autoindex.py's safety rules judge it), its
size ('12345' exact, '12K' an estimate) and its modification time (the date columns of
nginx, Apache and lighttpd, ISO 8601 stamps, RFC 1123 dates)."""

from __future__ import annotations

import calendar
import functools
import re
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

UNITS = "KMGTPE"  # powers of 1024, as nginx, Apache and lighttpd all mean them
_MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
# '12345', '12K', '1.0K', '3.0M', '- ', '12 KiB', '123 bytes'
_SIZE = re.compile(r"(\d{1,19}(?:\.\d{1,3})?)\s*(?:([KMGTPE])(?:i?B)?|B|bytes)?", re.IGNORECASE)
_TIME = r"(\d{2}):(\d{2})(?::(\d{2}))?"
# nginx and old Apache: 01-Jan-2025 00:00; Apache: 2025-01-01 00:00; lighttpd: 2025-Jan-01
# 00:00:00 (groups: day, month, year | year, month, day | year, month name, day; then time)
_DATES = (
    (re.compile(rf"(\d{{1,2}})-([A-Za-z]{{3}})-(\d{{4}})\s+{_TIME}"), (2, 1, 0)),
    (re.compile(rf"(\d{{4}})-(\d{{2}})-(\d{{2}})\s+{_TIME}"), (0, 1, 2)),
    (re.compile(rf"(\d{{4}})-([A-Za-z]{{3}})-(\d{{2}})\s+{_TIME}"), (0, 1, 2)),
)


@dataclass(slots=True)
class Found:
    """A link with what the page says of it, before the safety rules."""

    href: str
    size: int | None = None
    size_exact: bool = False
    mtime: int | None = None
    refused: str | None = None  # why it is no entry, known before its link is read


def parse_size(text: str) -> tuple[int, bool] | None:
    """(bytes, exact) of a listing's size column: '12345' exact, '12K' or '1.0K' an estimate
    (K = 1024); None for '-' or anything else."""
    text = text.strip()
    if text.isdigit() and text.isascii() and len(text) <= 19:  # nearly every exact size
        return int(text), True
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    number, unit = match.groups()
    if unit is None and "." not in number:
        return int(number), True
    scale = 1024 ** (UNITS.index(unit.upper()) + 1) if unit else 1
    return round(float(number) * scale), False


@functools.lru_cache(maxsize=1024)  # a listing repeats its minutes
def parse_time(text: str) -> int | None:
    """Unix time of a listing's date column (a zone-less one as UTC), else None."""
    text = text.strip()
    for pattern, (year, month, day) in _DATES:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        fields = match.groups()
        month_text = fields[month]
        number = int(month_text) if month_text.isdigit() else _MONTHS.get(month_text.lower())
        if number is None:
            return None
        try:
            when = datetime(int(fields[year]), number, int(fields[day]), int(fields[3]),
                            int(fields[4]), int(fields[5] or 0))
        except ValueError:  # 31-Feb, 25:00
            return None
        return calendar.timegm(when.timetuple())
    return None


def parse_iso_time(text: str) -> int | None:
    """Unix time of an ISO 8601 / RFC 3339 stamp (a zone-less one as UTC), else None."""
    text = text.strip()
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)  # Go's nanoseconds: datetime takes micro
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return calendar.timegm(when.timetuple())
    return int(when.timestamp())


def parse_http_time(text: str) -> int | None:
    """Unix time of an RFC 1123 date ('Wed, 01 Jan 2025 00:00:00 GMT'), else None."""
    try:
        return int(parsedate_to_datetime(text).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
