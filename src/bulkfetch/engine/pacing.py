"""--limit-rate for big bodies (engine/big.py): their bytes taken from their host's byte
bucket (hosts.HostGate) as they come, and the transfers of a host in debt held.

A small body is charged at its start (its host's mean body size) and corrected when it is
stored. A big one is not: charged in full at its end, a body paced by libcurl (each
transfer is capped at the worker's whole share) was paid for twice, and the run went at
half the rate. So a big body's start takes only a reserve (hosts.RESERVE_S of the rate, for
its first bytes: every big body free to start would start at once before any byte showed),
its bytes are charged each turn of the loop, and what it did not use of its reserve is
given back when it ends. A transfer under way is not slowed by the bucket, and several at
once went at several times the rate (one file in 4 parts: up to 3x): the transfers of a
host more than RESERVE_S in debt are paused until it is out of debt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import pycurl

from bulkfetch.engine.hosts import RESERVE_S, HostGate
from bulkfetch.engine.parts import Part
from bulkfetch.engine.spooling import SpooledBody


class BigPacing:
    def __init__(self, gate: HostGate) -> None:
        self.gate = gate
        self.held: set[Any] = set()  # handles paused: their host is in debt

    def started(self, body: Any, url: str) -> None:
        """`body` (a SpooledBody, Part, or a layout probe) of `url` began on a handle; the
        gate took a reserve as it let it start."""
        if isinstance(body, SpooledBody | Part):
            body.charged += self.gate.reserved
        else:  # a HEAD: no body comes
            self.gate.give_back(url, self.gate.reserved)

    def turn(self, active: dict[Any, Any]) -> None:
        """Charge what came of every body in flight (handle -> body), then hold those of a
        host in debt and let go those of a host that paid."""
        self._charge(active.values(), ended=False)
        for handle, body in active.items():
            if not isinstance(body, SpooledBody | Part):
                continue
            owed = self.gate.owed(_url_of(body))
            if handle in self.held:
                if owed <= 0.0:
                    handle.pause(pycurl.PAUSE_CONT)
                    self.held.discard(handle)
            elif owed > RESERVE_S:
                handle.pause(pycurl.PAUSE_RECV)
                self.held.add(handle)

    def hold_again(self) -> None:
        """Pause the held transfers again after their receive cap (libcurl's) was set: libcurl
        (8.23) takes a new cap on a paused transfer as leave to go on, so a share that moved
        let the bodies a debt held go at full speed (16 MiB at --limit-rate 4m in 1.9 s)."""
        for handle in self.held:
            handle.pause(pycurl.PAUSE_RECV)

    def ended(self, handle: Any, body: Any) -> None:
        """`body`'s transfer on `handle` ended: let it go if held, charge its last bytes,
        give back what it did not use of its reserve."""
        if handle in self.held:
            self.held.discard(handle)
            # A transfer that ended has no connection left to go on with: libcurl refuses
            # the call (CURLE_BAD_FUNCTION_ARGUMENT), and the handle's next transfer starts
            # unpaused anyway.
            with contextlib.suppress(pycurl.error):
                handle.pause(pycurl.PAUSE_CONT)
        self._charge((body,), ended=True)

    def _charge(self, bodies: Iterable[Any], ended: bool) -> None:
        for body in bodies:
            if not isinstance(body, SpooledBody | Part):
                continue
            url = _url_of(body)
            came = body.size if isinstance(body, SpooledBody) else body.written
            if came > body.charged:
                self.gate.flowed(url, came - body.charged)
                body.charged = came
            elif ended and came < body.charged:
                self.gate.give_back(url, body.charged - came)


def _url_of(body: SpooledBody | Part) -> str:
    return body.file.transfer[2] if isinstance(body, Part) else body.transfer[2]
