"""live.py and metrics.py without a run: reasons as labels, snapshots from progress and
ticks, the status file, the Prometheus text (parsed back by prometheus-client's parser)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bulkfetch.config import GetOptions
from bulkfetch.dest.status_file import read_live
from bulkfetch.errors import UsageError
from bulkfetch.models import LATENCY_BUCKETS, Failure, Progress, Report, Tick
from bulkfetch.runners import live
from bulkfetch.runners.live import LiveStatus, reason_kind
from bulkfetch.runners.metrics import MetricsServer, check_available, parse_address


@pytest.mark.parametrize(("reason", "kind"), [
    ("HTTP 404", "http_404"),
    ("HTTP 503 (SlowDown)", "http_503"),
    ("Operation timed out after 30000 milliseconds (curl error 28)", "timeout"),
    ("Failed to connect (curl error 7)", "connect"),
    ("something odd (curl error 99)", "curl_99"),
    ("MD5 of the body does not match the server's ETag/Content-MD5", "md5_mismatch"),
    ("body of 10 bytes, Content-Length 20", "length_mismatch"),
    ("unsafe name: absolute path", "unsafe_name"),
    ("no space left on device", "other"),
])
def test_reason_kind(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind


def _options(tmp_path: Path) -> GetOptions:
    (tmp_path / ".bulkfetch").mkdir(exist_ok=True)
    return GetOptions("http://example.invalid", str(tmp_path))


def _latency(*counts: int) -> tuple[int, ...]:
    return counts + (0,) * (len(LATENCY_BUCKETS) + 1 - len(counts))


def test_snapshot_sums_ticks_and_counts_failures_by_reason(tmp_path: Path, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    status = LiveStatus(_options(tmp_path), "src")
    ticks = [Tick(0, limit=64, peak_limit=128, hosts=(("a:1", 3), ("b:2", 1)),
                  latency=_latency(1, 2), latency_sum=0.5,
                  host_limits=(("a:1", 40), ("b:2", 8))),
             Tick(1, limit=32, peak_limit=32, hosts=(("a:1", 2),), latency=_latency(0, 1, 4),
                  latency_sum=1.0, host_limits=(("a:1", 32),))]
    status.failed([Failure("x", "HTTP 404", 1), Failure("y", "HTTP 404", 1),
                   Failure("z", "x (curl error 28)", 9)])
    clock[0] += 1.0
    status.update(Progress(files_ok=10, bytes=1000, in_flight=6), ticks)
    shot = status.snapshot
    assert shot is not None
    assert (shot.files_ok, shot.bytes, shot.in_flight) == (10, 1000, 6)
    assert shot.hosts == {"a:1": 5, "b:2": 1}
    assert shot.host_limits == {"a:1": 72, "b:2": 8}  # each worker's own, summed
    assert shot.concurrency == 96 and shot.concurrency_peak == 160
    assert shot.latency == _latency(1, 3, 4) and shot.latency_sum == 1.5
    assert shot.failures_by_reason == {"http_404": 2, "timeout": 1}
    written = read_live(tmp_path)  # the first update writes the file
    assert written is not None and written["files_ok"] == 10 and written["state"] == "running"
    # within SNAPSHOT_S nothing is rebuilt; after it, the file waits for WRITE_S
    status.update(Progress(files_ok=20), ticks)
    assert status.snapshot.files_ok == 10
    clock[0] += live.SNAPSHOT_S
    status.update(Progress(files_ok=30, bytes=3000), ticks)
    assert status.snapshot.files_ok == 30
    assert read_live(tmp_path)["files_ok"] == 10
    clock[0] += live.WRITE_S
    status.update(Progress(files_ok=40, bytes=4000), ticks)
    assert read_live(tmp_path)["files_ok"] == 40
    # 30 files in the 1.25 s since the first look
    assert status.snapshot.files_per_s == pytest.approx(30 / 1.25, rel=0.01)


def test_finish_takes_the_reports_counters(tmp_path: Path) -> None:
    status = LiveStatus(_options(tmp_path), "src")
    status.update(Progress(files_ok=5, in_flight=3), [Tick(0, hosts=(("h", 3),))])
    report = Report("src", str(tmp_path), files_ok=7, files_failed=1, bytes=70, retries=2,
                    pages=2, listing_complete=True, concurrency_final=64,
                    concurrency_peak=256)
    final = status.finish(report, Progress(files_ok=7), [])
    assert final.state == "finished with failures"
    assert (final.files_ok, final.files_failed, final.bytes, final.retries) == (7, 1, 70, 2)
    assert final.in_flight == 0 and final.hosts == {}
    assert read_live(tmp_path)["state"] == "finished with failures"
    interrupted = Report("src", str(tmp_path), interrupted=True)
    assert status.finish(interrupted, Progress(), []).state == "interrupted"
    assert not list((tmp_path / ".bulkfetch").glob(".*.tmp"))


def test_read_live_of_a_missing_or_damaged_file(tmp_path: Path) -> None:
    assert read_live(tmp_path) is None
    (tmp_path / ".bulkfetch").mkdir()
    (tmp_path / ".bulkfetch" / "status.json").write_text("{half")
    assert read_live(tmp_path) is None
    (tmp_path / ".bulkfetch" / "status.json").write_text("[1, 2]")
    assert read_live(tmp_path) is None


def test_a_status_file_that_cannot_be_written_is_said_once(tmp_path: Path, capfd) -> None:
    status = LiveStatus(GetOptions("http://x.invalid", str(tmp_path / "missing")), "src")
    status.finish(Report("src", "d"), Progress(), [])
    status.finish(Report("src", "d"), Progress(), [])
    assert capfd.readouterr().err.count("cannot write") == 1


@pytest.mark.parametrize("text", ["9100", "host:", ":9100", "host:port", "h:70000"])
def test_a_bad_metrics_address_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="HOST:PORT"):
        parse_address(text)


def test_metrics_addresses() -> None:
    assert parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_address("[::1]:0") == ("::1", 0)


def test_a_port_in_use_is_refused_before_the_run(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}: cannot listen"):
            check_available(f"127.0.0.1:{port}")


def _families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_metrics_text_parses_back(tmp_path: Path) -> None:
    server = MetricsServer("127.0.0.1:0")
    status = LiveStatus(_options(tmp_path), "src", server)
    status.failed([Failure("x", "HTTP 410", 1)])
    status.update(Progress(files_ok=9, files_failed=1, bytes=900, retries=4, in_flight=2,
                           pages_listed=3, pages_done=1, total_files=30),
                  [Tick(0, limit=64, hosts=(("h:1", 2),), latency=_latency(5, 0, 3, 2),
                        latency_sum=0.25, host_limits=(("h:1", 48),))])
    families = _families(server.text())
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in families.values() for s in family.samples}
    assert samples[("bulkfetch_files_total", (("outcome", "ok"),))] == 9
    assert samples[("bulkfetch_files_total", (("outcome", "failed"),))] == 1
    assert samples[("bulkfetch_bytes_total", ())] == 900
    assert samples[("bulkfetch_retries_total", ())] == 4
    assert samples[("bulkfetch_failures_total", (("reason", "http_410"),))] == 1
    assert samples[("bulkfetch_in_flight", (("host", "h:1"),))] == 2
    assert samples[("bulkfetch_concurrency_limit", ())] == 64
    assert samples[("bulkfetch_concurrency_limit_by_host", (("host", "h:1"),))] == 48
    assert samples[("bulkfetch_pages_listed_total", ())] == 3
    assert samples[("bulkfetch_files_listed", ())] == 30
    # cumulative buckets, +Inf equal to the count
    bucket = "bulkfetch_request_duration_seconds_bucket"
    assert samples[(bucket, (("le", "0.005"),))] == 5
    assert samples[(bucket, (("le", "0.025"),))] == 8
    assert samples[(bucket, (("le", "0.05"),))] == 10
    assert samples[(bucket, (("le", "+Inf"),))] == 10
    assert samples[("bulkfetch_request_duration_seconds_count", ())] == 10
    assert samples[("bulkfetch_request_duration_seconds_sum", ())] == 0.25
    server.write_file(tmp_path / ".bulkfetch")
    assert _families((tmp_path / ".bulkfetch" / "metrics.prom").read_text()).keys() \
        == families.keys()


def test_the_endpoint_serves_the_latest_snapshot(tmp_path: Path) -> None:
    import urllib.request

    server = MetricsServer("127.0.0.1:0")
    server.start()
    try:
        assert server.url is not None and server.url.endswith("/metrics")
        status = LiveStatus(_options(tmp_path), "src", server)
        status.update(Progress(files_ok=3), [])
        first = urllib.request.urlopen(server.url, timeout=10).read().decode()
        assert 'bulkfetch_files_total{outcome="ok"} 3.0' in first
        status.finish(Report("src", "d", files_ok=5, listing_complete=True), Progress(), [])
        last = urllib.request.urlopen(server.url, timeout=10).read().decode()
        assert 'bulkfetch_files_total{outcome="ok"} 5.0' in last
        assert 'bulkfetch_state{state="finished"} 1.0' in last
        assert json.loads((tmp_path / ".bulkfetch" / "status.json").read_text())[
            "metrics_url"] == server.url
    finally:
        server.close()
