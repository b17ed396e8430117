"""Deterministic fault injection: the same (seed, request target, attempt number) always gets
the same fault, so a failing scenario can be replayed, yet a retried request can succeed.

One fault is decided per name rather than per attempt: --deny-rate picks names from
(seed, name) alone, so every attempt at a denied name gets the same permanent error.

Attempts are counted per target. With --processes N the counts live in a table that every
server process shares, so a retry that lands on another process is still the next attempt
(with counts per process, it would meet the same first decisions again)."""

from __future__ import annotations

import enum
import hashlib
import math
import mmap
import zlib
from dataclasses import dataclass
from typing import Protocol

from bulkfetch.errors import UsageError


class Fault(enum.Enum):
    NONE = "none"
    STALL = "stall"  # accept, read the request, never answer
    RESET = "reset"  # TCP reset instead of an answer
    FAIL = "fail"  # 500, or 503 with Retry-After
    THROTTLE = "throttle"  # 429 with Retry-After (seconds or HTTP-date form)
    TRUNCATE = "truncate"  # full Content-Length announced, connection closed mid-body
    CORRUPT = "corrupt"  # right length, wrong bytes
    TRICKLE = "trickle"  # head at once, then the body one byte per --trickle-interval
    OVERLONG = "overlong"  # the announced bytes, then garbage past Content-Length, close
    REDIRECT = "redirect"  # 302 elsewhere: another host name, file://, itself, ?redirected=1
    ENCODING = "encoding"  # Content-Encoding: gzip, gzip over a gzip bomb
    DENY = "deny"  # per name, not per attempt: 400, 401, 403, 404 or 410 every time
    # Not injected at random: --max-concurrent's refusals (503), --max-rps's (429)
    OVERLOAD = "overload"
    RATE = "rate"


# Per-attempt faults in the order their rates are stacked on [0, 1). New faults go at the
# end, so the decisions of an existing configuration stay what they were.
PER_ATTEMPT = (
    Fault.STALL,
    Fault.RESET,
    Fault.FAIL,
    Fault.THROTTLE,
    Fault.TRUNCATE,
    Fault.CORRUPT,
    Fault.TRICKLE,
    Fault.OVERLONG,
    Fault.REDIRECT,
    Fault.ENCODING,
)
_ORDER = PER_ATTEMPT
_ATTEMPTS_KEPT = 1_000_000

REDIRECT_KINDS = ("other-host", "file", "loop", "relative")
DENY_STATUSES = (400, 401, 403, 404, 410)


def parse_redirect_kinds(text: str) -> tuple[str, ...]:
    """'file,loop' -> ('file', 'loop'), in REDIRECT_KINDS order; 'all' -> every kind."""
    words = {word.strip() for word in text.split(",") if word.strip()}
    if words == {"all"}:
        return REDIRECT_KINDS
    unknown = words - set(REDIRECT_KINDS)
    if unknown or not words:
        raise UsageError(f"--redirect-to {text!r}: choose from {', '.join(REDIRECT_KINDS)} "
                         "(comma-separated) or all")
    return tuple(kind for kind in REDIRECT_KINDS if kind in words)


