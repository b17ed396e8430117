"""engine/transfers.py on its own: what becomes of a transfer that stored nothing (issue 50's
survivors). Another attempt starts from the listed URL when a redirect led elsewhere (and
other items' redirects are left alone); a retried or failed small transfer gives its host's
slot back; a Retry-After pauses the whole host; a failure is recorded for its page and
skipped in the sink (an ordered tar run waits for that); a certificate refused after a
redirect names the redirect's target."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pycurl
import pytest

from bulkfetch.api import build_options
from bulkfetch.engine.fetcher import Fetcher
from bulkfetch.engine.hosts import HostGate
from bulkfetch.engine.pages import Pages, PageState
from bulkfetch.engine.transfers import Transfers
from bulkfetch.models import Failure, Page, PageReport
from bulkfetch.sources.abilities import Abilities

LISTED = "http://a.example/files/x.bin"
TARGET = "http://b.example/elsewhere/x.bin"


class SkippingSink:
    """The sink as Pages sees it: which names were skipped (tar keeps its order by them)."""

    def __init__(self) -> None:
        self.skipped: list[tuple[int, str]] = []

        self.ended: list[PageReport] = []

    def skip(self, seq: int, name: str) -> None:
        self.skipped.append((seq, name))

    def end_page(self, report: PageReport) -> list[PageReport]:
        self.ended.append(report)
        return [report]


class CountingGate(HostGate):
    def __init__(self) -> None:
        super().__init__()
        self.ended_urls: list[str] = []

    def ended(self, url: str, sent: bool = True) -> None:
        self.ended_urls.append(url)
        super().ended(url, sent)


@pytest.fixture
def transfers(tmp_path: Path) -> Transfers:
    options = build_options("http://a.example/", tmp_path / "dest", retries=2)
    made = Transfers(options, Abilities(), Pages(SkippingSink()),  # type: ignore[arg-type]
                     rng=random.Random(0))
    made.gate = CountingGate()
    return made


def _state(*names: str) -> PageState:
    return PageState(Page(7, None, names), len(names), write=lambda *_: None)


def test_a_retry_after_a_redirect_starts_from_the_listed_url(transfers: Transfers) -> None:
    state = _state("x.bin", "y.bin", "z.bin")
    state.hops = {"x.bin": (LISTED, 2), "y.bin": ("http://a.example/files/y.bin", 1)}
    transfers.retry_or_fail((state, "x.bin", TARGET, 1), "HTTP 500", True, None)
    # z.bin was never redirected, while others were: its retry goes where it went
    transfers.retry_or_fail((state, "z.bin", "http://a.example/files/z.bin", 1), "HTTP 500",
                            True, None)
    queued = sorted(entry[2] for entry in transfers.waiting)
    assert queued == sorted([(state, "x.bin", LISTED, 2),
                             (state, "z.bin", "http://a.example/files/z.bin", 2)])
    assert state.hops == {"y.bin": ("http://a.example/files/y.bin", 1)}  # others kept
    assert transfers.retries == 2 and not state.failures


def test_a_retried_small_transfer_gives_its_hosts_slot_back(transfers: Transfers) -> None:
    gate = transfers.gate
    assert isinstance(gate, CountingGate)
    state = _state("x.bin", "big.bin")
    transfers.retry_or_fail((state, "x.bin", LISTED, 1), "HTTP 503", True, None)
    assert gate.ended_urls == [LISTED]
    # a big body's transfer is charged as its bytes come: nothing to give back here
    transfers.retry_or_fail((state, "big.bin", LISTED, 1), "HTTP 503", True, None, big=True)
    assert gate.ended_urls == [LISTED]


def test_a_retry_after_pauses_the_whole_host(transfers: Transfers) -> None:
    state = _state("x.bin")
    transfers.retry_or_fail((state, "x.bin", LISTED, 1), "HTTP 429", True, 5.0)
    gate = transfers.gate
    assert gate is not None and gate.paused_until["http://a.example"] > 0
    _, _, transfer, big = transfers.waiting[0]
    assert transfer == (state, "x.bin", LISTED, 2) and not big
    assert 4.0 < transfers.next_due() <= 5.0


def test_a_last_attempt_fails_the_file_skips_it_and_frees_the_slot(
        transfers: Transfers) -> None:
    gate = transfers.gate
    assert isinstance(gate, CountingGate)
    state = _state("x.bin", "y.bin", "w.bin")
    transfers.retry_or_fail((state, "w.bin", LISTED, 2), "HTTP 500", True, None)  # the last
    assert [entry[2] for entry in transfers.waiting] == [(state, "w.bin", LISTED, 3)]
    transfers.waiting.clear()
    state.remaining -= 1  # (as if w.bin's last attempt were stored)
    transfers.retry_or_fail((state, "x.bin", LISTED, 3), "HTTP 500", True, None)  # 2 retries
    transfers.retry_or_fail((state, "y.bin", LISTED, 1), "HTTP 404", False, None)
    assert state.failures == [Failure("x.bin", "HTTP 500", 3, LISTED),
                              Failure("y.bin", "HTTP 404", 1, LISTED)]
    assert transfers.pages.sink.skipped == [(7, "x.bin"), (7, "y.bin")]  # type: ignore[attr-defined]
    assert state.remaining == 0 and not transfers.waiting
    assert [report.failures for report in transfers.pages.sink.ended] == [  # type: ignore[attr-defined]
        tuple(state.failures)]  # the page ended with both failures
    assert gate.ended_urls == [LISTED, LISTED, LISTED]


def test_a_refused_certificate_names_the_redirects_target() -> None:
    class Redirected:
        def getinfo(self, option: int) -> str:
            assert option == pycurl.EFFECTIVE_URL
            return "https://cdn.example/x.bin"

    handle = Redirected()
    fetcher = SimpleNamespace(transfer_of={handle: (None, "x.bin", "https://a.example/x.bin", 1)},
                              options=SimpleNamespace(tls=None))
    error = Fetcher._tls_fatal(fetcher, handle, 60, "SSL certificate problem")  # type: ignore[arg-type]
    assert "cdn.example" in str(error) and "a.example" not in str(error)
