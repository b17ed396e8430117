"""`bulkfetch serve --s3` answered by real S3 clients (s5cmd, boto3) and by `bulkfetch get
s3://`; signatures checked with --s3-credentials; `kill -9` during a parallel listing, then
a rerun that lists no completed range again (requests counted in the server's access log);
the --export-static of an S3 data set served by nginx, its listings by the live server the
export names."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from getkit import (
    assert_complete,
    expected_files,
    kill_after_pages,
    read_journal,
    stored_files,
)
from s3kit import s5cmd_binary
from test_get_tls import _self_signed
from test_nginx_export import Nginx, _export, _nginx_binary

from bulkfetch.listing import carry, ranges
from bulkfetch.net.tls import CA_VARIABLES
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.faults import FaultConfig, FaultPlan
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port
from bulkfetch.util.sizes import parse_size_spec

KEY, SECRET = "AKIDBULKFETCHTEST", "s3cr3t/with+odd=chars"
FILES = 3000


@pytest.fixture(scope="module")
def signed() -> ReferenceServer:
    with ReferenceServer("--s3", "--files", str(FILES), "--page-size", "250",
                         "--s3-credentials", f"{KEY}:{SECRET}") as server:
        yield server


def env(**extra: str) -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return found | {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                    "AWS_CONFIG_FILE": os.devnull,
                    "AWS_SHARED_CREDENTIALS_FILE": os.devnull} | extra


def get(server: ReferenceServer, dest: Path, *args: str, environ: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "bulkfetch", "get", "s3://bulkfetch", str(dest),
         "--endpoint-url", server.url, "--workers", "2", "--quiet", *args],
        capture_output=True, text=True, timeout=300, env=environ or env())
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_the_banner_says_where_the_bucket_is(signed: ReferenceServer) -> None:
    assert f"S3: s3://bulkfetch/ with --endpoint-url {signed.url}" in signed.banner
    assert "signed requests only" in signed.banner


def test_bulkfetch_gets_the_bucket_with_signed_requests(signed: ReferenceServer,
                                                        tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc = get(signed, dest, "--list-concurrency", "8")
    assert proc.returncode == 0, proc.stderr
    assert_complete(dest, expected_files(FILES))


def test_a_wrong_secret_is_exit_2_in_plain_words(signed: ReferenceServer,
                                                 tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc = get(signed, dest, environ=env(AWS_SECRET_ACCESS_KEY="not-the-secret"))
    assert proc.returncode == 2, proc.stderr
    assert "signature" in proc.stderr.lower() and "does not match" in proc.stderr.lower()
    assert SECRET not in proc.stderr and "not-the-secret" not in proc.stderr
    assert not dest.exists()  # nothing stored, nothing listed: no DEST left behind


def test_s5cmd_and_boto3_read_the_same_bucket(signed: ReferenceServer) -> None:
    listed = subprocess.run([s5cmd_binary(), "--endpoint-url", signed.url, "ls",
                             "s3://bulkfetch/*"], capture_output=True, text=True, timeout=120,
                            env=env())
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[-1] for line in listed.stdout.splitlines()]
    assert sorted(names) == sorted(expected_files(FILES))
    import boto3

    client = boto3.client("s3", endpoint_url=signed.url, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket="bulkfetch", PaginationConfig={"PageSize": 700})
    objects = [item for page in pages for item in page.get("Contents", [])]
    assert len(objects) == FILES
    first = client.get_object(Bucket="bulkfetch", Key=objects[0]["Key"])
    assert first["ETag"] == objects[0]["ETag"]
    assert len(first["Body"].read()) == objects[0]["Size"] == 100


def test_temporary_credentials_need_their_session_token(reference_server,
                                                        tmp_path: Path) -> None:
    token = "FwoGZXIvYXdzEBYaD+session/token=="
    server = reference_server("--s3", "--files", "200", "--s3-credentials", f"{KEY}:{SECRET}",
                              "--s3-session-token", token)
    with_token = get(server, tmp_path / "ok", environ=env(AWS_SESSION_TOKEN=token))
    assert with_token.returncode == 0, with_token.stderr
    assert_complete(tmp_path / "ok", expected_files(200))
    without = get(server, tmp_path / "no")
    assert without.returncode == 2, without.stderr
    assert "InvalidToken" in without.stderr and "session token" in without.stderr
    wrong = get(server, tmp_path / "wrong", environ=env(AWS_SESSION_TOKEN="another"))
    assert wrong.returncode == 2 and "another" not in wrong.stderr, wrong.stderr
    for dest in ("ok", "no", "wrong"):  # the token is a secret too
        for path in (tmp_path / dest).rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path


def test_big_objects_in_signed_ranges_with_a_session_token(reference_server,
                                                           tmp_path: Path) -> None:
    """Every part of a split object and every streamed body is its own signed request (the
    Range header beside the signature): all bytes right, and the server's check, which
    refuses a bad signature, accepted each one."""
    token = "FwoGZXIvYXdzEBYaD+big/parts=="
    size = "lognormal:300k:1.5:3m"  # 12 files: 4 above 1m, 8 streamed
    server = reference_server("--s3", "--files", "12", "--file-size", size, "--s3-credentials",
                              f"{KEY}:{SECRET}", "--s3-session-token", token,
                              access_log=True)
    done = get(server, tmp_path / "d", "--spool-above", "32k", "--split-above", "1m",
               "--parts", "3", environ=env(AWS_SESSION_TOKEN=token))
    assert done.returncode == 0, done.stderr
    data = SyntheticDataSet(12, 1000, 0, parse_size_spec(size))
    assert sum(data.size(i) > 1 << 20 for i in range(12)) == 4  # ranges are taken
    assert_complete(tmp_path / "d", {data.name(i): hashlib.md5(data.body(i)).hexdigest()
                                     for i in range(12)})
    objects = [r for r in server.requests() if "?" not in r.target and r.method == "GET"]
    assert all(r.auth and r.status in (200, 206) for r in objects)
    assert sum(r.status == 206 for r in objects) >= 4 * 3  # the parts of the big ones


def test_objects_listed_above_spool_above_are_asked_for_once(reference_server,
                                                             tmp_path: Path) -> None:
    """The listing gives each object's size: one above --spool-above streams to disk from
    its first request, not an in-memory attempt stopped at its headers and asked for again
    (a second GET and a new connection per object). Every request is an object's first
    attempt or one of the report's retries (corrupted bodies, caught by the listed MD5)."""
    files, size, seed = 40, "uniform:100k:900k", "3"
    server = reference_server("--s3", "--files", str(files), "--file-size", size,
                              "--corrupt-rate", "0.1", "--seed", seed, access_log=True)
    dest, report = tmp_path / "dest", tmp_path / "r.json"
    proc = get(server, dest, "--spool-above", "64k", "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(report.read_text())
    assert result["checked"] == {"md5": files, "digest": 0, "size_only": 0}
    assert result["retries"] > 0
    gets = [r for r in server.requests() if "?" not in r.target and r.method == "GET"]
    assert len(gets) == files + result["retries"]
    data = SyntheticDataSet(files, 1000, int(seed), parse_size_spec(size))
    assert all(data.size(i) > 64 << 10 for i in range(files))
    assert_complete(dest, {data.name(i): hashlib.md5(data.body(i)).hexdigest()
                           for i in range(files)})


def test_faults_answered_in_s3_words(reference_server, tmp_path: Path) -> None:
    """503 SlowDown and 500 are retried, a corrupted body is caught by its MD5 and fetched
    again, a denied key (403 AccessDenied, 404 NoSuchKey...) fails alone, named."""
    files = 4000
    server = reference_server("--s3", "--files", str(files), "--fail-rate", "0.03",
                              "--corrupt-rate", "0.02", "--deny-rate", "0.01", "--seed", "5")
    dest, report = tmp_path / "dest", tmp_path / "r.json"
    proc = get(server, dest, "--report", str(report))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(report.read_text())
    failed = {failure["name"]: failure["reason"] for failure in data["failures"]}
    assert 10 < len(failed) < 100, len(failed)
    assert all(re.search(r"HTTP (40[0134]|410)( [A-Za-z]+)?", reason)
               for reason in failed.values()), failed
    assert any("AccessDenied" in reason for reason in failed.values()), failed
    assert data["retries"] > 100, data["retries"]
    expected = expected_files(files, seed=5)
    stored = {name: digest for name, digest in expected.items() if name not in failed}
    assert_complete_except(dest, stored)


def test_objects_unlike_their_listing_fail_as_changed_at_their_first_answer(
        reference_server, tmp_path: Path) -> None:
    """`serve --stale-rate`: the listing states another ETag (half of them another Size
    too) than the GET serves, as for objects rewritten after they were listed. Exactly those
    fail, named as changed, with no retry, whether held in memory, streamed, or big enough
    to split (no range is asked for one: its first answer gave it away); every other
    object is checked by the MD5 its listing gives."""
    files, size, seed = 300, "lognormal:8k:2.5:3m", "11"
    server = reference_server("--s3", "--files", str(files), "--file-size", size,
                              "--stale-rate", "0.1", "--seed", seed, access_log=True)
    dest, report = tmp_path / "dest", tmp_path / "r.json"
    proc = get(server, dest, "--spool-above", "64k", "--split-above", "1m", "--parts", "3",
               "--report", str(report))
    assert proc.returncode == 1, proc.stderr
    data = SyntheticDataSet(files, 1000, int(seed), parse_size_spec(size))
    plan = FaultPlan(FaultConfig(stale_rate=0.1), seed=int(seed))
    stale = {data.name(i): data.size(i) for i in range(files) if plan.stale(data.name(i))}
    assert sum(size > 1 << 20 for size in stale.values()) >= 3  # split ones among them
    assert sum(64 << 10 < size <= 1 << 20 for size in stale.values()) >= 3  # streamed ones
    result = json.loads(report.read_text())
    failed = {failure["name"]: failure["reason"] for failure in result["failures"]}
    assert set(failed) == set(stale)
    assert all(reason.startswith("changed since it was listed")
               for reason in failed.values()), failed
    assert result["retries"] == 0
    assert result["checked"] == {"md5": files - len(stale), "digest": 0, "size_only": 0}
    assert_complete_except(dest, {data.name(i): hashlib.md5(data.body(i)).hexdigest()
                                  for i in range(files) if data.name(i) not in stale})
    ranged = [r.target for r in server.requests() if r.status == 206]
    assert ranged and not [t for t in ranged if t.rpartition("/")[2] in stale]


def assert_complete_except(dest: Path, expected: dict[str, str]) -> None:
    stored = stored_files(dest)
    assert set(stored) == set(expected), sorted(set(stored) ^ set(expected))[:10]
    assert [name for name, digest in expected.items() if stored[name] != digest] == []


def _list_requests(server: ReferenceServer, since: int) -> list[str | None]:
    """start-after of every ListObjectsV2 request logged after the first `since` lines."""
    found: list[str | None] = []
    for request in server.requests()[since:]:
        parts = urlsplit(request.target)
        if parts.path == "/bulkfetch" and request.status == 200:
            found.append(parse_qs(parts.query).get("start-after", [None])[0])
    return found


def _covered(dest: Path) -> list[tuple[str, str | None]]:
    """The key intervals (after, through] of every page done, from DEST's journal."""
    spans = []
    for token, next_token in read_journal(
            dest, "SELECT token, next_token FROM pages WHERE status = 'done'"):
        span, _ = ranges.parse(carry.decode(token)[0])
        following, ended = ranges.parse(carry.decode(next_token)[0])
        spans.append((span.after or "", span.upto if ended else following.after))
    return spans


def test_kill_9_while_listing_then_no_completed_range_is_listed_again(
        reference_server, tmp_path: Path) -> None:
    files = 40_000
    server = reference_server("--s3", "--files", str(files), "--list-latency", "40",
                              access_log=True)
    dest = tmp_path / "dest"
    command = [sys.executable, "-m", "bulkfetch", "get", "s3://bulkfetch", str(dest),
               "--endpoint-url", server.url, "--workers", "2", "--list-concurrency", "4",
               "--quiet"]
    run = subprocess.Popen(command, env=env(), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_after_pages(run, dest, 8)
    assert run.returncode == -9
    listing_done = read_journal(dest, "SELECT listing_done FROM run")[0][0]
    assert not listing_done, "the listing ended before the kill: raise --files"
    done = _covered(dest)
    assert done
    mark = len(server.requests())
    rerun = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    again = [after for after in _list_requests(server, mark)
             if any(start <= (after or "") and (end is None or (after or "") < end)
                    for start, end in done)]
    assert again == [], f"{len(again)} requests listed completed ranges again: {again[:5]}"
    assert_complete(dest, expected_files(files))
    (total,) = read_journal(dest, "SELECT sum(count) FROM pages")[0]
    assert total == files  # every key listed exactly once over both runs


def _https(config: Path, port: int, cert: Path, key: Path) -> Path:
    """A copy of the export's nginx config speaking only https."""
    text = config.read_text()
    listen = f"listen 127.0.0.1:{port} backlog=4096;"
    assert text.count(listen) == 1, "the export's nginx.conf changed"
    text = text.replace(listen, f"listen 127.0.0.1:{port} ssl backlog=4096;\n"
                        f"        ssl_certificate '{cert}';\n        ssl_certificate_key '{key}';")
    patched = config.with_name("nginx-tls.conf")
    patched.write_text(text)
    return patched


@pytest.mark.nginx
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_static_export_serves_the_bucket_through_nginx(tmp_path: Path, tls: bool) -> None:
    """nginx serves the objects, the live server the export names the listings; over https
    an untrusted certificate stops the run at once (exit 2) and --ca-bundle completes it."""
    _nginx_binary()
    files, port, directory = 1500, free_port(), tmp_path / "export"
    done = _export(directory, port, "--s3", "--files", str(files), "--page-size", "300")
    assert done.returncode == 0, done.stderr
    command = next(line.split(":", 1)[1].split() for line in done.stdout.splitlines()
                   if line.startswith("S3 listings:"))
    assert command[:3] == ["bulkfetch", "serve", "--s3"], command
    config = directory / "nginx.conf"
    if tls:
        cert, key = _self_signed(tmp_path, "server")
        config = _https(config, port, cert, key)
    lister = subprocess.Popen([sys.executable, "-m", *command], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    nginx = Nginx(config, port)
    endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    def get_through_nginx(dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "s3://bulkfetch", str(dest),
             "--endpoint-url", endpoint, "--workers", "2", "--quiet", *extra],
            capture_output=True, text=True, timeout=300,
            env={k: v for k, v in env().items() if k not in CA_VARIABLES})

    try:
        assert lister.stdout is not None
        assert lister.stdout.readline().startswith(b"serving http://")
        nginx.start()
        if tls:
            refused = get_through_nginx(tmp_path / "untrusted")
            assert refused.returncode == 2, refused.stderr
            assert f"TLS certificate of 127.0.0.1:{port} was refused" in " ".join(
                refused.stderr.split()), refused.stderr
            assert not (tmp_path / "untrusted").exists()  # stopped at once: no DEST
        dest = tmp_path / "dest"
        proc = get_through_nginx(dest, *(["--ca-bundle", str(cert)] if tls else []))
        assert proc.returncode == 0, proc.stderr
        assert_complete(dest, expected_files(files))
    finally:
        nginx.stop()
        lister.terminate()
        lister.wait(10)


def test_signed_requests_are_not_redirected(reference_server, tmp_path: Path) -> None:
    """A signed request carries its session token as a plain header, which libcurl would
    send on to whatever host a redirect names: a signed source follows no redirect, and
    the redirected objects fail, named with the answer."""
    token = "FwoGZXIvYXdzEBYaD+no/redirects=="
    files = 300
    server = reference_server("--s3", "--files", str(files), "--s3-credentials",
                              f"{KEY}:{SECRET}", "--s3-session-token", token,
                              "--redirect-rate", "0.05", "--redirect-to", "other-host",
                              access_log=True)
    dest, report = tmp_path / "d", tmp_path / "r.json"
    proc = get(server, dest, "--report", str(report), environ=env(AWS_SESSION_TOKEN=token))
    assert proc.returncode == 1, proc.stderr
    failed = json.loads(report.read_text())["failures"]
    assert failed and all(f["reason"].startswith("HTTP 302") for f in failed), failed
    log = server.requests()
    assert all(r.host.startswith("127.0.0.1:") for r in log), \
        [r for r in log if not r.host.startswith("127.0.0.1:")][:3]
    expected = {n: d for n, d in expected_files(files).items()
                if n not in {f["name"] for f in failed}}
    assert_complete_except(dest, expected)
