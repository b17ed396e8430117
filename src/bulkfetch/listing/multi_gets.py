"""GET requests carried at once on one curl multi, in a thread of its own: (key, url) in,
`deliver(key, Answer)` called on that thread as each completes, never more than
`concurrency` in flight. The caller decides what to ask and reads the answers; this only
moves bytes (a thread per request would spend its CPU taking the GIL from the others)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import pycurl

from bulkfetch.net.curl import last_response

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Answer:
    url: str  # where the answer came from, after redirects
    status: int = 0
    headers: tuple[bytes, ...] = ()  # the last response's header lines
    body: bytes = b""
    error: tuple[int, str] | None = None  # libcurl's (code, message): no answer


class MultiGets(Generic[K]):
    def __init__(self, make_handle: Callable[[], pycurl.Curl], concurrency: int,
                 deliver: Callable[[K, Answer], None], stopping: threading.Event,
                 name: str = "bulkfetch-multi-gets") -> None:
        self.make_handle = make_handle
        self.concurrency = max(1, concurrency)
        self.deliver = deliver
        self.stopping = stopping
        self.requests: queue.Queue[tuple[K, str] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=name)

    def start(self) -> None:
        self.thread.start()

    def ask(self, key: K, url: str) -> None:
        self.requests.put((key, url))

    def close(self) -> None:
        """The thread ends once it takes this (requests in flight are dropped)."""
        self.requests.put(None)

    def _serve(self) -> None:
        multi = pycurl.CurlMulti()
        idle = [self.make_handle() for _ in range(self.concurrency)]
        running: dict[pycurl.Curl, tuple[K, str, list[bytes], list[bytes]]] = {}
        try:
            while not self.stopping.is_set():
                while idle:
                    try:
                        request = (self.requests.get(timeout=0.1) if not running
                                   else self.requests.get_nowait())
                    except queue.Empty:
                        break
                    if request is None:
                        return
                    key, url = request
                    handle, body, headers = idle.pop(), [], []
                    handle.setopt(pycurl.URL, url)
                    handle.setopt(pycurl.WRITEFUNCTION, body.append)
                    handle.setopt(pycurl.HEADERFUNCTION, headers.append)
                    multi.add_handle(handle)
                    running[handle] = (key, url, body, headers)
                if not running:
                    continue
                while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                    pass
                _, succeeded, failed = multi.info_read()
                for handle in succeeded:
                    key, url, body, headers = running.pop(handle)
                    answer = Answer(handle.getinfo(pycurl.EFFECTIVE_URL) or url,
                                    int(handle.getinfo(pycurl.RESPONSE_CODE)),
                                    tuple(last_response(headers)), b"".join(body))
                    multi.remove_handle(handle)
                    idle.append(handle)
                    self.deliver(key, answer)
                for handle, code, message in failed:
                    key, url, _, _ = running.pop(handle)
                    answer = Answer(handle.getinfo(pycurl.EFFECTIVE_URL) or url,
                                    error=(code, message))
                    multi.remove_handle(handle)
                    idle.append(handle)
                    self.deliver(key, answer)
                if not succeeded and not failed:
                    multi.select(0.05)
        finally:
            for handle in running:
                multi.remove_handle(handle)
            for handle in [*idle, *running]:
                handle.close()
            multi.close()
