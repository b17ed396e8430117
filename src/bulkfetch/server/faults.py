"""Deterministic fault injection: the same (seed, request target, attempt number) always gets
the same fault, so a failing scenario can be replayed, yet a retried request can succeed."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from bulkfetch.errors import UsageError


class Fault(enum.Enum):
    NONE = "none"
    STALL = "stall"  # accept, read the request, never answer
    RESET = "reset"  # TCP reset instead of an answer
    FAIL = "fail"  # 500 or 503
    THROTTLE = "throttle"  # 429 with Retry-After (seconds or HTTP-date form)
    TRUNCATE = "truncate"  # full Content-Length announced, connection closed mid-body
    CORRUPT = "corrupt"  # right length, wrong bytes


_ORDER = (Fault.STALL, Fault.RESET, Fault.FAIL, Fault.THROTTLE, Fault.TRUNCATE, Fault.CORRUPT)
_ATTEMPTS_KEPT = 1_000_000


@dataclass(frozen=True)
class FaultConfig:
    stall_rate: float = 0.0
    reset_rate: float = 0.0
    fail_rate: float = 0.0
    throttle_rate: float = 0.0
    truncate_rate: float = 0.0
    corrupt_rate: float = 0.0
    latency_ms: tuple[float, float] = (0.0, 0.0)
    retry_after: int = 1

    def __post_init__(self) -> None:
        rates = self.rates()
        for fault, rate in zip(_ORDER, rates, strict=True):
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"--{fault.value}-rate must be between 0 and 1, got {rate}")
        if sum(rates) > 1.0 + 1e-9:  # 0.2 + 0.4 + 0.3 + 0.1 is 1.0000000000000002
            raise UsageError("the fault rates add up to more than 1")
        if self.retry_after < 0:
            raise UsageError("--retry-after must be >= 0 seconds")

    def rates(self) -> tuple[float, ...]:
        return (
            self.stall_rate,
            self.reset_rate,
            self.fail_rate,
            self.throttle_rate,
            self.truncate_rate,
            self.corrupt_rate,
        )

    @property
    def active(self) -> bool:
        return any(self.rates()) or self.latency_ms[1] > 0


def parse_latency(text: str) -> tuple[float, float]:
    """'50' -> (50, 50); '10-100' -> (10, 100), in milliseconds."""
    low, sep, high = text.partition("-")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise UsageError(f"--latency {text!r}: use MS or MIN-MAX in milliseconds") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise UsageError(f"--latency {text!r}: need 0 <= MIN <= MAX")
    return pair


@dataclass(frozen=True, slots=True)
class Decision:
    fault: Fault
    delay_s: float
    alternate: bool  # FAIL: 503 instead of 500; THROTTLE: HTTP-date instead of seconds


NO_FAULT = Decision(Fault.NONE, 0.0, False)


class FaultPlan:
    def __init__(self, config: FaultConfig, seed: int) -> None:
        self.config = config
        self._seed = seed
        self._attempts: dict[str, int] = {}
        cumulative, bounds = 0.0, []
        for fault, rate in zip(_ORDER, config.rates(), strict=True):
            cumulative += rate
            bounds.append((cumulative, fault))
        self._bounds = [(limit, fault) for limit, fault in bounds if limit > 0]

    def attempt(self, target: str) -> int:
        """How many times this target was asked for before (in this process)."""
        count = self._attempts.get(target, 0)
        if len(self._attempts) >= _ATTEMPTS_KEPT:
            self._attempts.clear()
        self._attempts[target] = count + 1
        return count

    def decide(self, target: str, corruptible: bool) -> Decision:
        if not self.config.active:
            return NO_FAULT
        attempt = self.attempt(target)
        h = hashlib.blake2b(f"{self._seed}/{attempt}/{target}".encode(), digest_size=16).digest()
        unit = int.from_bytes(h[:8], "big") / 2**64
        fault = Fault.NONE
        for limit, candidate in self._bounds:
            if unit < limit:
                fault = candidate
                break
        if fault is Fault.CORRUPT and not corruptible:
            fault = Fault.NONE
        low, high = self.config.latency_ms
        delay = (low + (high - low) * int.from_bytes(h[8:12], "big") / 2**32) / 1000.0
        return Decision(fault, delay, bool(h[12] & 1))
