"""File-size specifications: a constant, or a distribution drawn deterministically per file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from bulkfetch.errors import UsageError

_NORMAL = NormalDist()

SIZE_SPEC_HELP = (
    "bytes per file: an integer (100), 'uniform:MIN:MAX' or 'lognormal:MEDIAN:SIGMA:MAX'; "
    "sizes accept k/m/g suffixes (binary)"
)


def parse_bytes(text: str) -> int:
    """'100', '4k', '1.5m', '2g' -> bytes (binary multiples)."""
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    factor = 1
    if raw and raw[-1] in "kmgt":
        factor = 1024 ** ("kmgt".index(raw[-1]) + 1)
        raw = raw[:-1]
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{text!r} is not a size in bytes (examples: 100, 64k, 1.5m)") from None
    if value < 0 or not math.isfinite(value):
        raise UsageError(f"{text!r} must be a non-negative size in bytes")
    return int(value * factor)


@dataclass(frozen=True)
class SizeSpec:
    """How big file number `index` is. `unit` is a uniform draw in [0, 1) for that file."""

    kind: str  # "constant" | "uniform" | "lognormal"
    a: float
    b: float = 0.0
    maximum: int = 0

    @property
    def is_constant(self) -> bool:
        return self.kind == "constant"

    def size(self, unit: float) -> int:
        if self.kind == "constant":
            return int(self.a)
        if self.kind == "uniform":
            # min(): a unit of 2**64 - 1 over 2**64 rounds to 1.0 as a float
            return min(self.maximum, int(self.a + unit * (self.maximum - self.a + 1)))
        # lognormal: median * exp(sigma * z), z standard normal from the unit draw
        unit = min(max(unit, 1e-12), 1 - 1e-12)
        z = _NORMAL.inv_cdf(unit)
        return min(self.maximum, max(0, round(self.a * math.exp(self.b * z))))

    def spec(self) -> str:
        """The --file-size text that parses back to this."""
        if self.kind == "constant":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{self.maximum}"
        return f"lognormal:{self.a:g}:{self.b!r}:{self.maximum}"

    def describe(self) -> str:
        if self.kind == "constant":
            return f"{int(self.a)} B"
        if self.kind == "uniform":
            return f"uniform {int(self.a)}..{self.maximum} B"
        return f"lognormal median {int(self.a)} B sigma {self.b} max {self.maximum} B"


def parse_size_spec(text: str) -> SizeSpec:
    parts = text.strip().split(":")
    kind = parts[0].lower()
    if len(parts) == 1:
        return SizeSpec("constant", parse_bytes(parts[0]))
    if kind == "uniform" and len(parts) == 3:
        low, high = parse_bytes(parts[1]), parse_bytes(parts[2])
        if high < low:
            raise UsageError(f"file size {text!r}: MAX must be at least MIN")
        return SizeSpec("uniform", low, maximum=high)
    if kind == "lognormal" and len(parts) == 4:
        median, maximum = parse_bytes(parts[1]), parse_bytes(parts[3])
        try:
            sigma = float(parts[2])
        except ValueError:
            raise UsageError(f"file size {text!r}: SIGMA must be a number") from None
        if sigma < 0 or median <= 0:
            raise UsageError(f"file size {text!r}: MEDIAN must be > 0 and SIGMA >= 0")
        return SizeSpec("lognormal", median, sigma, maximum)
    raise UsageError(f"file size {text!r} is not understood; use {SIZE_SPEC_HELP}")