@dataclass(frozen=True)
class FaultConfig:
    stall_rate: float = 0.0
    reset_rate: float = 0.0
    fail_rate: float = 0.0
    throttle_rate: float = 0.0
    truncate_rate: float = 0.0
    corrupt_rate: float = 0.0
    trickle_rate: float = 0.0
    overlong_rate: float = 0.0
    redirect_rate: float = 0.0
    encoding_rate: float = 0.0
    deny_rate: float = 0.0  # per name; not part of the per-attempt sum
    stale_rate: float = 0.0  # per name: S3 listings state another version (stale())
    # --lie-md5: names whose listed digest is wrong (stale() says "etag" for each), so a
    # client checking the listing fails exactly those files
    lie_md5: frozenset[str] = frozenset()
    latency_ms: tuple[float, float] = (0.0, 0.0)
    retry_after: int = 0  # 0: "Retry-After: 0", which asks for no pause
    trickle_interval: float = 1.0
    redirect_to: tuple[str, ...] = REDIRECT_KINDS

    def __post_init__(self) -> None:
        rates = self.rates()
        for fault, rate in zip(_ORDER, rates, strict=True):
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"--{fault.value}-rate must be between 0 and 1, got {rate}")
        if sum(rates) > 1.0 + 1e-9:  # 0.2 + 0.4 + 0.3 + 0.1 is 1.0000000000000002
            raise UsageError("the fault rates add up to more than 1")
        if not 0.0 <= self.deny_rate <= 1.0:
            raise UsageError(f"--deny-rate must be between 0 and 1, got {self.deny_rate}")
        if not 0.0 <= self.stale_rate <= 1.0:
            raise UsageError(f"--stale-rate must be between 0 and 1, got {self.stale_rate}")
        if self.retry_after < 0:
            raise UsageError("--retry-after must be >= 0 seconds")
        if not (math.isfinite(self.trickle_interval) and self.trickle_interval > 0):
            raise UsageError(f"--trickle-interval must be > 0 seconds, "
                             f"got {self.trickle_interval}")
        unknown = set(self.redirect_to) - set(REDIRECT_KINDS)
        if unknown or not self.redirect_to:
            raise UsageError(f"--redirect-to: choose from {', '.join(REDIRECT_KINDS)}")

    def rates(self) -> tuple[float, ...]:
        """The per-attempt rates, in PER_ATTEMPT order."""
        return (
            self.stall_rate,
            self.reset_rate,
            self.fail_rate,
            self.throttle_rate,
            self.truncate_rate,
            self.corrupt_rate,
            self.trickle_rate,
            self.overlong_rate,
            self.redirect_rate,
            self.encoding_rate,
        )

    @property
    def active(self) -> bool:
        return any(self.rates()) or self.deny_rate > 0 or self.latency_ms[1] > 0 or \
            self.misstates

    @property
    def misstates(self) -> bool:
        """Whether listings misstate some names (--stale-rate, --lie-md5): stale() matters."""
        return self.stale_rate > 0 or bool(self.lie_md5)


def parse_latency(text: str, flag: str = "--latency") -> tuple[float, float]:
    """'50' -> (50, 50); '10-100' -> (10, 100), in milliseconds."""
    low, sep, high = text.partition("-")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: use MS or MIN-MAX in milliseconds") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise UsageError(f"{flag} {text!r}: need 0 <= MIN <= MAX")
    return pair


@dataclass(frozen=True, slots=True)
class Decision:
    fault: Fault
    delay_s: float
    alternate: bool  # FAIL: 503 instead of 500; THROTTLE: HTTP-date instead of seconds
    date_form: bool = False  # FAIL's 503: Retry-After as an HTTP-date instead of seconds
    redirect: str = ""  # REDIRECT: one of REDIRECT_KINDS


NO_FAULT = Decision(Fault.NONE, 0.0, False)


class Attempts(Protocol):
    def next(self, target: str) -> int:
        """How many times `target` was asked for before; counts this request."""
        ...

    def looping(self, target: str) -> bool:
        """Whether `target` was sent a `loop` redirect (it is redirected forever)."""
        ...

    def mark_looping(self, target: str) -> None: ...


