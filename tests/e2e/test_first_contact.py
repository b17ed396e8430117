"""A new user's mistakes at first contact, as a table: each case gets exit status 2 within a
few seconds, a message in the user's terms naming what to check, no traceback, and DEST as
it was (not made, or untouched). Once the source has answered, the same failures are
retried as a server's passing trouble (test_faults*.py)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from getkit import kill_after_pages, read_journal

from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port

LIMIT_S = 5.0  # the bar: a mistake is said at once, not after the retries


LOGIN_PAGE = (b"<!doctype html><html><head><title>Sign in</title></head><body><form>"
              + b"x" * 200 + b"</form></body></html>")
ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/html/list": (200, {"Content-Type": "text/html; charset=utf-8"}, LOGIN_PAGE),
    "/empty/list": (200, {"Content-Type": "application/json"}, b""),
    "/text/list": (200, {"Content-Type": "text/plain"}, b"Service temporarily moved"),
    "/shape/list": (200, {"Content-Type": "application/json"}, b'{"items": ["a", "b"]}'),
    "/loop/list": (302, {"Location": "http://127.0.0.1:{port}/loop/list"}, b""),
}


class _Canned(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's canned answer for its path (a real HTTP server
    on 127.0.0.1: what a login page, a proxy or a misconfigured host answers)."""

    def do_GET(self) -> None:
        status, headers, body = ANSWERS.get(self.path.partition("?")[0],
                                            (404, {}, b"not found"))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value.replace("{port}", str(self.server.server_port)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def canned() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def reference() -> Iterator[ReferenceServer]:
    with ReferenceServer("--files", "200") as server:
        yield server


def closed_port() -> int:
    """A port nothing listens on (taken and let go: a refused connection)."""
    port = free_port()
    with socket.socket() as probe:  # (still free: connecting is refused)
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    return port


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    says: tuple[str, ...]  # in the message, each of these


def run_get(args: tuple[str, ...], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "bulkfetch", "get", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def assert_refused_at_once(result: subprocess.CompletedProcess[str], took: float,
                           says: tuple[str, ...]) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert took < LIMIT_S, f"{took:.1f} s to say: {out}"
    assert "Traceback" not in out, out
    flat = " ".join(out.split())
    for words in says:
        assert words in flat, f"{words!r} not in: {out}"


CASES = {
    "refused": lambda urls: Case((f"http://127.0.0.1:{closed_port()}", "d"),
                                 ("nothing accepts connections at 127.0.0.1:",
                                  "Check that the server is running")),
    "unknown-host": lambda urls: Case(("http://nonexistent.invalid", "d"),
                                      ("cannot resolve the host 'nonexistent.invalid'",
                                       "Check the URL's host name")),
    "no-scheme": lambda urls: Case(("127.0.0.1:8000", "d"),
                                   ("URL '127.0.0.1:8000' must start with http://",
                                    "did you mean http://127.0.0.1:8000?")),
    "html-listing": lambda urls: Case((f"{urls['canned']}/html", "d"),
                                      ("expected JSON, the server sent text/html",
                                       "'<!doctype html><html><head><title>Sign in",
                                       "Is the URL a listing")),
    "empty-listing": lambda urls: Case((f"{urls['canned']}/empty", "d"),
                                       ("malformed JSON", "the server sent an empty body")),
    "text-listing": lambda urls: Case((f"{urls['canned']}/text", "d"),
                                      ("malformed JSON",
                                       "text/plain: 'Service temporarily moved'")),
    "other-json": lambda urls: Case((f"{urls['canned']}/shape", "d"),
                                    ("no 'FileNames' list in the JSON", "--api or --items")),
    "redirect-loop": lambda urls: Case((f"{urls['canned']}/loop", "d"),
                                       ("redirect", "(curl error 47)")),
    "tls-on-plain-port": lambda urls: Case(
        (urls["reference"].replace("http://", "https://"), "d"),
        ("the TLS handshake with 127.0.0.1:", "give http://")),
    "dest-under-proc": lambda urls: Case((urls["reference"], "/proc/bulkfetch-dest"),
                                         ("cannot write to DEST /proc/bulkfetch-dest",)),
    "dest-through-a-file": lambda urls: Case((urls["reference"], "a-file/dest"),
                                             ("cannot write to DEST a-file/dest",
                                              "Not a directory")),
    "resume-flag": lambda urls: Case((urls["reference"], "d", "--resume"),
                                     ("there is no --resume",
                                      "rerunning the same command resumes")),
    "table-flags-on-a-listing": lambda urls: Case(
        (urls["reference"], "d", "--name-template", "{index}{ext}"),
        ("--name-template and --save-cols apply to a .csv",)),
}


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_a_mistake_at_first_contact_is_said_at_once_and_leaves_dest_as_it_was(
        case_id: str, canned: str, reference: ReferenceServer, tmp_path: Path) -> None:
    case = CASES[case_id]({"canned": canned, "reference": reference.url})
    (tmp_path / "a-file").write_text("a file where DEST's parent would be\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    result, took = run_get(case.args, tmp_path)
    assert_refused_at_once(result, took, case.says)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "DEST was made"


def test_a_resumed_dest_is_left_as_it_was_when_its_server_is_down(tmp_path: Path) -> None:
    """A rerun of a stopped run whose server no longer answers at all: exit 2 at once, and
    the journal says what it said."""
    port = free_port()
    dest = tmp_path / "d"
    with ReferenceServer("--files", "6000", "--page-size", "100", "--latency", "20",
                         "--port", str(port)) as server:
        run = subprocess.Popen([sys.executable, "-m", "bulkfetch", "get", server.url, str(dest),
                                "--quiet", "-c", "8"], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kill_after_pages(run, dest, 3)
    before = read_journal(dest, "SELECT seq, status, ok FROM pages ORDER BY seq")
    assert 3 <= len(before) < 60
    result, took = run_get((f"http://127.0.0.1:{port}", "d"), tmp_path)
    assert_refused_at_once(result, took, ("nothing accepts connections at 127.0.0.1:",))
    assert read_journal(dest, "SELECT seq, status, ok FROM pages ORDER BY seq") == before
