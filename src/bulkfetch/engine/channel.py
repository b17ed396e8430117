"""Worker <-> coordinator signalling for worker processes: each worker's own results pipe,
and a stop flag they all read.

One pipe per worker and no lock anywhere: a worker stopped (SIGSTOP, a hung mount) or
killed in the middle of a write or a read can hold up nobody else. A shared pipe needs a
shared lock, and a multiprocessing.Event takes one on every is_set(); a worker frozen while
holding either would freeze them all, and one killed holding it would leave it held.

The coordinator reads every pipe without blocking, with one poll object kept for the whole
run, and cuts messages out of what it read (a length, then a pickle): a worker frozen halfway
through writing a message leaves half a message, never a coordinator blocked on the rest.

Why not multiprocessing.Queue: its get() builds a selector on every call and its put() hands
each message to a feeder thread. With a few messages per page that cost about a microsecond
per file in the main process (measured); here a get is one poll(2) and one read."""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import struct
from typing import Any

_LENGTH = struct.Struct("<Q")
_READ = 1 << 20
_ROUNDS = 64  # reads of each pipe per take(), at most


class Outbox:
    """A worker's end: put() pickles and writes one whole message (blocking while the pipe
    is full: the coordinator is behind, and the worker waits for it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def put(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        parts = [memoryview(_LENGTH.pack(len(data))), memoryview(data)]
        while parts:
            written = os.writev(self.fd, parts)
            while parts and written >= len(parts[0]):
                written -= len(parts[0])
                parts.pop(0)
            if parts and written:
                parts[0] = parts[0][written:]

    def close(self) -> None:
        os.close(self.fd)


def pipe() -> tuple[int, Outbox]:
    """A worker's pipe: (the coordinator's non-blocking read end, the worker's Outbox)."""
    reader, writer = os.pipe()
    os.set_blocking(reader, False)
    return reader, Outbox(writer)


class Inboxes:
    """The coordinator's ends of every worker's pipe, read with one poll object."""

    def __init__(self) -> None:
        self.poller = select.poll()
        self.buffers: dict[int, bytearray] = {}

    def add(self, fd: int) -> None:
        self.poller.register(fd, select.POLLIN)
        self.buffers[fd] = bytearray()

    def take(self, timeout: float) -> tuple[dict[int, list[Any]], list[int]]:
        """Waits up to `timeout` for something to read, then reads what is there: each
        pipe's whole messages by fd, and the pipes at their end (their worker is gone; each
        is closed and forgotten after its last messages)."""
        taken: dict[int, list[Any]] = {}
        ended: list[int] = []
        wait_ms = max(0, int(timeout * 1000))
        for _ in range(_ROUNDS):  # bounded: a worker that never stops writing must not
            events = self.poller.poll(wait_ms)  # keep the coordinator here
            if not events:
                break
            wait_ms = 0
            for fd, _ in events:
                messages = self._read(fd)
                if messages is None:
                    ended.append(fd)
                elif messages:
                    taken.setdefault(fd, []).extend(messages)
        return taken, ended

    def _read(self, fd: int) -> list[Any] | None:
        buffer = self.buffers[fd]
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return []
        if not data:  # every writer closed: whatever was left is half a message
            self.poller.unregister(fd)
            del self.buffers[fd]
            os.close(fd)
            return None
        buffer += data
        messages, start, end = [], 0, len(buffer)
        with memoryview(buffer) as view:  # released before the buffer is cut
            while end - start >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(view, start)
                if end - start - _LENGTH.size < size:
                    break
                begin = start + _LENGTH.size
                messages.append(pickle.loads(view[begin:begin + size]))
                start = begin + size
        del buffer[:start]
        return messages

    def close(self) -> None:
        for fd in list(self.buffers):
            self.poller.unregister(fd)
            os.close(fd)
        self.buffers.clear()


class StopFlag:
    """Set by the coordinator, read by every worker at its tick, with no lock."""

    def __init__(self, context: Any) -> None:
        self.value = context.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self.value.value = True

    def is_set(self) -> bool:
        return bool(self.value.value)
