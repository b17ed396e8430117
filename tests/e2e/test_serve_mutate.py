"""`bulkfetch serve --epoch N --mutate-rate P` (issue 24) over loopback: the real server
started at two epochs serves changed bodies and ETags for exactly the files
mutated_indices() names, conditional GETs tell them apart (as its access log shows), the S3
listing states the new ETags, a larger --files leaves the first files alone, and the nginx
export of an epoch answers like the live server."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.parse
import xml.etree.ElementTree as ET
from email.utils import formatdate
from pathlib import Path

import pytest
from test_nginx_export import Client as ExportClient
from test_nginx_export import Nginx, _export, _nginx_binary

from bulkfetch.server.dataset import DAY, EPOCH_2025, SyntheticDataSet, mutated_indices
from bulkfetch.util.ports import free_port
from bulkfetch.util.sizes import parse_size_spec

FILES, SEED, RATE = 400, 5, 0.05
SIZES = "uniform:1:3000"
FLAGS = ("--files", str(FILES), "--page-size", "100", "--seed", str(SEED),
         "--file-size", SIZES)
EPOCH_2 = ("--epoch", "2", "--mutate-rate", str(RATE))
NS = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}

Answer = tuple[int, dict[str, str], bytes]


class Client(ExportClient):
    """One keep-alive connection that also reads a whole listing."""

    def names(self) -> list[str]:
        names: list[str] = []
        target = "/list"
        while True:
            status, _, body = self.ask(target)
            assert status == 200, body
            page = json.loads(body)
            names += page["FileNames"]
            if "NextMarker" not in page:
                return names
            target = "/list?next-marker=" + urllib.parse.quote(page["NextMarker"])

    def s3_etags(self) -> dict[str, str]:
        status, _, body = self.ask("/bulkfetch?list-type=2")
        assert status == 200, body
        root = ET.fromstring(body)
        assert root.findtext("s3:IsTruncated", namespaces=NS) == "false"
        return {c.findtext("s3:Key", namespaces=NS) or "": c.findtext("s3:ETag", namespaces=NS)
                or "" for c in root.iterfind("s3:Contents", NS)}


def http_date(epoch: int) -> str:
    return formatdate(epoch, usegmt=True)


def _path(name: str) -> str:
    return "/get/" + urllib.parse.quote(name)


def _md5_etag(body: bytes) -> str:
    return '"' + hashlib.md5(body).hexdigest() + '"'


def _changed(files: int = FILES, epoch: int = 2) -> set[str]:
    dataset = SyntheticDataSet(files, 100, SEED, parse_size_spec(SIZES))
    return {dataset.name(i) for i in mutated_indices(SEED, files, RATE, 1, epoch)}


def test_epoch_2_changes_exactly_the_mutated_files(reference_server) -> None:
    before = reference_server(*FLAGS, "--s3")
    after = reference_server(*FLAGS, "--s3", *EPOCH_2, access_log=True)
    assert "epoch 2 at mutate rate 0.05" in after.banner
    changed = _changed()
    assert 8 < len(changed) < 40  # Binomial(400, 0.05): 20 expected
    old, new = Client(before.url), Client(after.url)
    names = new.names()
    assert names == old.names() and len(names) == FILES  # the listing never changes

    differ = set()
    validators: dict[str, tuple[str, str]] = {}
    for name in names:
        status_old, head_old, body_old = old.ask(_path(name))
        status_new, head_new, body_new = new.ask(_path(name))
        assert status_old == status_new == 200
        assert head_new["etag"] == _md5_etag(body_new) and head_old["etag"] == _md5_etag(body_old)
        assert len(body_new) == len(body_old)  # a changed file keeps its size
        if body_new != body_old:
            differ.add(name)
            assert head_new["etag"] != head_old["etag"]
            assert head_new["last-modified"] == http_date(EPOCH_2025 + DAY)
        else:
            assert head_new["etag"] == head_old["etag"]
            assert head_new["last-modified"] == head_old["last-modified"]
        assert head_old["last-modified"] == http_date(EPOCH_2025)
        validators[name] = (head_old["etag"], head_old["last-modified"])
    assert differ == changed

    # A sync that kept epoch 1's validators: 304 for the unchanged, 200 for the changed
    logged_before = len(after.requests())
    for name, (etag, modified) in validators.items():
        by_etag = new.ask(_path(name), headers={"If-None-Match": etag})
        by_date = new.ask(_path(name), headers={"If-Modified-Since": modified})
        want = 200 if name in changed else 304
        assert by_etag[0] == by_date[0] == want, name
        if want == 304:
            assert (by_etag[1]["etag"], by_etag[2]) == (etag, b"")
    logged = after.requests()[logged_before:]
    assert len(logged) == 2 * FILES
    fetched = {urllib.parse.unquote(r.target)[len("/get/"):] for r in logged if r.status == 200}
    assert fetched == changed
    assert {r.status for r in logged} == {200, 304}

    # The S3 listing states the ETag a GET serves at each epoch
    listed_old, listed_new = old.s3_etags(), new.s3_etags()
    assert sorted(listed_new) == sorted(names)
    assert {k for k in listed_new if listed_new[k] != listed_old[k]} == changed
    for name in sorted(changed)[:5] + names[:5]:
        status, head, _ = new.ask("/bulkfetch/" + urllib.parse.quote(name), method="HEAD")
        assert status == 200 and head["etag"] == listed_new[name]


def test_a_later_epoch_only_adds_changes_and_more_files_leave_the_rest(reference_server) -> None:
    at2 = Client(reference_server(*FLAGS, *EPOCH_2).url)
    grown_flags = [*FLAGS]
    grown_flags[1] = str(FILES + 40)
    at3 = Client(reference_server(*grown_flags, "--epoch", "3", "--mutate-rate",
                                  str(RATE)).url)
    names = at3.names()
    assert len(names) == FILES + 40 and names[:FILES] == at2.names()
    changed_2_to_3 = {SyntheticDataSet(FILES + 40, 100, SEED, parse_size_spec(SIZES)).name(i)
                      for i in mutated_indices(SEED, FILES, RATE, 2, 3)}
    assert changed_2_to_3 and _changed(epoch=2) < _changed(epoch=3)
    for name in names[:FILES]:
        status, head, body = at2.ask(_path(name))
        assert status == 200
        answer = at3.ask(_path(name), headers={"If-None-Match": head["etag"]})
        assert answer[0] == (200 if name in changed_2_to_3 else 304), name
        if answer[0] == 200:
            assert answer[2] != body and answer[1]["etag"] == _md5_etag(answer[2])
            assert answer[1]["last-modified"] == http_date(EPOCH_2025 + 2 * DAY)
    for name in names[FILES:]:
        assert at3.ask(_path(name), method="HEAD")[0] == 200
        assert at2.ask(_path(name), method="HEAD")[0] == 404


@pytest.mark.parametrize(("args", "words"), [
    (("--mutate-rate", "1.5"), "--mutate-rate"),
    (("--epoch", "0"), "--epoch"),
    (("--root", "/", "--epoch", "2", "--mutate-rate", "0.1"), "--root"),
])
def test_bad_values_are_usage_errors(args: tuple[str, ...], words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bulkfetch", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


@pytest.mark.nginx
def test_the_nginx_export_of_an_epoch_answers_like_the_live_server(
        reference_server, tmp_path: Path) -> None:
    _nginx_binary()
    port = free_port()
    done = _export(tmp_path / "export", port, *FLAGS, *EPOCH_2)
    assert done.returncode == 0, done.stderr
    nginx = Nginx(tmp_path / "export" / "nginx.conf", port).start()
    try:
        live, static = Client(reference_server(*FLAGS, *EPOCH_2).url), Client(nginx.url)
        changed = _changed()
        names = live.names()
        assert static.names() == names
        compared = ("etag", "content-length", "last-modified")
        for name in names:
            a, b = live.ask(_path(name)), static.ask(_path(name))
            assert (a[0], a[2]) == (b[0], b[2]) == (200, a[2]), name
            assert all(a[1].get(h) == b[1].get(h) for h in compared), (name, a[1], b[1])
            for headers in ({"If-None-Match": a[1]["etag"]},
                            {"If-Modified-Since": http_date(EPOCH_2025)}):
                a304, b304 = live.ask(_path(name), headers=headers), \
                    static.ask(_path(name), headers=headers)
                assert a304[0] == b304[0], (name, headers)
                if "If-None-Match" in headers:
                    assert a304[0] == 304
                    assert b304[1].get("last-modified") == a304[1]["last-modified"], name
                else:
                    assert a304[0] == (200 if name in changed else 304), name
    finally:
        nginx.stop()