class LocalAttempts:
    """Exact counts for one process, forgotten all at once past a million targets."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._looping: set[str] = set()

    def next(self, target: str) -> int:
        count = self._counts.get(target, 0)
        if len(self._counts) >= _ATTEMPTS_KEPT:
            self._counts.clear()
        self._counts[target] = count + 1
        return count

    def looping(self, target: str) -> bool:
        return target in self._looping

    def mark_looping(self, target: str) -> None:
        if len(self._looping) >= _ATTEMPTS_KEPT:
            self._looping.clear()
        self._looping.add(target)


class SharedAttempts:
    """Counts shared by every process forked after this is made: one byte per slot of an
    anonymous shared mapping (16 MiB by default, its pages touched as used), slot = CRC-32
    of the target, low 7 bits the count (wrapping at 128), the top bit `looping`.

    Two targets in one slot share a count; among a million targets about 6% do, and their
    attempt numbers run ahead, which changes which fault they meet, not how often. Two
    processes answering one target at the same moment may read the same count."""

    def __init__(self, slots: int = 1 << 24) -> None:
        if slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, got {slots}")
        self._table = mmap.mmap(-1, slots)  # MAP_SHARED | MAP_ANONYMOUS: survives fork
        self._mask = slots - 1

    def slot(self, target: str) -> int:
        return zlib.crc32(target.encode("utf-8", "surrogateescape")) & self._mask

    def next(self, target: str) -> int:
        at = self.slot(target)
        value = self._table[at]
        self._table[at] = (value & 0x80) | ((value + 1) & 0x7F)
        return value & 0x7F

    def looping(self, target: str) -> bool:
        return bool(self._table[self.slot(target)] & 0x80)

    def mark_looping(self, target: str) -> None:
        at = self.slot(target)
        self._table[at] |= 0x80


class FaultPlan:
    def __init__(self, config: FaultConfig, seed: int, attempts: Attempts | None = None) -> None:
        self.config = config
        self._seed = seed
        self._attempts = attempts if attempts is not None else LocalAttempts()
        cumulative, bounds = 0.0, []
        for fault, rate in zip(_ORDER, config.rates(), strict=True):
            cumulative += rate
            bounds.append((cumulative, fault))
        self._bounds = [(limit, fault) for limit, fault in bounds if limit > 0]

    def decide(self, target: str, corruptible: bool, file: bool = True) -> Decision:
        """`corruptible`: a GET of a file, whose bytes may be replaced (corrupt, encoding);
        `file`: a request for a file (GET or HEAD), which may be redirected; list pages are
        not, so a redirect to file:// or a loop fails one file, not the listing."""
        if not self.config.active:
            return NO_FAULT
        attempt = self._attempts.next(target)
        h = hashlib.blake2b(f"{self._seed}/{attempt}/{target}".encode(), digest_size=16).digest()
        unit = int.from_bytes(h[:8], "big") / 2**64
        fault = Fault.NONE
        for limit, candidate in self._bounds:
            if unit < limit:
                fault = candidate
                break
        if (fault in (Fault.CORRUPT, Fault.ENCODING) and not corruptible) or (
            fault is Fault.REDIRECT and not file
        ):
            fault = Fault.NONE
        low, high = self.config.latency_ms
        delay = (low + (high - low) * int.from_bytes(h[8:12], "big") / 2**32) / 1000.0
        redirect = ""
        if file and self._attempts.looping(target):  # following a loop never gets out of it
            fault, redirect = Fault.REDIRECT, "loop"
        elif fault is Fault.REDIRECT:
            kinds = self.config.redirect_to
            redirect = kinds[int.from_bytes(h[13:15], "big") % len(kinds)]
            if redirect == "loop":
                self._attempts.mark_looping(target)
        return Decision(fault, delay, bool(h[12] & 1), bool(h[12] & 2), redirect)

    def stale(self, name: str) -> str | None:
        """What a listing (S3's, or a --shape's) misstates of the object `name`, as if it
        had changed after being listed, from (seed, name) alone: "etag" (another ETag or
        digest, same size), "size" (size and digest), or None. --lie-md5's names: "etag"."""
        if name in self.config.lie_md5:
            return "etag"
        rate = self.config.stale_rate
        if rate <= 0:
            return None
        h = hashlib.blake2b(f"{self._seed}/stale/{name}".encode("utf-8", "surrogatepass"),
                            digest_size=16).digest()
        if int.from_bytes(h[:8], "big") / 2**64 >= rate:
            return None
        return "size" if h[8] & 1 else "etag"

    def denied(self, name: bytes) -> int | None:
        """The permanent error status for file `name`, or None: from (seed, name) alone."""
        rate = self.config.deny_rate
        if rate <= 0:
            return None
        h = hashlib.blake2b(f"{self._seed}/deny/".encode() + name, digest_size=16).digest()
        if int.from_bytes(h[:8], "big") / 2**64 >= rate:
            return None
        return DENY_STATUSES[int.from_bytes(h[8:12], "big") % len(DENY_STATUSES)]
