"""`get --metrics` scraped during a real run and `status --json/--watch` beside it, against
the reference server with missing files and 503s: the scrapes parse (prometheus-client's
parser), counters never go down, and the last numbers (metrics.prom) equal the report's."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


COUNTERS = ("bulkfetch_files_total", "bulkfetch_bytes_total", "bulkfetch_retries_total",
            "bulkfetch_failures_total", "bulkfetch_request_duration_seconds_count",
            "bulkfetch_pages_done_total")


def test_metrics_during_a_run_and_at_its_end(reference_server, tmp_path: Path) -> None:
    server = reference_server("--files", "6000", "--latency", "20", "--deny-rate", "0.01",
                              "--fail-rate", "0.03")
    dest, report_path = tmp_path / "d", tmp_path / "r.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "bulkfetch", "get", server.url, str(dest), "-q", "-w", "2",
         "-c", "16", "--metrics", "127.0.0.1:0", "--report", str(report_path)],
        stderr=subprocess.PIPE, text=True)
    status_file = dest / ".bulkfetch" / "status.json"
    deadline = time.monotonic() + 60
    while not status_file.exists():
        assert run.poll() is None and time.monotonic() < deadline, "no status.json"
        time.sleep(0.05)
    url = json.loads(status_file.read_text())["metrics_url"]
    watch = subprocess.Popen([sys.executable, "-m", "bulkfetch", "status", str(dest), "--watch",
                              "--json", "--interval", "0.3"], stdout=subprocess.PIPE, text=True)
    scrapes: list[dict] = []
    looked = None
    while run.poll() is None:
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:  # the run ended between poll() and the scrape
            break
        scrapes.append(_samples(text))
        if looked is None and len(scrapes) > 3:
            looked = json.loads(subprocess.run(
                [sys.executable, "-m", "bulkfetch", "status", str(dest), "--json"],
                capture_output=True, text=True, check=True, timeout=60).stdout)
        time.sleep(0.2)
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode == 1, stderr  # the denied names fail
    assert "Traceback" not in stderr and f"metrics at {url}" in stderr
    running = [s for s in scrapes if s.get(("bulkfetch_state", (("state", "running"),)))]
    assert len(running) >= 3, f"only {len(running)} scrapes while running"
    for earlier, later in itertools.pairwise(scrapes):
        for key, value in earlier.items():
            if key[0] in COUNTERS:
                assert later.get(key, 0) >= value, (key, value, later.get(key))
    assert any(s.get(("bulkfetch_in_flight", (("host", server.url),)), 0) > 0
               for s in running)
    assert any(s.get(("bulkfetch_request_duration_seconds_count", ()), 0) > 0
               for s in running)
    assert looked is not None and looked["state"] == "running"
    assert looked["live"]["pid"] == looked["pid"] == run.pid

    report = json.loads(report_path.read_text())
    final = _samples((dest / ".bulkfetch" / "metrics.prom").read_text())
    assert final[("bulkfetch_files_total", (("outcome", "ok"),))] == report["files_ok"]
    assert final[("bulkfetch_files_total", (("outcome", "failed"),))] == report["files_failed"]
    assert final[("bulkfetch_bytes_total", ())] == report["bytes"]
    assert final[("bulkfetch_retries_total", ())] == report["retries"] > 0
    by_reason = {dict(k[1])["reason"]: v for k, v in final.items()
                 if k[0] == "bulkfetch_failures_total"}
    assert sum(by_reason.values()) == report["files_failed"] > 0
    assert set(by_reason) <= {"http_400", "http_401", "http_403", "http_404", "http_410"}
    assert final[("bulkfetch_state", (("state", "finished with failures"),))] == 1
    # every request of the run is in the histogram: each file once, each retry once more
    assert final[("bulkfetch_request_duration_seconds_count", ())] == \
        report["files_ok"] + report["files_failed"] + report["retries"]

    lines = watch.communicate(timeout=60)[0].splitlines()
    assert watch.returncode == 0
    shown = [json.loads(line) for line in lines]
    assert shown[0]["state"] == "running" and shown[-1]["state"] == "finished with failures"
    assert shown[-1]["totals"]["files_ok"] == report["files_ok"]


def test_a_bad_metrics_address_is_a_usage_error(reference_server, tmp_path: Path) -> None:
    server = reference_server("--files", "10")
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", server.url,
                           str(tmp_path / "d"), "-q", "--metrics", "localhost"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--metrics 'localhost': give HOST:PORT" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_status_of_a_finished_run_has_no_live_numbers(reference_server, tmp_path: Path) -> None:
    server = reference_server("--files", "50")
    subprocess.run([sys.executable, "-m", "bulkfetch", "get", server.url, str(tmp_path / "d"),
                    "-q"], check=True, timeout=60)
    shown = json.loads(subprocess.run(
        [sys.executable, "-m", "bulkfetch", "status", str(tmp_path / "d"), "--json"],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    assert shown["state"] == "finished" and shown["live"] is None
    assert shown["totals"]["files_ok"] == 50
    text = subprocess.run([sys.executable, "-m", "bulkfetch", "status", str(tmp_path / "d"),
                           "--watch"], capture_output=True, text=True, check=True,
                          timeout=60).stdout
    assert "finished" in text and "now:" not in text
