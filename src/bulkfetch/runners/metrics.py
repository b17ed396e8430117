"""`get --metrics HOST:PORT`: the run's numbers in Prometheus text format, served over HTTP
by prometheus-client while the run goes on, and written beside the journal as
DEST/.bulkfetch/metrics.prom (node_exporter's textfile collector reads such files; it also
keeps the last numbers after the run, when the endpoint is gone).

Nothing is counted here: a collector renders the coordinator's latest live.Snapshot at each
scrape, so the per-file path pays nothing for a scrape.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bulkfetch.errors import UsageError
from bulkfetch.models import LATENCY_BUCKETS

METRICS_FILE = "metrics.prom"
INSTALL_HINT = "pip install 'bulkfetch[metrics]' (prometheus-client)"


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) of --metrics HOST:PORT ([::1]:9100 for IPv6; port 0: any free one)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--metrics {text!r}: give HOST:PORT, e.g. 127.0.0.1:9100 "
                         "(0.0.0.0:9100 to be scraped from other machines)")
    return host, int(port)


def check_available(text: str) -> None:
    """Refuse --metrics before anything starts: prometheus-client missing, or an address
    that cannot be listened on (in use, not this machine's)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(f"--metrics needs prometheus-client: {INSTALL_HINT}") from None
    host, port = parse_address(text)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise UsageError(f"--metrics {text}: cannot listen there ({exc.strerror or exc}); "
                         "give a free port, or 0 for any") from None


class _Collector:
    """Renders a Snapshot as metric families (prometheus-client's custom collector)."""

    def __init__(self) -> None:
        self.snapshot: Any = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        shot = self.snapshot
        if shot is None:
            return
        files = CounterMetricFamily("bulkfetch_files", "Files done, by outcome (files "
                                    "done by earlier runs of this journal included).",
                                    labels=["outcome"])
        files.add_metric(["ok"], shot.files_ok)
        files.add_metric(["failed"], shot.files_failed)
        yield files
        yield CounterMetricFamily("bulkfetch_bytes", "Bytes stored.", value=shot.bytes)
        yield CounterMetricFamily("bulkfetch_retries", "Retries this run.",
                                  value=shot.retries)
        yield CounterMetricFamily("bulkfetch_hedged_requests", "Stragglers asked for again "
                                  "on another connection this run.", value=shot.hedged)
        yield CounterMetricFamily("bulkfetch_hedged_requests_won", "Hedged requests that "
                                  "answered first.", value=shot.hedges_won)
        yield CounterMetricFamily("bulkfetch_connects_redialed", "Connects dialled again "
                                  "(no answer to the connect within a few of the host's "
                                  "latencies).", value=shot.redialed)
        failures = CounterMetricFamily("bulkfetch_failures", "Files this run gave up on, "
                                       "by reason.", labels=["reason"])
        for reason, count in sorted(shot.failures_by_reason.items()):
            failures.add_metric([reason], count)
        yield failures
        in_flight = GaugeMetricFamily("bulkfetch_in_flight", "Transfers in flight, by host.",
                                      labels=["host"])
        for host, count in sorted(shot.hosts.items()):
            in_flight.add_metric([host], count)
        yield in_flight
        yield GaugeMetricFamily("bulkfetch_in_flight_all", "Transfers in flight, all hosts.",
                                value=shot.in_flight)
        yield GaugeMetricFamily("bulkfetch_concurrency_limit", "Transfers allowed in "
                                "flight now, all workers (--concurrency auto moves it).",
                                value=shot.concurrency)
        by_host = GaugeMetricFamily("bulkfetch_concurrency_limit_by_host", "Transfers "
                                    "allowed in flight now to each host in flight, all "
                                    "workers (--concurrency auto).", labels=["host"])
        for host, limit in sorted(shot.host_limits.items()):
            by_host.add_metric([host], limit)
        yield by_host
        yield GaugeMetricFamily("bulkfetch_partial_bytes", "Bytes of big bodies on their "
                                "way, not yet stored.", value=shot.partial_bytes)
        if shot.latency:
            buckets, running = [], 0
            for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), shot.latency,
                                    strict=True):
                running += count
                buckets.append((bound, running))
            yield HistogramMetricFamily("bulkfetch_request_duration_seconds",
                                        "Time of each request, start to end (any answer).",
                                        buckets=buckets, sum_value=shot.latency_sum)
        yield CounterMetricFamily("bulkfetch_pages_listed", "List pages listed.",
                                  value=shot.pages_listed)
        yield CounterMetricFamily("bulkfetch_pages_done", "List pages whose every file is "
                                  "stored or failed (journaled).", value=shot.pages_done)
        yield GaugeMetricFamily("bulkfetch_listing_done", "1 once the listing is complete.",
                                value=int(shot.listing_done))
        if shot.total_files is not None:
            yield GaugeMetricFamily("bulkfetch_files_listed", "Files the source lists "
                                    "(when known).", value=shot.total_files)
        yield GaugeMetricFamily("bulkfetch_start_time_seconds", "When this run began "
                                "(Unix time).", value=shot.started_at)
        state = GaugeMetricFamily("bulkfetch_state", "1 for the run's state.",
                                  labels=["state"])
        state.add_metric([shot.state], 1)
        yield state


class MetricsServer:
    """The endpoint: start() after the workers are forked (they must not inherit its
    socket or thread), show() each new snapshot, close() at the end."""

    def __init__(self, address: str) -> None:
        from prometheus_client import CollectorRegistry

        self.address = parse_address(address)
        self.collector = _Collector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)  # type: ignore[arg-type]
        self.httpd: Any = None
        self.url: str | None = None

    def start(self) -> None:
        from prometheus_client import start_http_server

        host, port = self.address
        try:
            started = start_http_server(port, host, self.registry)
        except OSError as exc:
            raise UsageError(f"--metrics {host}:{port}: cannot listen there "
                             f"({exc.strerror or exc})") from None
        self.httpd = started[0] if isinstance(started, tuple) else None
        if self.httpd is not None:
            port = self.httpd.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}/metrics"

    def show(self, snapshot: Any) -> None:
        self.collector.snapshot = snapshot

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def write_file(self, state_dir: Path) -> None:
        from bulkfetch.util.atomic import write_atomically

        write_atomically(state_dir / METRICS_FILE, self.text())

    def close(self) -> None:
        if self.httpd is not None:
            with contextlib.suppress(Exception):
                self.httpd.shutdown()
                self.httpd.server_close()
            self.httpd = None
