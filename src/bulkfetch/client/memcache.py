"""Bodies by URL in memory for a Client: bounded by bytes, each kept for a time to live.

The usual Python answer is cachetools' TTLCache in front of a thread pool. This one counts
bytes, not entries (a cache of bodies is full when memory is, whatever their number), drops
the least recently used first, and is shared by the threads that call one Client.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MemoryCache"]


class MemoryCache:
    def __init__(self, max_bytes: int, ttl: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 1:
            raise ValueError("cache_bytes must be at least 1")
        if ttl is not None and ttl <= 0:
            raise ValueError("cache_ttl must be more than 0 seconds (None: no expiry)")
        self.max_bytes = max_bytes
        self.ttl = math.inf if ttl is None else ttl
        self.clock = clock
        # url -> (when it expires, body), least recently used first
        self.entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def get(self, url: str) -> bytes | None:
        """The body kept for `url`, or None (never kept, expired, or evicted)."""
        with self.lock:
            entry = self.entries.get(url)
            if entry is not None:
                if entry[0] > self.clock():
                    self.entries.move_to_end(url)
                    self.hits += 1
                    return entry[1]
                del self.entries[url]
                self.bytes -= len(entry[1])
            self.misses += 1
            return None

    def put(self, url: str, body: bytes) -> None:
        """Keep `body` for `url` for the time to live; the least recently used go while the
        bytes kept exceed the bound. A body larger than the whole bound is not kept."""
        if len(body) > self.max_bytes:
            return
        with self.lock:
            old = self.entries.pop(url, None)
            if old is not None:
                self.bytes -= len(old[1])
            self.entries[url] = (self.clock() + self.ttl, body)
            self.bytes += len(body)
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self.entries.popitem(last=False)
                self.bytes -= len(dropped)

    def __len__(self) -> int:
        return len(self.entries)
