"""`bulkfetch serve --max-concurrent / --max-rps` without sockets: the shared limiters
(server/limits.py, across forked processes too), the refusals of the seed API and S3, and
when a LimitedHttpConnection takes and gives back its permit (server/http.py)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import xml.etree.ElementTree as ET
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
from click.testing import CliRunner

from bulkfetch.errors import UsageError
from bulkfetch.server import command, runner
from bulkfetch.server.app import App
from bulkfetch.server.export import export_static
from bulkfetch.server.faults import Fault, FaultConfig
from bulkfetch.server.http import (
    HttpConnection,
    LimitedHttpConnection,
    PacedHttpConnection,
    PacedLimitedHttpConnection,
)
from bulkfetch.server.limits import MAX_RPS, ConcurrencyLimit, Limits, RateLimit
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.server.s3app import S3App
from bulkfetch.util.sizes import parse_size_spec

FORK = multiprocessing.get_context("fork")
NAME = "f0000000003"


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- ConcurrencyLimit --------------------------------------------------------------------
def test_concurrency_permits_are_exact_and_come_back() -> None:
    limit = ConcurrencyLimit(3)
    assert [limit.try_acquire() for _ in range(5)] == [True, True, True, False, False]
    assert limit.in_flight == 3
    limit.release()
    assert limit.in_flight == 2
    assert limit.try_acquire() and not limit.try_acquire()
    for _ in range(3):
        limit.release()
    assert limit.in_flight == 0
    with pytest.raises(ValueError):  # a permit given back twice is a bug, not a new permit
        limit.release()
    with pytest.raises(ValueError):
        ConcurrencyLimit(0)


def _hold(limit: ConcurrencyLimit, count: int, held: Event, done: Event) -> None:
    got = sum(limit.try_acquire() for _ in range(count))
    if got == count:
        held.set()
    done.wait(10)
    for _ in range(got):
        limit.release()


def test_concurrency_is_counted_across_forked_processes() -> None:
    limit = ConcurrencyLimit(5)
    held, done = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold, args=(limit, 3, held, done))
    child.start()
    try:
        assert held.wait(10)
        assert limit.in_flight == 3
        assert [limit.try_acquire() for _ in range(3)] == [True, True, False]
    finally:
        done.set()
        child.join(10)
    assert child.exitcode == 0
    assert limit.in_flight == 2  # the child's three came back
    assert [limit.try_acquire() for _ in range(4)] == [True, True, True, False]


# -- RateLimit ---------------------------------------------------------------------------
def test_rate_accepts_n_in_any_second_then_the_window_slides() -> None:
    clock = FakeClock()
    rate = RateLimit(3, clock=clock)
    assert [rate.try_accept() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.999
    assert not rate.try_accept()
    clock.now += 0.001  # one second after the first three: all three slots free again
    assert [rate.try_accept() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5
    assert not rate.try_accept()


def test_rate_slots_free_one_by_one_as_acceptances_age() -> None:
    clock = FakeClock()
    rate = RateLimit(2, clock=clock)
    assert rate.try_accept()  # at 0.0
    clock.now += 0.4
    assert rate.try_accept()  # at 0.4
    assert not rate.try_accept()
    clock.now += 0.6  # 1.0: the one at 0.0 is a second old, the one at 0.4 is not
    assert rate.try_accept() and not rate.try_accept()
    clock.now += 0.399
    assert not rate.try_accept()
    clock.now += 0.001  # 1.4
    assert rate.try_accept() and not rate.try_accept()


@pytest.mark.parametrize("limit", [1, 7, 50])
def test_rate_is_an_exact_sliding_window(limit: int) -> None:
    """Random arrivals: no one-second window holds more than `limit` acceptances, and every
    refusal had exactly `limit` of them in the second before it (nothing refused needlessly)."""
    rng = random.Random(limit)
    clock = FakeClock(5.0)
    rate = RateLimit(limit, clock=clock)
    accepted: list[float] = []
    for _ in range(5000):
        clock.now += rng.expovariate(3 * limit)
        in_last_second = sum(1 for t in accepted if t > clock.now - 1.0)
        if rate.try_accept():
            assert in_last_second < limit
            accepted.append(clock.now)
        else:
            assert in_last_second == limit
    for i, start in enumerate(accepted):
        assert sum(1 for t in accepted[i:] if t < start + 1.0) <= limit
    assert len(accepted) > 5000 / 3 / 2  # it did accept about `limit` a second


def test_rate_refuses_nonsense() -> None:
    for bad in (0, -1, MAX_RPS + 1):
        with pytest.raises(ValueError):
            RateLimit(bad)


def _accept(rate: RateLimit, count: int, results: object) -> None:
    results.put(sum(rate.try_accept() for _ in range(count)))  # type: ignore[attr-defined]


def test_rate_is_counted_across_forked_processes() -> None:
    rate = RateLimit(10, window=3600.0)  # the real clock; nothing ages out during the test
    results = FORK.SimpleQueue()
    child = FORK.Process(target=_accept, args=(rate, 7, results))
    child.start()
    child.join(10)
    assert results.get() == 7
    assert sum(rate.try_accept() for _ in range(10)) == 3


# -- Limits ------------------------------------------------------------------------------
def test_limits_exist_only_when_asked_for() -> None:
    assert Limits.create(None, None) is None
    only_rate = Limits.create(None, 5)
    assert only_rate is not None and only_rate.concurrency is None and not only_rate.holds
    both = Limits.create(2, 5)
    assert both is not None and both.holds


def test_admit_asks_concurrency_first_and_a_throttled_request_holds_nothing() -> None:
    clock = FakeClock()
    concurrency = ConcurrencyLimit(2)
    limits = Limits(concurrency, RateLimit(3, clock=clock))
    assert limits.admit() is Fault.NONE and limits.admit() is Fault.NONE
    assert limits.admit() is Fault.OVERLOAD  # the rate is not asked: nothing counted there
    limits.release()
    assert limits.admit() is Fault.NONE  # the rate's third
    limits.release()
    assert limits.admit() is Fault.RATE
    assert concurrency.in_flight == 1  # the throttled request gave its permit back
    clock.now += 1.0
    assert limits.admit() is Fault.NONE


# -- refusals ----------------------------------------------------------------------------
def header(response: object, name: str) -> str | None:
    values = [v for k, v in response.headers if k.lower() == name]  # type: ignore[attr-defined]
    return values[0] if len(values) == 1 else None


@pytest.mark.parametrize(("fault", "status"), [(Fault.OVERLOAD, 503), (Fault.RATE, 429)])
def test_the_seed_api_refuses_with_its_plain_error(fault: Fault, status: int) -> None:
    app = build_app(ServeOptions(files=10))
    assert isinstance(app, App)
    refused = app.refuse(fault, f"/get/{NAME}")
    assert (refused.status, refused.fault, refused.delay_s) == (status, fault, 0.0)
    assert header(refused, "retry-after") == "1"
    assert header(refused, "content-type") == "application/json"
    assert "--max-" in json.loads(refused.body)["error"]


@pytest.mark.parametrize("fault", [Fault.OVERLOAD, Fault.RATE])
def test_s3_refuses_with_slowdown_503_and_the_seed_paths_as_the_seed_api(fault: Fault) -> None:
    app = build_app(ServeOptions(files=10, s3_bucket="bkt"))
    assert isinstance(app, S3App)
    for target in (f"/bkt/{NAME}", "/bkt?list-type=2", "/", "/other/x"):
        refused = app.refuse(fault, target)
        assert (refused.status, refused.fault) == (503, fault)  # S3 never answers 429
        assert header(refused, "retry-after") == "1"
        error = ET.fromstring(refused.body)
        assert error.findtext("Code") == "SlowDown"
        assert error.findtext("Resource") == target.partition("?")[0]
    for target in (f"/get/{NAME}", "/list", "/list?next-marker=x"):
        refused = app.refuse(fault, target)
        assert refused.status == (503 if fault is Fault.OVERLOAD else 429)
        assert header(refused, "content-type") == "application/json"


# -- connections -------------------------------------------------------------------------
class FakeTransport:
    def __init__(self, protocol: HttpConnection) -> None:
        self.protocol = protocol
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.data += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    abort = close

    def get_extra_info(self, name: str) -> None:
        return None

    def statuses(self) -> list[int]:
        """The status of every answer written so far (heads parsed, bodies skipped)."""
        data, found, at = bytes(self.data), [], 0
        while (end := data.find(b"\r\n\r\n", at)) >= 0:
            lines = data[at:end].decode("latin-1").split("\r\n")
            found.append(int(lines[0].split()[1]))
            length = next(int(line.split(":")[1]) for line in lines
                          if line.lower().startswith("content-length:"))
            at = end + 4 + length
        return found


def request(target: str = f"/get/{NAME}", close: bool = False) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def connect(make: Callable[[], HttpConnection]) -> tuple[HttpConnection, FakeTransport]:
    connection = make()
    transport = FakeTransport(connection)
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def limited(options: ServeOptions, limits: Limits, rate: int = 0,
            log: list[tuple[int, Fault]] | None = None) -> Callable[[], HttpConnection]:
    app = build_app(options)
    access = None if log is None else (
        lambda method, target, status, length, fault, auth, host: log.append((status, fault)))
    return runner._factory(app, access, rate, limits)


def test_a_plain_server_runs_the_plain_classes() -> None:
    app = build_app(ServeOptions(files=10))
    assert type(runner._factory(app, None, 0, None)()) is HttpConnection
    assert type(runner._factory(app, None, 1000, None)()) is PacedHttpConnection
    limits = Limits.create(1, None)
    assert type(runner._factory(app, None, 0, limits)()) is LimitedHttpConnection
    assert type(runner._factory(app, None, 1000, limits)()) is PacedLimitedHttpConnection


def test_a_delayed_answer_is_in_flight_until_it_is_written() -> None:
    async def scenario() -> None:
        limits = Limits(ConcurrencyLimit(1))
        log: list[tuple[int, Fault]] = []
        make = limited(ServeOptions(files=10, faults=FaultConfig(latency_ms=(50, 50))),
                       limits, log=log)
        first, first_wire = connect(make)
        first.data_received(request())
        assert limits.concurrency is not None and limits.concurrency.in_flight == 1
        second, second_wire = connect(make)
        second.data_received(request())  # refused at once, without waiting for the latency
        assert second_wire.statuses() == [503] and b"Retry-After: 1\r\n" in second_wire.data
        assert first_wire.statuses() == []
        await asyncio.sleep(0.15)
        assert first_wire.statuses() == [200]
        assert limits.concurrency.in_flight == 0
        second.data_received(request())  # the same keep-alive connection, admitted now
        await asyncio.sleep(0.15)
        assert second_wire.statuses() == [503, 200]
        assert log == [(200, Fault.NONE), (503, Fault.OVERLOAD), (200, Fault.NONE)]  # as handled

    asyncio.run(scenario())


def test_pipelined_requests_take_the_permit_one_after_the_other() -> None:
    async def scenario() -> None:
        limits = Limits(ConcurrencyLimit(1))
        connection, wire = connect(limited(ServeOptions(files=10), limits))
        connection.data_received(request() * 3 + request(close=True))
        assert wire.statuses() == [200, 200, 200, 200]
        await asyncio.sleep(0)
        assert wire.closed and limits.concurrency is not None
        assert limits.concurrency.in_flight == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("faults", [FaultConfig(latency_ms=(10_000, 10_000)),
                                    FaultConfig(stall_rate=1.0),
                                    FaultConfig(trickle_rate=1.0, trickle_interval=10.0)])
def test_a_client_going_away_gives_the_permit_back(faults: FaultConfig) -> None:
    async def scenario() -> None:
        limits = Limits(ConcurrencyLimit(1))
        connection, _ = connect(limited(ServeOptions(files=10, faults=faults), limits))
        connection.data_received(request())
        await asyncio.sleep(0.01)
        assert limits.concurrency is not None and limits.concurrency.in_flight == 1
        other, other_wire = connect(limited(ServeOptions(files=10), limits))
        other.data_received(request())
        assert other_wire.statuses() == [503]
        connection.connection_lost(None)
        assert limits.concurrency.in_flight == 0
        connection.connection_lost(None)  # twice: still given back only once
        other.data_received(request())
        assert other_wire.statuses() == [503, 200]
        assert limits.concurrency.in_flight == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("faults", [FaultConfig(reset_rate=1.0), FaultConfig(truncate_rate=1.0),
                                    FaultConfig(overlong_rate=1.0)])
def test_answers_that_close_the_connection_give_the_permit_back(faults: FaultConfig) -> None:
    async def scenario() -> None:
        limits = Limits(ConcurrencyLimit(1))
        connection, wire = connect(limited(ServeOptions(files=10, faults=faults), limits))
        connection.data_received(request())
        assert wire.closed
        assert limits.concurrency is not None and limits.concurrency.in_flight == 0
        await asyncio.sleep(0)  # connection_lost comes after: nothing given back twice

    asyncio.run(scenario())


def test_a_paced_body_is_in_flight_until_its_last_byte() -> None:
    async def scenario() -> None:
        limits = Limits(ConcurrencyLimit(1))
        options = ServeOptions(files=10, file_size=parse_size_spec("20000"))
        make = limited(options, limits, rate=100_000)
        connection, wire = connect(make)
        connection.data_received(request())
        assert limits.concurrency is not None and limits.concurrency.in_flight == 1
        await asyncio.sleep(0.4)  # 20,000 bytes at 100,000 bytes/s: 0.2 s
        assert wire.statuses() == [200] and len(wire.data) > 20_000
        assert limits.concurrency.in_flight == 0

    asyncio.run(scenario())


def test_the_rate_limit_over_a_connection() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        limits = Limits(rate=RateLimit(2, clock=clock))
        log: list[tuple[int, Fault]] = []
        connection, wire = connect(limited(ServeOptions(files=10), limits, log=log))
        connection.data_received(request() * 4)
        clock.now += 1.0
        connection.data_received(request())
        assert wire.statuses() == [200, 200, 429, 429, 200]
        assert log[2] == (429, Fault.RATE)
        s3, s3_wire = connect(limited(ServeOptions(files=10, s3_bucket="bkt"), limits))
        s3.data_received(request(f"/bkt/{NAME}") * 2)
        assert s3_wire.statuses() == [200, 503] and b"<Code>SlowDown</Code>" in s3_wire.data

    asyncio.run(scenario())


# -- options -----------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "flag"), [({"max_concurrent": 0}, "--max-concurrent"),
                                              ({"max_rps": 0}, "--max-rps"),
                                              ({"max_rps": MAX_RPS + 1}, "--max-rps")])
def test_options_refuse_limits_below_one(kwargs: dict[str, int], flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        ServeOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["--max-concurrent", "--max-rps"])
@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_the_command_names_the_flag_of_a_bad_value(flag: str, value: str) -> None:
    result = CliRunner().invoke(command.serve, [flag, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}'" in result.output


def test_the_command_knows_the_rate_cap() -> None:
    assert command.MAX_RPS == MAX_RPS


@pytest.mark.parametrize(("kwargs", "flag"), [({"max_concurrent": 4}, "--max-concurrent"),
                                              ({"max_rps": 4}, "--max-rps")])
def test_export_refuses_the_limits(tmp_path: Path, kwargs: dict[str, int], flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        export_static(ServeOptions(files=3, **kwargs), str(tmp_path / "x"))  # type: ignore[arg-type]
