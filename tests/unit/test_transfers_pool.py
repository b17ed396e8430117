"""engine/transfers.py on its own, beyond retries (test_transfers_retry.py): the pool of
handles grows and shrinks by idle handles only; each transfer's headers come from the
source's signer by its URL; a worker's shares of --limit-rate and --max-rps reach its gate
and its handles; what the source vouches for of a file; the redirects the engine follows
itself; retries coming due in order; everything closed at the end."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pycurl
import pytest

from bulkfetch.api import build_options
from bulkfetch.engine.pages import Pages, PageState
from bulkfetch.engine.transfers import Transfers
from bulkfetch.models import Page
from bulkfetch.net.redirects import MAX_HOPS
from bulkfetch.sources.abilities import LISTING, Abilities, Pinned

URL = "http://a.example/files/x.bin"


def make(tmp_path: Path, abilities: Abilities | None = None, **options: object) -> Transfers:
    return Transfers(build_options("http://a.example/", tmp_path / "dest", **options),
                     abilities or Abilities(), Pages(object()))  # type: ignore[arg-type]


def state(listed: dict[str, tuple[int, str]] | None = None) -> PageState:
    return PageState(Page(1, None, ("x.bin",)), 1, write=lambda *_: None, listed=listed)


def is_closed(handle: pycurl.Curl) -> bool:
    try:
        handle.setopt(pycurl.VERBOSE, 0)
    except pycurl.error:
        return True
    return False


def test_the_pool_grows_and_sheds_idle_handles_only(tmp_path: Path) -> None:
    transfers = make(tmp_path)
    transfers.resize(4)
    assert len(transfers.handles) == 4 and transfers.free == transfers.handles
    busy = [transfers.free.pop(), transfers.free.pop()]
    idle = list(transfers.free)
    transfers.resize(4)  # no change
    assert len(transfers.handles) == 4
    transfers.resize(1)  # two busy stay in flight: only the two idle go
    assert transfers.handles == [h for h in transfers.handles if h in busy] and \
        len(transfers.handles) == 2 and transfers.free == []
    assert transfers.in_flight == 2
    assert all(is_closed(h) and h not in transfers.buffers for h in idle)
    assert not any(is_closed(h) for h in busy)
    transfers.resize(1)  # none idle: nothing to shed yet
    assert len(transfers.handles) == 2
    transfers.free.extend(busy)  # both ended
    transfers.resize(1)
    assert len(transfers.handles) == 1 and transfers.in_flight == 0
    transfers.resize(3)
    assert len(transfers.handles) == 3 and len(transfers.free) == 3
    handles = list(transfers.handles)
    transfers.close()
    assert all(is_closed(h) for h in handles)


def test_each_transfer_is_signed_for_its_own_url(tmp_path: Path) -> None:
    def sign(url: str) -> list[str]:
        return [f"X-Signed: {url}"]

    transfers = make(tmp_path, Abilities(request_headers=sign))
    assert transfers.request_headers is not None
    assert transfers.request_headers((state(), "x.bin", URL, 1)) == [f"X-Signed: {URL}"]
    assert make(tmp_path).request_headers is None  # the handles' own headers stay


def test_signing_from_a_later_point_keeps_a_caches_own_headers(tmp_path: Path) -> None:
    def sign(url: str) -> list[str]:
        return [f"Authorization: for {url}"]

    transfers = make(tmp_path)
    transfers.resize(1)
    transfers.sign_with(sign, [(pycurl.FOLLOWLOCATION, 0)])
    assert transfers.request_headers is not None
    assert transfers.request_headers((state(), "x.bin", URL, 1)) == [f"Authorization: for {URL}"]
    assert (pycurl.FOLLOWLOCATION, 0) in transfers.source_options  # for handles to come

    def page_headers(transfer: tuple[object, ...]) -> list[str]:
        return ["If-None-Match: x"]

    cached = make(tmp_path)
    cached.request_headers = page_headers  # a cache's pages: they ask the signer themselves
    cached.sign_with(sign)
    assert cached.request_headers is page_headers and cached.sign is sign


def test_a_workers_share_of_the_rates_reaches_its_gate_and_handles(tmp_path: Path) -> None:
    transfers = make(tmp_path, workers=2, max_rps=100, limit_rate=1_000_000)
    gate = transfers.gate
    assert gate is not None and gate.max_rps == 50 and gate.byte_rate == 500_000
    assert transfers.handle_rate == 500_000
    assert transfers.share_rates(0.25, 0.1) is True
    assert gate.max_rps == pytest.approx(10) and gate.byte_rate == pytest.approx(250_000)
    assert transfers.handle_rate == 250_000
    assert transfers.share_rates(0.25, 0.1) is False  # the same shares: nothing moved
    assert transfers.share_rates(0.251, 0.1) is False  # under 1% of the rate: not worth it
    assert gate.byte_rate == pytest.approx(250_000)
    transfers.cap_rate(0.4)
    assert transfers.handle_rate == 1  # never 0, which libcurl reads as no cap at all
    assert make(tmp_path).share_rates(0.5, 0.5) is False  # no rate asked for: no gate


def test_what_the_source_vouches_for_a_file(tmp_path: Path) -> None:
    md5, sha = "ab" * 16, "cd" * 32
    transfers = make(tmp_path)
    assert transfers.pin_of((state(), "x.bin", URL, 1)) is None  # nothing listed
    assert transfers.pin_of((state({"x.bin": (-1, md5)}), "x.bin", URL, 1)) is None
    assert transfers.pin_of((state({"y.bin": (5, md5)}), "x.bin", URL, 1)) is None
    assert transfers.pin_of((state({"x.bin": (0, "")}), "x.bin", URL, 1)) == \
        Pinned(0, "", b"", LISTING)  # an empty file is a size too
    assert transfers.pin_of((state({"x.bin": (5, md5)}), "x.bin", URL, 1)) == \
        Pinned(5, "md5", bytes.fromhex(md5), LISTING)
    assert transfers.pin_of((state({"x.bin": (5, "sha256:" + sha)}), "x.bin", URL, 1)) == \
        Pinned(5, "sha256", bytes.fromhex(sha), LISTING)
    unverified = make(tmp_path, verify=False)
    assert unverified.pin_of((state({"x.bin": (5, md5)}), "x.bin", URL, 1)) == \
        Pinned(5, "", b"", LISTING)  # the size still holds
    own = Pinned(9, "sha256", b"\0" * 32, "the manifest")
    pinned = make(tmp_path, Abilities(pinned=lambda name: own if name == "x.bin" else None))
    assert pinned.pin_of((state({"x.bin": (5, md5)}), "x.bin", URL, 1)) is own
    assert pinned.pin_of((state({"y.bin": (5, md5)}), "y.bin", URL, 1)) == \
        Pinned(5, "md5", bytes.fromhex(md5), LISTING)  # not its own: the listing's


def test_redirects_followed_by_the_engine_are_counted_and_bounded(tmp_path: Path) -> None:
    transfers = make(tmp_path)
    page = state()
    url = URL
    for hop in range(1, MAX_HOPS + 1):
        target, why = transfers.hop(page, "x.bin", url, f"/hop{hop}")
        assert target == f"http://a.example/hop{hop}" and why == ""
        assert page.hops == {"x.bin": (URL, hop)}  # the listed URL, kept for a retry
        url = target
    target, why = transfers.hop(page, "x.bin", url, "/one-more")
    assert target is None and str(MAX_HOPS) in why
    target, why = make(tmp_path).hop(state(), "x.bin", URL, "ftp://a.example/x")
    assert target is None and why


def test_retries_come_due_in_order_and_not_before(tmp_path: Path) -> None:
    transfers = make(tmp_path)
    assert transfers.due() == [] and transfers.next_due() == 0.0
    now = time.monotonic()
    page = state()
    for due, name in ((now - 2, "a"), (now + 60, "later"), (now - 1, "b")):
        transfers.waiting.append((due, len(transfers.waiting), (page, name, URL, 2), False))
    transfers.waiting.sort()
    assert [transfer[1] for transfer, _ in transfers.due()] == ["a", "b"]
    assert [entry[2][1] for entry in transfers.waiting] == ["later"]
    assert 59 < transfers.next_due() <= 60


def test_what_a_new_worker_starts_with(tmp_path: Path) -> None:
    rng = random.Random(5)
    bare = Transfers(build_options("http://a.example/", tmp_path / "d"), Abilities(),
                     Pages(object()), rng=rng)  # type: ignore[arg-type]
    assert bare.rng is rng and bare.gate is None and bare.handle_rate == 0
    assert bare.checked == [0, 0, 0] and bare.retries == 0 and bare.waiting == []
    assert bare.base_headers == [] and bare.urls_in_flight() == []
    headed = make(tmp_path, Abilities(curl_options=((pycurl.USERAGENT, "probe"),
                                                    (pycurl.HTTPHEADER, ["X-A: 1"]))))
    assert headed.base_headers == ["X-A: 1"]  # a piece of a big file adds its Range to them
    slowest = make(tmp_path, workers=2, limit_rate=1)
    assert slowest.gate is not None and slowest.handle_rate == 1  # never 0: no cap at all


def test_the_urls_in_flight_are_the_busy_handles(tmp_path: Path) -> None:
    transfers = make(tmp_path)
    transfers.resize(3)
    page = state()
    for handle, url in zip(transfers.handles, ("http://a/1", "http://a/2", "http://a/3"),
                           strict=True):
        transfers.transfer_of[handle] = (page, "x.bin", url, 1)
    transfers.free.remove(transfers.handles[1])  # busy
    assert transfers.urls_in_flight() == ["http://a/2"]


def test_the_smallest_rates_still_reach_the_gate(tmp_path: Path) -> None:
    requests = make(tmp_path, workers=2, max_rps=1)  # 0.5 a second each
    assert requests.share_rates(1.0, 1.0) is False  # no byte rate to move
    assert requests.gate is not None and requests.gate.max_rps == pytest.approx(1.0)
    tiny = make(tmp_path, workers=2, limit_rate=2)  # a byte a second each
    assert tiny.share_rates(1.0, 1.0) is True
    assert tiny.gate is not None and tiny.gate.byte_rate == pytest.approx(2.0)


def test_a_retry_after_makes_a_gate_where_no_limit_did(tmp_path: Path) -> None:
    transfers = make(tmp_path)
    assert transfers.gate is None
    transfers.retry_later((state(), "x.bin", URL, 2), 1, 3.0, big=False)
    assert transfers.gate is not None and transfers.gate.paused_until["http://a.example"] > 0


def test_a_failure_gives_back_a_slot_only_for_a_small_transfer_that_started(
        tmp_path: Path) -> None:
    transfers = make(tmp_path, max_rps=100)
    ended: list[str] = []
    assert transfers.gate is not None
    transfers.gate.ended = lambda url, sent=True: ended.append(url)  # type: ignore[method-assign]
    pages = transfers.pages
    pages.failed = lambda *args: None  # type: ignore[method-assign]
    transfers.fail(state(), "x.bin", "HTTP 404", 1, URL, in_gate=False)  # a big body's
    transfers.fail(state(), "x.bin", "refused", 0, URL)  # never started
    transfers.fail(state(), "x.bin", "unsafe name", 1, "")  # never had a URL
    assert ended == []
    transfers.fail(state(), "x.bin", "HTTP 404", 1, URL)
    assert ended == [URL]


class _Served(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Served.seen.append(self.headers.get("User-Agent", ""))
        body = b"z" * 100_000
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Probe", "yes")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Served)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/x"
    finally:
        server.shutdown()
        server.server_close()


def test_a_handle_keeps_body_and_headers_and_the_sources_options(
        tmp_path: Path, served: str) -> None:
    transfers = make(tmp_path, Abilities(curl_options=((pycurl.USERAGENT, "source/1"),)))
    transfers.resize(1)
    handle = transfers.handles[0]
    handle.setopt(pycurl.URL, served)
    handle.perform()
    chunks, lines = transfers.buffers[handle]
    assert b"".join(chunks) == b"z" * 100_000 and b"X-Probe: yes\r\n" in lines
    transfers.sign_with(lambda url: [], [(pycurl.USERAGENT, "signed/2")])
    handle.perform()  # a handle made before sign_with takes its options too
    transfers.resize(2)  # and one made after
    later = transfers.handles[1]
    later.setopt(pycurl.URL, served)
    later.perform()
    assert _Served.seen[-3:] == ["source/1", "signed/2", "signed/2"]
    small = make(tmp_path, spool_above=1000)  # a larger body goes to a spool, not memory
    small.resize(1)
    small.handles[0].setopt(pycurl.URL, served)
    with pytest.raises(pycurl.error) as refused:
        small.handles[0].perform()
    assert refused.value.args[0] == pycurl.E_FILESIZE_EXCEEDED
    transfers.close()
    with pytest.raises(pycurl.error):
        transfers.multi.setopt(pycurl.M_MAXCONNECTS, 1)  # closed with the handles


def test_limit_rate_caps_each_handle_made_and_each_handle_held(
        tmp_path: Path, served: str) -> None:
    """A lower bound only: a capped body cannot arrive faster than its cap (100,000 bytes at
    200,000 bytes/s: half a second; on loopback uncapped, a few milliseconds)."""

    def seconds(handle: pycurl.Curl) -> float:
        handle.setopt(pycurl.URL, served)
        handle.perform()
        return float(handle.getinfo(pycurl.TOTAL_TIME))

    capped = make(tmp_path, limit_rate=200_000)  # one worker: the whole rate
    capped.resize(1)
    assert seconds(capped.handles[0]) > 0.25
    moved = make(tmp_path, limit_rate=10_000_000)
    moved.resize(1)
    assert seconds(moved.handles[0]) < 0.25
    moved.cap_rate(200_000)  # the worker's share fell: the handle it holds follows
    assert seconds(moved.handles[0]) > 0.25
