"""`bulkfetch get` over real listing shapes (issue 25): the real CLI against apikit's two
loopback servers, a listing host that needs a bearer token and an API key, and a blob host
its file GETs redirect to. Every file right; the listing's sizes and digests checked; no
credential at the blob host; no credential in any output; 401 is exit 2 at once; kill -9
and a rerun resumes without listing done pages again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apikit import API_KEY, TOKEN, ApiServer
from getkit import STATE, assert_complete, kill_after_pages, read_journal

CREDENTIALS = "401 — the listing needs credentials (see --header/--bearer-env)"


@pytest.fixture
def header_file(tmp_path: Path) -> Path:
    path = tmp_path / "headers.txt"
    path.write_text(f"# the API key\nX-Api-Key: {API_KEY}\n\n")
    return path


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as made:
        yield made


def environment() -> dict[str, str]:
    return {**os.environ, "API_TOKEN": TOKEN}


def run(url: str, dest: Path, *extra: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", url, str(dest),
                           "--workers", "2", "--plain", *extra],
                          capture_output=True, text=True, timeout=timeout,
                          env=env or environment())
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def auth_flags(header_file: Path) -> tuple[str, ...]:
    return ("--bearer-env", "API_TOKEN", "--header-file", str(header_file))


def assert_no_secret_anywhere(dest: Path, *texts: str) -> None:
    """Neither the token nor the key in these texts, nor in any file under DEST's state, the
    report beside it, or status.json."""
    for secret in (TOKEN, API_KEY):
        for text in texts:
            assert secret not in text
        for path in (dest / STATE).rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
        for path in dest.parent.glob("*.json"):
            assert secret not in path.read_text(), path


def assert_blob_host_saw_no_credentials(server: ApiServer) -> None:
    seen = server.requests("blob")
    assert seen, "no file GET was redirected to the blob host: nothing checked"
    for request in seen:
        lowered = {name.lower() for name in request.headers}
        assert "authorization" not in lowered and "x-api-key" not in lowered, request


def test_drf_listing_with_a_bearer_token_fetches_every_file_and_leaks_no_credential(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    dest, report = tmp_path / "dest", tmp_path / "report.json"
    # no trailing slash: the listing's own 301 is followed, with the headers (same host)
    proc = run(f"{server.api_url}/api/files", dest, "--api", "drf", *auth_flags(header_file),
               "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, server.expected())
    assert_blob_host_saw_no_credentials(server)
    assert_no_secret_anywhere(dest, proc.stdout, proc.stderr, report.read_text())
    data = json.loads(report.read_text())
    assert data["options"]["auth"]["headers"] == ["X-Api-Key", "Authorization"]
    # every body was checked against the listing's MD5
    pages = len(server.requests("api", "/api/files/"))
    assert pages == -(-server.files // server.page_size)


def test_bodies_streamed_to_disk_follow_redirects_with_the_right_headers_too(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    # --spool-above 0: every body streams to a spool (engine/big.py), redirects included
    dest = tmp_path / "dest"
    proc = run(f"{server.api_url}/api/files/", dest, "--api", "drf", *auth_flags(header_file),
               "--spool-above", "0")
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, server.expected())
    assert_blob_host_saw_no_credentials(server)


def test_link_pagination_with_sha256_digests_and_some_redirected_files(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc = run(f"{server.api_url}/files", dest, "--api", "github-releases",
               *auth_flags(header_file))
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, server.expected())
    assert_blob_host_saw_no_credentials(server)
    direct = [r for r in server.requests("api", "/raw/")]
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in direct), \
        "a file on the listing's host gets the headers"
    assert_no_secret_anywhere(dest, proc.stdout, proc.stderr)


def test_streamed_bodies_a_pinned_sha256_checked_are_indexed_with_their_md5_in_tar(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    # The listing's SHA-256 is the check, so the stream takes no MD5 for itself; the tar
    # index needs one per member all the same (hash --dest and dataset reads check it).
    dest = tmp_path / "dest"
    proc = run(f"{server.api_url}/files", dest, "--api", "github-releases",
               *auth_flags(header_file), "--spool-above", "0", "--sink", "tar")
    assert proc.returncode == 0, proc.stderr
    checked = subprocess.run([sys.executable, "-m", "bulkfetch", "hash", "--dest", str(dest)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert f"{len(server.expected())} members verified" in checked.stderr, checked.stderr


def test_a_listing_that_misstates_one_digest_fails_exactly_that_file(
        header_file: Path, tmp_path: Path) -> None:
    for api, path in (("drf", "/api/files/"), ("github-releases", "/files")):
        with ApiServer(lie=7) as server:
            dest, report = tmp_path / f"dest-{api}", tmp_path / f"report-{api}.json"
            proc = run(server.api_url + path, dest, "--api", api, *auth_flags(header_file),
                       "--report", str(report))
            assert proc.returncode == 1, proc.stderr
            failures = json.loads(report.read_text())["failures"]
            assert [f["name"] for f in failures] == [server.names[7]], failures
            assert "changed since it was listed" in failures[0]["reason"], failures
            expected = server.expected()
            del expected[server.names[7]]
            assert_complete(dest, expected)


def test_without_credentials_the_listing_stops_at_once_with_exit_2(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    # the key alone: the API still answers 401
    proc = run(f"{server.api_url}/api/files/", tmp_path / "dest", "--api", "drf",
               "--header-file", str(header_file), "--retries", "5")
    assert proc.returncode == 2, proc.stderr
    assert CREDENTIALS in " ".join(proc.stderr.split()), proc.stderr  # (the table wraps)
    assert len(server.requests("api")) == 1, "a 401 is not retried"
    assert API_KEY not in proc.stderr + proc.stdout


def test_an_unset_bearer_variable_is_a_usage_error_naming_it(
        server: ApiServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_TOKEN"}
    proc = run(f"{server.api_url}/api/files/", tmp_path / "dest", "--api", "drf",
               "--bearer-env", "NO_SUCH_TOKEN", env=env)
    assert proc.returncode == 2
    assert "NO_SUCH_TOKEN" in proc.stderr and "not set" in proc.stderr
    assert not server.requests("api"), "nothing is asked before the options are right"


def test_offset_pagination_and_an_api_file_reproduce_the_drf_run(
        server: ApiServer, header_file: Path, tmp_path: Path) -> None:
    shape = tmp_path / "mine.toml"
    shape.write_text('items = "results"\nname = "name"\nsize = "size"\nmd5 = "md5"\n'
                     'url = "url"\ntotal = "count"\npaginate = "offset"\n'
                     'page_param = "offset"\nlimit_param = "limit"\npage_size = 25\n')
    dest = tmp_path / "dest"
    proc = run(f"{server.api_url}/api/files/", dest, "--api-file", str(shape),
               *auth_flags(header_file))
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, server.expected())
    asked = sorted(r.path for r in server.requests("api", "/api/files/"))
    assert len(asked) == -(-server.files // 25) and all("limit=25" in p for p in asked), asked
    # a changed shape is another run: the journal asks for --restart, naming it
    again = run(f"{server.api_url}/api/files/", dest, "--api", "drf", *auth_flags(header_file))
    assert again.returncode == 2 and "--restart" in again.stderr, again.stderr


@pytest.mark.parametrize(("api", "path", "page_of"), [
    ("drf", "/api/files/", lambda query: int(query.partition("page=")[2] or 1)),
    ("github-releases", "/files", lambda query: int(query.partition("page=")[2] or 1)),
])
def test_kill_9_then_rerun_resumes_without_listing_done_pages_again(
        header_file: Path, tmp_path: Path, api: str, path: str, page_of) -> None:  # type: ignore[no-untyped-def]
    with ApiServer(files=400, page_size=20, list_delay=0.15) as server:
        dest = tmp_path / "dest"
        url = server.api_url + path
        args = [sys.executable, "-m", "bulkfetch", "get", url, str(dest), "--workers", "2",
                "--quiet", "--api", api, *auth_flags(header_file)]
        first = subprocess.Popen(args, env=environment(), start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kill_after_pages(first, dest, 4)
        journaled = read_journal(dest, "SELECT seq, status FROM pages")
        done = {seq + 1 for seq, state in journaled if state == "done"}  # page numbers
        last = max(seq for seq, _ in journaled) + 1  # listed again to catch a repeat
        assert done and len(journaled) < 20, "the kill came too late to test anything"
        before = len(server.requests("api", path))
        proc = run(url, dest, "--api", api, *auth_flags(header_file))
        assert proc.returncode == 0, proc.stderr
        assert_complete(dest, server.expected())
        again = [page_of(urlquery(r.path)) for r in server.requests("api", path)[before:]]
        relisted = (set(again) & done) - {last}
        assert not relisted, f"done pages listed again: {sorted(relisted)}"


def urlquery(path: str) -> str:
    return path.partition("?")[2]


def test_page_numbers_end_at_the_404_past_the_last_full_page(tmp_path: Path) -> None:
    """Django REST framework answers a page past the end with 404 ("Invalid page.") when
    the count is a multiple of the page size: the listing ends there, every file fetched."""
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--shape", "drf", "--files", "400", "--page-size", "200",
                         access_log=True) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", f"{server.url}/api/files/",
             str(tmp_path / "d"), "--api", "drf", "--paginate", "page", "--page-param", "page",
             "--page-size", "200", "-q"], capture_output=True, text=True, timeout=120)
        pages = [r.status for r in server.requests() if r.target.startswith("/api/files/")]
    assert proc.returncode == 0, proc.stderr
    assert pages == [200, 200, 404]  # two pages, then the one past the end
    assert len(list((tmp_path / "d").iterdir())) == 400 + 1  # and .bulkfetch


@pytest.mark.parametrize("api", [None, "drf"])
def test_a_first_page_that_is_not_there_is_a_wrong_url_exit_2_not_a_rerun(
        tmp_path: Path, api: str | None) -> None:
    """A 404 on the very first list page: the URL is wrong, and rerunning cannot help (a
    404 after the first page ends a page-numbered listing: the test above)."""
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--files", "10", access_log=True) as server:
        url = f"{server.url}/no/such/api/"
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", url, str(tmp_path / "d"), "-q",
             *(["--api", api] if api else []), "--retries", "5"],
            capture_output=True, text=True, timeout=120)
        asked = [(r.target, r.status) for r in server.requests()]
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "HTTP 404" in message and "Check the URL" in message and "/no/such/api/" in message
    assert "Rerun" not in message
    # With no --api, a URL ending in '/' is first asked once whether it is a web server's
    # directory listing (its own URL, not the list page)
    probe = [("/no/such/api/", 404)] if api is None else []
    assert asked[:len(probe)] == probe
    assert [status for _, status in asked[len(probe):]] == [404], \
        f"a first 404 is not retried: {asked}"


@pytest.mark.parametrize("case", ["seed-401", "seed-shape", "flags-shape"])
def test_a_first_page_only_the_user_can_fix_is_exit_2_not_a_rerun(tmp_path: Path,
                                                                   case: str) -> None:
    """A seed listing that wants credentials, JSON that is not a seed listing, flags that do
    not fit the first page: the same command would fail the same way, so exit 2 with what to
    change, at once (no retries), never "Rerun the same command"."""
    from bulkfetch.testing import ReferenceServer

    flags, args, said = {
        "seed-401": (("--require-bearer", "tok-123456"), (), "needs credentials"),
        "seed-shape": (("--shape", "link"), (), "Is the URL a listing"),
        "flags-shape": (("--shape", "link"), ("--paginate", "link"),
                        "Check the listing flags"),
    }[case]
    with ReferenceServer("--files", "10", *flags, access_log=True) as server:
        url = f"{server.url}/files" if case != "seed-401" else server.url
        if case == "seed-shape":  # the link shape's page, where a seed listing is expected
            url, args = server.url, ("--list-path", "/files")
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", url, str(tmp_path / "d"), "-q",
             "--retries", "5", *args], capture_output=True, text=True, timeout=120)
        asked = len(server.requests())
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert said in message and "Rerun" not in message, message
    assert asked == 1, "asked once, not retried"
    assert not (tmp_path / "d").exists()
