"""bulkfetch bench: the peers' command lines and inputs, wrk's output, the designs' pure
helpers, subset sizes, machine slug and default results directory."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from bulkfetch.bench import ceiling, designs, machine, output, peers, session

BASE = "http://127.0.0.1:8080"


def test_url_list_has_one_quoted_url_per_line(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    assert peers.write_url_list(path, BASE, ["f0000000000", "a b", "07/42/x"]) == 3
    assert path.read_text().splitlines() == [
        f"{BASE}/get/f0000000000", f"{BASE}/get/a%20b", f"{BASE}/get/07/42/x"]
    assert peers.write_url_list(tmp_path / "empty.txt", BASE, []) == 0
    assert (tmp_path / "empty.txt").read_text() == ""


def test_curl_config_quotes_each_url(tmp_path: Path) -> None:
    path = tmp_path / "curl.conf"
    assert peers.write_curl_config(path, BASE, iter(["f1", 'q"x'])) == 2
    assert path.read_text().splitlines() == [f'url = "{BASE}/get/f1"',
                                             f'url = "{BASE}/get/q%22x"']


CONF = """\
http {
    server {
        listen 127.0.0.1:8080 backlog=4096;
        location /get/ {
            alias '/x/files/';
        }

        location / {
            return 404;
        }
    }
}
"""


def test_autoindex_goes_before_the_catch_all() -> None:
    text = peers.with_autoindex(CONF, Path("/data/export/files"))
    block = ("location /files/ {\n            alias '/data/export/files/';\n"
             "            autoindex on;")
    assert block in text
    assert text.index("location /files/") < text.index("location / {")
    assert text.count("location /get/") == 1
    with pytest.raises(ValueError):
        peers.with_autoindex(CONF, Path("/a$b"))
    with pytest.raises(ValueError):
        peers.with_autoindex("http {}", Path("/data"))


@pytest.mark.parametrize("peer", peers.PEERS, ids=lambda p: p.name)
def test_every_peer_writes_into_dest_with_64_in_flight(peer: peers.Peer, tmp_path: Path) -> None:
    argv = peers.command(peer, BASE, tmp_path / "dest", tmp_path / "u.txt", tmp_path / "c.conf")
    assert argv[0] == peer.binary
    assert str(tmp_path / "dest") in argv
    assert any("64" in arg for arg in argv)
    if peer.name == "rclone":
        assert f"{BASE}/files/" in argv and "--http-no-head" in argv
    elif peer.name == "curl":
        assert "--parallel" in argv and str(tmp_path / "c.conf") in argv
    else:
        assert str(tmp_path / "u.txt") in argv


def test_missing_peer_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers.shutil, "which", lambda _: None)
    aria = next(p for p in peers.PEERS if p.name == "aria2c")
    assert peers.missing(aria) == "aria2c is not installed (apt-get install aria2)"
    assert peers.version("aria2c") == "not installed"


WRK = """\
Running 2s test @ http://127.0.0.1:8080/get/f0000000000
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20ms  300.00us   5.00ms   90.00%
  103682 requests in 2.01s, 40.00MB read
  Non-2xx or 3xx responses: 3
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:  51583.08
Transfer/sec:     19.90MB
"""


def test_wrk_output() -> None:
    result = ceiling.parse(WRK)
    assert result.requests == 103_682
    assert result.seconds == pytest.approx(2.01)
    assert result.errors == 6
    assert result.rate == pytest.approx(103_682 / 2.01)
    clean = ceiling.parse("  10 requests in 500.00ms, 1KB read\n")
    assert clean.errors == 0 and clean.seconds == 0.5
    with pytest.raises(ValueError):
        ceiling.parse("unable to connect")
    assert ceiling.command("http://h/get/x", 2.4)[:4] == ["wrk", "-t1", "-c64", "-d2s"]


def test_design_paths_never_leave_dest() -> None:
    assert designs.local_path("/d", "f1") == "/d/f1"
    assert designs.local_path("/d", "07/42/f1") == "/d/07/42/f1"
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a//b", "./x", "a\0b"):
        assert designs.local_path("/d", bad) is None, bad


def test_design_listing_stops_at_the_subset() -> None:
    pages = {None: {"FileNames": ["a", "b", "c"], "NextMarker": "t1"},
             "t1": {"FileNames": ["d", "e", "f"], "NextMarker": "t2"},
             "t2": {"FileNames": ["g"]}}
    asked: list[str] = []

    def get_json(url: str) -> dict[str, object]:
        asked.append(url)
        token = url.split("next-marker=")[1] if "next-marker=" in url else None
        return pages[token]  # type: ignore[return-value]

    assert list(designs.pages_sync(get_json, BASE, 100)) == [["a", "b", "c"], ["d", "e", "f"],
                                                              ["g"]]
    assert asked == [f"{BASE}/list", f"{BASE}/list?next-marker=t1", f"{BASE}/list?next-marker=t2"]
    asked.clear()
    assert list(designs.pages_sync(get_json, BASE, 4)) == [["a", "b", "c"], ["d"]]
    assert len(asked) == 2
    assert designs.list_url(BASE, "a/b=") == f"{BASE}/list?next-marker=a%2Fb%3D"


def test_design_names_and_requirements() -> None:
    assert designs.NAMES == ("sync", "threads-10", "threads-100", "processes", "asyncio",
                             "combo")
    assert designs.requirement("threads-100") == "requests"
    assert designs.requirement("combo") == "aiohttp"


def test_designs_cli_rejects_an_unknown_design(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        designs.main(["nope", BASE, "10", str(tmp_path / "d")])
    assert exit_info.value.code == 2
    assert "unknown design" in capsys.readouterr().err


def test_subset_sizes_are_proportional() -> None:
    assert session.subset_size(200_000, 20) == 10_000
    assert session.subset_size(200_000, 1) == 200_000
    assert session.subset_size(2_000, 40) == 100  # never below MIN_SUBSET ...
    assert session.subset_size(50, 20) == 50  # ... nor above the data set


def test_results_directory_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_model",
                        lambda: "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz")
    monkeypatch.setattr(machine, "cores", lambda: 2)
    day = datetime.date(2026, 11, 22)
    assert machine.slug(day) == "2026-11-22-2c-intel-xeon-platinum-8375c"
    slug = "2026-11-22-2c-intel-xeon-platinum-8375c"
    cache = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/home/u"}
    assert output.default_out(False, cache, day) == tmp_path / "xdg" / "bulkfetch" / "bench" / slug
    assert output.default_out(True, cache, day) == (
        tmp_path / "xdg" / "bulkfetch" / "bench" / f"{slug}-quick")
    # unset or relative (the XDG spec ignores it then): ~/.cache; never the working directory
    for home_only in ({"HOME": "/home/u"}, {"HOME": "/home/u", "XDG_CACHE_HOME": "rel"}):
        assert output.default_out(False, home_only, day) == Path(
            "/home/u/.cache/bulkfetch/bench", slug)


def test_machine_description_has_the_asked_lines() -> None:
    text = machine.describe("server on core 0, client on core 1")
    keys = {line.split(":", 1)[0] for line in text.splitlines()}
    assert {"cpu", "cores", "memory", "kernel", "python", "libcurl", "nginx", "rclone",
            "aria2c", "wget2", "curl", "bulkfetch tar packer"} <= keys
    assert "bulkfetch tar packer: C (bulkfetch.sinks._ustar)\n" in text
    json.dumps(text)  # plain text


def test_missing_extras_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "have_module", lambda name: name != "matplotlib")
    monkeypatch.setattr(session.shutil, "which", lambda binary: None if binary == "wget2" else "x")
    assert session.environment_note() == ("For every row and chart: pip install -e .[bench] "
                                          "(missing: matplotlib) and apt-get install wget2")
    monkeypatch.setattr(session, "have_module", lambda name: True)
    monkeypatch.setattr(session.shutil, "which", lambda binary: "x")
    assert session.environment_note() is None


def test_rclone_subset_is_named_by_files_from(tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    assert peers.write_names(names, ["f1", "f2"]) == 2
    assert names.read_text() == "f1\nf2\n"
    rclone = next(p for p in peers.PEERS if p.name == "rclone")
    argv = peers.command(rclone, BASE, tmp_path / "d", tmp_path / "u", tmp_path / "c", names)
    assert argv[argv.index("--files-from") + 1] == str(names)
    assert "--files-from" not in peers.command(rclone, BASE, tmp_path / "d", tmp_path / "u",
                                               tmp_path / "c")
