"""What becomes of a transfer that stored nothing: another attempt after a backoff (a
server's Retry-After pausing its whole host), or a failure recorded for its page; and a
server that wants less load (its controller told) or whose certificate was refused (the run
stops). A mixin of Fetcher: its state lives there; none of this runs for a file stored at
its first attempt."""

from __future__ import annotations

import heapq
import time
from typing import Any

import pycurl

from bulkfetch.engine.hosts import HostGate, host_of
from bulkfetch.models import Failure
from bulkfetch.net.curl import FatalTransferError, tls_failure


class Retrying:
    """Fetcher's methods for transfers that did not store (see the module docstring)."""

    def _congested(self, url: str, told_to_wait: bool = False) -> None:
        """The server of `url` wants less: its host's controller, once there is one per
        host (then the others keep theirs), else the worker's."""
        if self.windows is not None:
            self.windows.congested(host_of(url), told_to_wait)
        else:
            self.controller.congested(told_to_wait=told_to_wait)  # type: ignore[union-attr]

    def _tls_fatal(self, handle: pycurl.Curl, code: int, message: str) -> FatalTransferError:
        """The error that stops the run on a certificate libcurl refused: every other file
        from that host would fail the same way, so none is failed (its page stays not done;
        the rerun, once the certificate is trusted, fetches it)."""
        name, url = self.transfer_of[handle][1:3]
        url = handle.getinfo(pycurl.EFFECTIVE_URL) or url  # a redirect's target, if one
        return FatalTransferError(
            f"fetching {name!r}: {tls_failure(code, message, url, self.options.tls)}")

    def _retry_or_fail(self, transfer: Any, reason: str, retryable: bool,
                       retry_after: float | None, big: bool = False) -> None:
        state, name, url, attempt = transfer
        if retryable and attempt <= self.policy.retries:
            if self.hops and name in self.hops.get(state, ()):  # from the listed URL again
                url = self.hops[state].pop(name)[0]
            self._retry_later((state, name, url, attempt + 1), attempt, retry_after, big)
        else:
            self._fail(state, name, reason, attempt, url, in_gate=not big)

    def _retry_later(self, transfer: tuple[object, ...], attempt: int,
                     retry_after: float | None, big: bool) -> None:
        """Queue `transfer` (the next attempt) after the backoff for retry `attempt`."""
        delay = self.policy.delay(attempt, retry_after, self.rng)
        if self.gate is not None and not big:
            self.gate.ended(str(transfer[2]))
        if retry_after:  # the server asked to be left alone: the whole host, not one file
            if self.gate is None:
                self.gate = HostGate()
            self.gate.pause(str(transfer[2]), delay)
        self.retries += 1
        heapq.heappush(self.waiting, (time.monotonic() + delay, next(self.order), transfer, big))

    def _fail(self, state: Any, name: str, reason: str, attempts: int,
              url: str = "", in_gate: bool = True) -> None:
        """`in_gate` False: the host gate does not count the transfer as a small one in
        flight (a big body's, or one it was told had ended)."""
        state.failures.append(Failure(name, reason, attempts, url))
        if self.gate is not None and url and attempts and in_gate:  # 0: it never started
            self.gate.ended(url)
        self.sink.skip(state.page.seq, name)
        self.files_failed += 1
        state.remaining -= 1
        if state.remaining == 0:
            self._page_finished(state)
