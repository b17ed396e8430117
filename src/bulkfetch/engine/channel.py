"""Worker -> coordinator messages over one pipe: the workers write pickled messages under a
shared lock; the coordinator polls the pipe with one poll object kept for the whole run.

Why not multiprocessing.Queue: its get() builds a selector on every call and its put() hands
each message to a feeder thread. With a few messages per page that cost about a microsecond
per file in the main process (measured); here a get is one poll(2) and one read."""

from __future__ import annotations

import pickle
import queue
import select
from multiprocessing.connection import Connection
from typing import Any


class Outbox:
    """A worker's end: put() pickles and writes one whole message."""

    def __init__(self, conn: Connection, lock: Any) -> None:
        self.conn = conn
        self.lock = lock

    def put(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:  # messages of several workers must not interleave
            self.conn.send_bytes(data)


class Inbox:
    """The coordinator's end, with queue.Queue's get(timeout) and get_nowait()."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.poller = select.poll()
        self.poller.register(conn.fileno(), select.POLLIN)

    def get(self, timeout: float) -> Any:
        if not self.poller.poll(max(0, int(timeout * 1000))):
            raise queue.Empty
        return pickle.loads(self.conn.recv_bytes())

    def get_nowait(self) -> Any:
        return self.get(0)


def channel(context: Any) -> tuple[Inbox, Outbox]:
    """(the coordinator's end, the end every worker shares)."""
    reader, writer = context.Pipe(duplex=False)
    return Inbox(reader), Outbox(writer, context.Lock())
