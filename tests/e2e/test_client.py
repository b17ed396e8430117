"""bulkfetch.Client against the reference server (issue 24): every body byte-exact through
faults, in arrival order and in the order given, failures raised or returned with their
reason, calls from several threads and from asyncio sharing one loop, a body above the
in-memory limit, and a consumer that stops early."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from pathlib import Path

import pytest
from getkit import dataset

from bulkfetch import Client, FetchError

FILES = 3000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--files", str(FILES), "--fail-rate", "0.03", "--reset-rate",
                         "0.01", "--deny-rate", "0.01", "--latency", "0-5") as started:
        yield started


def expected() -> dict[str, str]:
    ds = dataset(FILES)
    return {ds.name(i): hashlib.md5(ds.body(i)).hexdigest() for i in range(FILES)}


def urls_of(server, names) -> list[str]:  # type: ignore[no-untyped-def]
    return [f"{server.url}/get/{name}" for name in names]


def test_get_many_returns_every_body_or_its_failure(server) -> None:  # type: ignore[no-untyped-def]
    want = expected()
    urls = urls_of(server, want)
    with Client(retries=8) as client:
        got = list(client.get_many(urls, errors="return"))
    assert sorted(url for url, _ in got) == sorted(urls)  # each URL once
    failed = {url: result for url, result in got if isinstance(result, FetchError)}
    for url, body in got:
        if url not in failed:
            assert hashlib.md5(body).hexdigest() == want[url.rsplit("/", 1)[1]]  # type: ignore[arg-type]
    # --deny-rate 0.01: those names fail every attempt, with the status as the reason
    assert 0 < len(failed) < FILES * 0.03
    assert all("HTTP 4" in error.reason and error.url == url for url, error in failed.items())


def test_ordered_yields_in_the_order_given(server) -> None:  # type: ignore[no-untyped-def]
    names = list(expected())[:500][::-1]
    urls = urls_of(server, names)
    with Client(window=64) as client:  # a window smaller than the call: sent as taken
        got = [url for url, _ in client.get_many(urls, ordered=True, errors="return")]
    assert got == urls


def test_a_failure_raises_by_default(server) -> None:  # type: ignore[no-untyped-def]
    with Client() as client:
        with pytest.raises(FetchError) as caught:
            client.get(f"{server.url}/get/no-such-file")
        assert "HTTP 404" in str(caught.value)
        name = next(iter(expected()))
        assert hashlib.md5(client.get(f"{server.url}/get/{name}")).hexdigest() == \
            expected()[name]


def test_a_failure_after_retries_says_how_many_attempts_it_took() -> None:
    with socket.socket() as probe:  # a port nobody listens on: refused at once, every time
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Client(retries=2) as client, pytest.raises(FetchError) as caught:
        client.get(f"http://127.0.0.1:{port}/x")
    assert caught.value.attempts == 3
    assert str(caught.value).endswith("(3 attempts)"), str(caught.value)


def test_calls_from_threads_and_asyncio_share_one_client(server) -> None:  # type: ignore[no-untyped-def]
    want = expected()
    names = list(want)
    results: dict[int, dict[str, bytes]] = {}

    def take(number: int) -> None:
        part = names[number::4]
        results[number] = {url: body for url, body in client.get_many(
            urls_of(server, part), errors="return") if isinstance(body, bytes)}

    async def from_asyncio() -> dict[str, bytes]:
        return {url: body async for url, body in client.aget_many(
            urls_of(server, names[3::4]), errors="return") if isinstance(body, bytes)}

    with Client() as client:
        threads = [threading.Thread(target=take, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        results[3] = asyncio.run(from_asyncio())
        for thread in threads:
            thread.join(timeout=120)
    total = 0
    for got in results.values():
        for url, body in got.items():
            assert hashlib.md5(body).hexdigest() == want[url.rsplit("/", 1)[1]]
        total += len(got)
    assert total > FILES * 0.97


def test_a_consumer_that_stops_early_leaves_the_client_usable(server) -> None:  # type: ignore[no-untyped-def]
    names = list(expected())
    with Client(window=32) as client:
        for count, _ in enumerate(client.get_many(urls_of(server, names), errors="return")):
            if count == 10:
                break
        name = names[-1]
        assert hashlib.md5(client.get(f"{server.url}/get/{name}")).hexdigest() == \
            expected()[name]


def test_a_body_above_the_memory_limit(reference_server, tmp_path: Path) -> None:
    big = reference_server("--files", "2", "--file-size", "3m")
    ds = dataset(2)
    with Client(spool_above=1 << 20) as client:
        body = client.get(f"{big.url}/get/{ds.name(1)}")
    assert len(body) == 3 << 20
    from bulkfetch.server.dataset import SyntheticDataSet
    from bulkfetch.util.sizes import parse_size_spec

    big_ds = SyntheticDataSet(2, 1000, 0, parse_size_spec("3m"), False)
    assert hashlib.md5(body).hexdigest() == hashlib.md5(big_ds.body(1)).hexdigest()


def test_bad_arguments_are_clear(server) -> None:  # type: ignore[no-untyped-def]
    with Client() as client:
        with pytest.raises(ValueError, match="errors must be"):
            list(client.get_many([], errors="ignore"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="URLs must be str"):
            list(client.get_many([b"http://x/"]))  # type: ignore[list-item]
    with pytest.raises(Exception, match="closed"):
        list(client.get_many([f"{server.url}/get/x"]))


def test_the_memory_cache_answers_without_a_request_until_the_ttl(reference_server) -> None:  # type: ignore[no-untyped-def]
    quiet = reference_server("--files", "200", access_log=True)
    names = [dataset(200).name(i) for i in range(200)]
    urls = urls_of(quiet, names)

    def asked() -> int:
        return sum(1 for r in quiet.requests() if r.target.startswith("/get/"))

    with Client(cache_bytes=1 << 20, cache_ttl=1.5) as client:
        first = dict(client.get_many(urls[:100]))
        assert asked() == 100
        # half kept, half new, in the order given: only the new half is asked for
        again = [url for url, _ in client.get_many(urls[50:150], ordered=True)]
        assert again == urls[50:150] and asked() == 150
        assert dict(client.get_many(urls[:100])) == first and asked() == 150
        assert client.cache is not None and client.cache.hits == 150
        time.sleep(1.6)  # past the time to live: asked again
        assert dict(client.get_many(urls[:10])) == {url: first[url] for url in urls[:10]}
        assert asked() == 160
        # one URL many times in one call: one request, every position answered
        repeated = [urls[199]] * 50 + [urls[198]] * 50
        got = [body for _, body in client.get_many(repeated, ordered=True)]
        assert asked() == 162 and len(got) == 100 and got[0] != got[99]
        assert client.requested == 162


def test_close_answers_a_call_waiting_in_another_thread(reference_server) -> None:  # type: ignore[no-untyped-def]
    slow = reference_server("--files", "50", "--latency", "2000")
    urls = urls_of(slow, [dataset(50).name(i) for i in range(50)])
    outcome: list[object] = []
    client = Client()

    def take() -> None:
        try:
            outcome.append(list(client.get_many(urls, errors="return")))
        except Exception as exc:  # what the call ends with is the point
            outcome.append(exc)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    time.sleep(0.3)  # the call is waiting on answers 2 s away
    client.close()
    thread.join(timeout=30)
    assert not thread.is_alive(), "a call waited for ever on a closed Client"
    got = outcome[0]
    assert isinstance(got, list) and len(got) == 50
    assert all(isinstance(result, FetchError) and "closed" in result.reason
               for _, result in got)
