"""`bulkfetch get URL/ DEST` crawling real web servers' directory listings, end to end: a
tree on disk with awkward names (spaces, '%', '&', '+', '#', quotes, non-ASCII, a long name,
deep paths, empty directories) served by real nginx (autoindex as HTML with exact sizes,
and as JSON) and by `python -m http.server`; and the reference server's listing shapes with
their faults. Every stored file is compared byte for byte with the server's own copy, and
the servers' access logs say what the crawler asked for."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import random
import re
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest
from getkit import (
    assert_state_clean,
    cli,
    command,
    get,
    kill_after_pages,
    read_journal,
    settled_count,
    start_http_server,
)
from test_nginx_export import Nginx, _nginx_binary

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port
from bulkfetch.util.sizes import parse_size_spec

NOTICE = "bulkfetch: {url} answers a directory listing: crawling the tree under it (as --api index)"

# -- the tree on disk ------------------------------------------------------------------------
ODD_FILES = ("with space.txt", "100%.bin", "a&b.txt", "c+d.txt", "hash#tag.txt", "café.txt",
             "日本語.txt", 'say "hi".txt', "it's.txt", "semi;colon=eq.txt",
             "a-name-longer-than-fifty-characters-which-nginx-cuts-in-its-html.dat")
ODD_DIRS = ("dir with space", "per%cent", "amp&dir", "plus+dir", "hash#dir", "ümlaut-é",
            "日本", 'quote"dir')
DEEP = "deep/l1/l2/l3/l4/l5/l6/l7/l8/l9"  # ten levels below the top
KEYED = {"a.txt": b"first\n", "sub/b.bin": bytes(range(256)) * 9, "away.bin": b"moved\n"}
FORBIDDEN, GONE = "data/d03/", "deep/l1/l2/"  # nginx's /refuse/ answers 403 and 404 there
API_KEY = "k3y-0f-the-archive"  # what nginx's /keyed/ wants in X-Api-Key
SLOW_RATE = "120r/s"  # nginx's /slow/ answers no more requests a second than this


def _build_tree(root: Path) -> dict[str, bytes]:
    """Write the tree under `root`; relative path -> bytes of every file."""
    rng = random.Random(20240611)
    files: dict[str, bytes] = {}

    def body() -> bytes:
        return rng.randbytes(rng.randint(0, 50 * 1024))

    for name in ODD_FILES:
        files[name] = body()
    files["zero.bin"] = b""
    files["max.bin"] = rng.randbytes(50 * 1024)
    for directory in ODD_DIRS:
        for index in range(8):
            files[f"{directory}/file {index}.dat"] = body()
        files[f"{directory}/{rng.choice(ODD_FILES)}"] = body()
        files[f"{directory}/empty.txt"] = b""
    for group in range(10):
        for index in range(20):
            files[f"data/d{group:02d}/part-{index:03d}.bin"] = body()
    levels = DEEP.split("/")
    for depth in range(1, len(levels) + 1):
        files["/".join(levels[:depth]) + f"/level {depth}.txt"] = body()
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "empty").mkdir()
    (root / "data" / "empty-too").mkdir()
    return files


def _dirs_of(files: dict[str, bytes], root: Path) -> set[str]:
    """Every directory of the tree as the crawler names it: "" the top, else "a/b/"."""
    return {"" if p == root else p.relative_to(root).as_posix() + "/"
            for p in [root, *root.rglob("*")] if p.is_dir()}


def _directory(rel: str) -> str:
    """The directory path ("a/b/", "" at the top) of a file's relative path."""
    head, _, _ = rel.rpartition("/")
    return head + "/" if head else ""


@dataclass
class Tree:
    root: Path
    files: dict[str, bytes]
    dirs: set[str]
    mutable: Path  # an empty directory nginx serves at /sync/, for a test to change


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    site = tmp_path_factory.mktemp("site")
    (site / "outside.txt").write_bytes(b"never to be asked for\n")  # beside the tree
    root = site / "tree"
    files = _build_tree(root)
    dirs = _dirs_of(files, root)
    assert len(files) > 300 and len(dirs) > 20 and max(f.count("/") for f in files) >= 10
    (site / "mutable").mkdir()
    for rel, data in KEYED.items():
        for place in ("keyed", "elsewhere") if rel == "away.bin" else ("keyed",):
            (site / place / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / place / rel).write_bytes(data)
    return Tree(root, files, dirs, site / "mutable")


# -- servers ---------------------------------------------------------------------------------
class AccessLog:
    """A server's access log as (status, target) lines; `mark()` and `since(mark)` cut out
    one run's requests."""

    def __init__(self, path: Path, pattern: str) -> None:
        self.path = path
        self.pattern = re.compile(pattern)

    def requests(self) -> list[tuple[int, str]]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text(errors="replace").splitlines():
            match = self.pattern.search(line)
            if match:
                found.append((int(match["status"]), match["target"]))
        return found

    def timed(self) -> list[tuple[float, str, int]]:
        """(time the answer ended, target, body bytes) of each line (nginx's log only)."""
        found = []
        for line in self.path.read_text(errors="replace").splitlines():
            match = self.pattern.search(line)
            if match:
                found.append((float(match["time"]), match["target"], int(match["bytes"])))
        return found

    def mark(self) -> int:
        return settled_count(self, quiet_s=0.2)

    def since(self, mark: int) -> list[tuple[int, str]]:
        return self.requests()[mark:]


@dataclass
class Served:
    url: str  # the tree's URL, ending in '/'
    log: AccessLog


def _nginx_conf(home: Path, root: Path, port: int, mutable: Path, elsewhere: int) -> str:
    run = home / "run"
    user = "user root;\n" if os.geteuid() == 0 else ""  # root's tmp dirs are often mode 0700
    temps = "".join(f'    {kind}_temp_path "{run / kind}";\n'
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""\
{user}worker_processes 1;
pid "{run / 'nginx.pid'}";
lock_file "{run / 'nginx.lock'}";
error_log "{run / 'error.log'}" warn;
events {{
    worker_connections 1024;
}}
http {{
    log_format targets '$msec $status $request_method $request_uri $body_bytes_sent';
    log_format keys '$request_uri key=$http_x_api_key';
    access_log "{run / 'access.log'}" targets;
    limit_req_zone $binary_remote_addr zone=slow:1m rate={SLOW_RATE};
{temps}    types {{}}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        location /html/ {{
            alias "{root}/";
            autoindex on;
            autoindex_format html;
            autoindex_exact_size on;
        }}
        location /json/ {{
            alias "{root}/";
            autoindex on;
            autoindex_format json;
        }}
        location /slow/ {{
            alias "{root}/";
            autoindex on;
            autoindex_format json;
            limit_req zone=slow burst=100000;  # queued, not refused: {SLOW_RATE} a second
        }}
        location /refuse/ {{
            alias "{root}/";
            autoindex on;
            autoindex_format json;
        }}
        location ^~ /refuse/{FORBIDDEN} {{
            deny all;
        }}
        location ^~ /refuse/{GONE} {{
            return 404;
        }}
        location /keyed/ {{  # a tree behind an API key; away.bin redirects elsewhere
            alias "{mutable.parent / 'keyed'}/";
            autoindex on;
            autoindex_format html;
            autoindex_exact_size on;
            if ($http_x_api_key != "{API_KEY}") {{
                return 401;
            }}
        }}
        location = /keyed/away.bin {{
            return 302 http://127.0.0.1:{elsewhere}/away.bin;
        }}
        location /sums/ {{
            alias "{mutable.parent / 'sums'}/";
            autoindex on;
            autoindex_format html;
            autoindex_exact_size on;
        }}
        location /sync/ {{
            alias "{mutable}/";
            autoindex on;
            autoindex_format html;
            autoindex_exact_size on;
        }}
    }}
    server {{  # another host, as far as credentials go: it logs the key it was sent
        listen 127.0.0.1:{elsewhere};
        access_log "{run / 'elsewhere.log'}" keys;
        location / {{
            root "{mutable.parent / 'elsewhere'}";
        }}
    }}
}}
"""


@pytest.fixture(scope="module")
def nginx(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Real nginx on the tree: /html/ (HTML, exact sizes), /json/, /slow/ (JSON, SLOW_RATE
    requests a second) and /refuse/ (JSON; a subdirectory of /refuse/ answers 403, another 404).
    `Served.url` is the server's root."""
    _nginx_binary()
    home = tmp_path_factory.mktemp("nginx")
    (home / "run").mkdir()
    port = free_port()
    config = home / "nginx.conf"
    config.write_text(_nginx_conf(home, tree.root, port, tree.mutable, free_port()))
    server = Nginx(config, port).start()
    try:
        yield Served(server.url + "/", AccessLog(
            home / "run" / "access.log",
            r"^(?P<time>[\d.]+) (?P<status>\d{3}) GET (?P<target>\S+) (?P<bytes>\d+)$"))
    finally:
        server.stop()


@pytest.fixture(scope="module")
def http_server(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`python -m http.server` on the directory holding the tree (and a file beside it)."""
    home = tmp_path_factory.mktemp("http_server")
    log_path = home / "access.log"
    process, port = start_http_server(tree.root.parent, log_path)
    try:
        yield Served(f"http://127.0.0.1:{port}/tree/", AccessLog(
            log_path, r'"GET (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})'))
    finally:
        process.terminate()
        process.wait(10)


# -- checks ----------------------------------------------------------------------------------
def stored(dest: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under DEST outside DEST/.bulkfetch."""
    found: dict[str, bytes] = {}
    for path in dest.rglob("*"):
        rel = path.relative_to(dest).as_posix()
        if rel == ".bulkfetch" or rel.startswith(".bulkfetch/"):
            continue
        assert not path.is_symlink(), path
        if path.is_file():
            found[rel] = path.read_bytes()
    return found


def assert_exactly(dest: Path, expected: dict[str, bytes]) -> None:
    """DEST holds exactly `expected`, every byte the same, and nothing else."""
    found = stored(dest)
    assert set(found) == set(expected), (sorted(set(found) - set(expected))[:10],
                                         sorted(set(expected) - set(found))[:10])
    wrong = sorted(rel for rel, data in expected.items() if found[rel] != data)
    assert not wrong, f"{len(wrong)} files differ, e.g. {wrong[:5]}"


def only_dest(out: Path) -> None:
    """Nothing was written beside DEST: its parent holds DEST alone."""
    assert sorted(os.listdir(out)) == ["dest"], os.listdir(out)


def assert_stayed_under(requests: list[tuple[int, str]], prefix: str) -> None:
    """Every request was for `prefix` or below, and none named a '..' segment (raw or
    percent-encoded)."""
    assert requests, "no request reached the server"
    for _, target in requests:
        path = unquote(target)
        assert target.startswith(prefix), target
        assert "?" not in target, target
        assert ".." not in path.split("/"), target


def listed_dirs(requests: list[tuple[int, str]], prefix: str) -> list[str]:
    """The directories (as "a/b/") a run's listing requests asked for, in order."""
    return [unquote(target)[len(prefix):] for _, target in requests if target.endswith("/")]


def fetched_files(requests: list[tuple[int, str]], prefix: str) -> set[str]:
    return {unquote(target)[len(prefix):] for _, target in requests
            if not target.endswith("/")}


def dest_in(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    return out, out / "dest"


# -- 1. the whole tree from three servers, found by its answer --------------------------------
SERVERS = {"nginx-html": "html/", "nginx-json": "json/", "http.server": ""}


@pytest.mark.nginx
@pytest.mark.parametrize("kind", SERVERS, ids=SERVERS.keys())
def test_the_whole_tree_byte_exact_from_each_server(
        kind: str, tree: Tree, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    served: Served = request.getfixturevalue(
        "http_server" if kind == "http.server" else "nginx")
    url = served.url + SERVERS[kind]
    prefix = "/" + url.split("/", 3)[3]
    out, dest = dest_in(tmp_path)
    mark = served.log.mark()
    proc, report = get(url, dest, tmp_path / "report.json")

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert NOTICE.format(url=url) in proc.stderr, proc.stderr[-2000:]
    assert report["files_ok"] == len(tree.files) and report["files_failed"] == 0
    assert_exactly(dest, tree.files)
    assert_state_clean(dest)
    only_dest(out)
    requests = served.log.since(mark)
    assert_stayed_under(requests, prefix)
    # (499: nginx's mark of an answer the client stopped reading, a hedged twin's)
    assert {status for status, _ in requests} <= {200, 499}, requests[:5]
    assert set(listed_dirs(requests, prefix)) == tree.dirs
    assert fetched_files(requests, prefix) == set(tree.files)


# -- 2. into tar shards ----------------------------------------------------------------------
@pytest.mark.nginx
def test_tar_shards_hold_every_file(nginx: Served, tree: Tree, tmp_path: Path) -> None:
    out, dest = dest_in(tmp_path)
    proc, report = get(nginx.url + "json/", dest, tmp_path / "report.json", "--api", "index",
                       "--sink", "tar", "--shard-files", "100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "answers a directory listing" not in proc.stderr  # --api index said it
    assert report["files_ok"] == len(tree.files)
    only_dest(out)
    shards = sorted(dest.glob("shard-*.tar"))
    assert len(shards) >= 2, os.listdir(dest)

    members: dict[str, bytes] = {}
    for shard in shards:
        with tarfile.open(shard) as archive:
            for info in archive:
                assert info.isfile(), info.name
                assert info.name not in members, f"{info.name} twice"
                handle = archive.extractfile(info)
                assert handle is not None
                members[info.name] = handle.read()
    assert set(members) == set(tree.files)
    assert all(members[rel] == data for rel, data in tree.files.items())

    try:
        from webdataset.tariterators import tar_file_iterator
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("webdataset is missing: it is a test dependency")
        return
    read: dict[str, bytes] = {}
    for shard in shards:
        with shard.open("rb") as stream:
            for sample in tar_file_iterator(stream, skip_meta=None):
                read[sample["fname"]] = sample["data"]
    assert read == tree.files


# -- 3. kill -9 midway, then the same command ------------------------------------------------
def _done_dirs(dest: Path) -> tuple[set[str], int]:
    """The directories every page of which the journal holds done; and pages journaled."""
    rows = read_journal(dest, "SELECT token, next_token, status FROM pages")
    pages: dict[str, list[str]] = {}
    parts: dict[str, int] = {}
    for token, next_token, status in rows:
        assert token.startswith("tree:"), token
        path, part = json.loads(token[len("tree:"):])
        pages.setdefault(path, []).append(status)
        if part == 0:
            parts[path] = json.loads(next_token)["parts"]
    done = {path for path, statuses in pages.items()
            if path in parts and len(statuses) == parts[path]
            and all(status == "done" for status in statuses)}
    return done, len(rows)


@pytest.mark.nginx
def test_kill_9_midway_then_the_same_command_lists_only_what_is_left(
        nginx: Served, tree: Tree, tmp_path: Path) -> None:
    url = nginx.url + "slow/"
    out, dest = dest_in(tmp_path)
    # one request at a time, SLOW_RATE of them a second: some 3 s for the whole tree
    argv = command(url, dest, "--api", "index", "-w", "1", "-c", "1", "--list-concurrency",
                   "2", "--quiet")
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        kill_after_pages(first, dest, 6, timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        assert first.stderr is not None
        first.stderr.close()
    done, journaled = _done_dirs(dest)
    assert 6 <= len(done) < len(tree.dirs), (len(done), journaled)
    kept = stored(dest)
    assert len(kept) < len(tree.files)
    assert all(tree.files[rel] == data for rel, data in kept.items())

    mark = nginx.log.mark()
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert_exactly(dest, tree.files)
    assert_state_clean(dest)
    only_dest(out)

    requests = nginx.log.since(mark)
    assert_stayed_under(requests, "/slow/")
    relisted = listed_dirs(requests, "/slow/")
    assert relisted, "the rerun listed nothing"
    assert not done & set(relisted), sorted(done & set(relisted))
    again = {rel for rel in fetched_files(requests, "/slow/") if _directory(rel) in done}
    assert not again, sorted(again)[:10]
    # what the rerun listed: everything not done (each directory with files to fetch, and
    # the ones found but not listed before the kill)
    assert set(relisted) == tree.dirs - done


# -- 3b. --limit-rate with one transfer in flight -------------------------------------------
# A transfer held back by the rate moves on libcurl's timer, not on a socket: a worker loop
# that waited its own fixed 50 ms instead moved ~0.5 MB/s at --limit-rate 2m (and at 8m).
@pytest.mark.nginx
def test_limit_rate_with_one_transfer_in_flight_reaches_the_rate(
        nginx: Served, tree: Tree, tmp_path: Path) -> None:
    rate, chosen = 2 << 20, "data/d0[0-1]/*"
    expected = {rel: data for rel, data in tree.files.items()
                if fnmatch.fnmatchcase(rel, chosen)}
    assert sum(map(len, expected.values())) > 2 * rate // 5  # ~1 MB: some 0.5 s at the rate
    out, dest = dest_in(tmp_path)
    mark = nginx.log.mark()
    proc, report = get(nginx.url + "json/", dest, tmp_path / "report.json", "--api", "index",
                       "-w", "1", "-c", "1", "--limit-rate", "2m", "--include", chosen,
                       "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["files_ok"] == len(expected)
    assert_exactly(dest, expected)
    only_dest(out)
    bodies = sorted((at, size) for at, target, size in nginx.log.timed()[mark:]
                    if not target.endswith("/"))
    assert len(bodies) == len(expected)
    overall = sum(size for _, size in bodies[1:]) / (bodies[-1][0] - bodies[0][0])
    assert overall <= 1.5 * rate, f"{overall / rate:.2f} x the rate"
    assert overall >= 0.5 * rate, f"{overall / rate:.2f} x the rate"


# -- 4. a subdirectory refused (403) and one gone (404) --------------------------------------
@pytest.mark.nginx
def test_refused_subdirectories_are_failures_and_the_crawl_goes_on(
        nginx: Served, tree: Tree, tmp_path: Path) -> None:
    out, dest = dest_in(tmp_path)
    mark = nginx.log.mark()
    proc, report = get(nginx.url + "refuse/", dest, tmp_path / "report.json")
    assert proc.returncode == 1, proc.stderr[-3000:]

    expected = {rel: data for rel, data in tree.files.items()
                if not rel.startswith((FORBIDDEN, GONE))}
    assert len(expected) < len(tree.files) - 20
    assert_exactly(dest, expected)
    only_dest(out)
    assert report["files_ok"] == len(expected)
    reasons = {failure["name"]: failure["reason"] for failure in report["failures"]}
    assert set(reasons) == {FORBIDDEN, GONE}, report["failures"]
    assert "403" in reasons[FORBIDDEN] and "404" in reasons[GONE], reasons
    assert FORBIDDEN in proc.stderr and GONE in proc.stderr, proc.stderr[-3000:]

    requests = nginx.log.since(mark)
    assert_stayed_under(requests, "/refuse/")
    statuses = {unquote(t)[len("/refuse/"):]: s for s, t in requests if t.endswith("/")}
    assert statuses[FORBIDDEN] == 403 and statuses[GONE] == 404
    assert not [d for d in statuses if d.startswith(GONE) and d != GONE]


# -- 5. --include, --exclude, --max-depth -----------------------------------------------------
FILTERS: dict[str, tuple[tuple[str, ...], Callable[[str], bool], int | None]] = {
    "include-exclude": (("--include", "*.txt", "--exclude", "deep/*"),
                        lambda rel: fnmatch.fnmatchcase(rel, "*.txt")
                        and not fnmatch.fnmatchcase(rel, "deep/*"), None),
    "two-includes": (("--include", "data/d0[0-2]/*", "--include", "*#*"),
                     lambda rel: fnmatch.fnmatchcase(rel, "data/d0[0-2]/*") or "#" in rel,
                     None),
    "max-depth-0": (("--max-depth", "0"), lambda rel: "/" not in rel, 0),
    "max-depth-1": (("--max-depth", "1"), lambda rel: rel.count("/") <= 1, 1),
}


@pytest.mark.nginx
@pytest.mark.parametrize("case", FILTERS, ids=FILTERS.keys())
def test_filters_and_depth_take_exactly_the_expected_files(
        case: str, nginx: Served, tree: Tree, tmp_path: Path) -> None:
    flags, taken, max_depth = FILTERS[case]
    expected = {rel: data for rel, data in tree.files.items() if taken(rel)}
    assert 0 < len(expected) < len(tree.files)
    out, dest = dest_in(tmp_path)
    mark = nginx.log.mark()
    proc, report = get(nginx.url + "html/", dest, tmp_path / "report.json", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["files_ok"] == len(expected) and report["files_failed"] == 0
    assert_exactly(dest, expected)
    only_dest(out)
    requests = nginx.log.since(mark)
    assert_stayed_under(requests, "/html/")
    assert fetched_files(requests, "/html/") == set(expected)
    listed = set(listed_dirs(requests, "/html/"))
    if max_depth is None:
        assert listed == tree.dirs
    else:
        assert listed == {d for d in tree.dirs if d.count("/") <= max_depth}


# -- 6. ls and ls -l -------------------------------------------------------------------------
@pytest.mark.nginx
def test_ls_names_every_file_and_ls_long_its_exact_size(nginx: Served, tree: Tree) -> None:
    url = nginx.url + "json/"
    names = cli("ls", url, timeout=60)
    assert names.returncode == 0, names.stderr[-2000:]
    lines = names.stdout.splitlines()
    assert sorted(lines) == sorted(tree.files)

    long = cli("ls", "-l", url, timeout=60)
    assert long.returncode == 0, long.stderr[-2000:]
    sizes = {}
    for line in long.stdout.splitlines():
        size, _, name = line.partition("\t")
        assert name not in sizes, name
        sizes[name] = int(size)
    assert sizes == {rel: len(data) for rel, data in tree.files.items()}


# -- 7. the reference server's listings with faults -----------------------------------------
FILES = 300
SIZE = "uniform:0:3000"
_LINE = re.compile(r'<a href="(?P<href>[^"]+)">[^<]*</a>\s+\S+ \S+\s+(?P<size>\d+|-)\s*$',
                   re.MULTILINE)


def _reference_files(seed: int = 0) -> dict[str, bytes]:
    """The reference server's tree under /archive/ (50 to a directory): path -> body."""
    dataset = SyntheticDataSet(FILES, 1000, seed, parse_size_spec(SIZE))
    return {f"d{i // 50:03d}/{dataset.name(i)}": dataset.body(i) for i in range(FILES)}


def _listed_sizes(url: str) -> dict[str, int]:
    """Each file's size as the HTML listings state it (read here with a regex, not with
    the crawler's parser)."""
    import urllib.request

    sizes: dict[str, int] = {}
    with urllib.request.urlopen(url, timeout=10) as answer:
        top = answer.read().decode()
    for match in _LINE.finditer(top):
        directory = match["href"]
        if directory == "../" or not directory.endswith("/"):
            continue
        with urllib.request.urlopen(url + directory, timeout=10) as answer:
            page = answer.read().decode()
        for entry in _LINE.finditer(page):
            if entry["href"] != "../":
                sizes[directory + entry["href"]] = int(entry["size"])
    return sizes


def test_stale_listed_sizes_fail_as_changed_and_the_rest_arrive(
        reference_server: Callable[..., ReferenceServer], tmp_path: Path) -> None:
    server = reference_server("--shape", "index", "--files", str(FILES), "--file-size", SIZE,
                              "--stale-rate", "0.05")
    url = f"{server.url}/archive/"
    files = _reference_files()
    listed = _listed_sizes(url)
    assert set(listed) == set(files)
    misstated = {rel for rel, data in files.items() if listed[rel] != len(data)}
    assert 0 < len(misstated) < FILES // 10, len(misstated)

    out, dest = dest_in(tmp_path)
    proc, report = get(url, dest, tmp_path / "report.json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert NOTICE.format(url=url) in proc.stderr
    reasons = {failure["name"]: failure["reason"] for failure in report["failures"]}
    assert set(reasons) == misstated, sorted(set(reasons) ^ misstated)
    assert all("changed since it was listed" in reason for reason in reasons.values()), reasons
    assert report["files_ok"] == FILES - len(misstated)
    assert_exactly(dest, {rel: data for rel, data in files.items() if rel not in misstated})
    only_dest(out)


def test_failing_and_reset_answers_are_retried_into_every_file(
        reference_server: Callable[..., ReferenceServer], tmp_path: Path) -> None:
    # seed 8: listing pages meet both faults too (faults are decided by seed, target and
    # attempt, so the same ones every time)
    server = reference_server("--shape", "index-json", "--files", str(FILES), "--file-size",
                              SIZE, "--fail-rate", "0.2", "--reset-rate", "0.05",
                              "--seed", "8", access_log=True)
    out, dest = dest_in(tmp_path)
    proc, report = get(f"{server.url}/archive/", dest, tmp_path / "report.json",
                       "--api", "index", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["files_ok"] == FILES and report["files_failed"] == 0
    assert report["retries"] > 0
    assert_exactly(dest, _reference_files(seed=8))
    assert_state_clean(dest)
    only_dest(out)
    faults = [r for r in server.requests() if r.fault != "none"]
    assert {r.fault for r in faults if r.target.endswith("/")} == {"fail", "reset"}, faults
    assert {r.fault for r in faults if not r.target.endswith("/")} == {"fail", "reset"}


# -- 8. usage errors -------------------------------------------------------------------------
def test_usage_errors_name_the_flag_and_write_nothing(
        reference_server: Callable[..., ReferenceServer], tmp_path: Path) -> None:
    server = reference_server("--files", "10")
    urls = tmp_path / "list.txt"
    urls.write_text(f"{server.url}/get/f0000000000\n")
    out, dest = dest_in(tmp_path)

    from_file = cli("get", "--api", "index", "--from-file", str(urls), str(dest), timeout=60)
    assert from_file.returncode == 2, from_file.stderr
    assert "--api index" in from_file.stderr and "Traceback" not in from_file.stderr
    assert not dest.exists()

    depth = cli("get", "--max-depth", "2", f"{server.url}/", str(dest), timeout=60)
    assert depth.returncode == 2, depth.stderr
    assert "--max-depth" in depth.stderr and "Traceback" not in depth.stderr
    assert not dest.exists()
    assert os.listdir(out) == []


# -- 9. --sync after the server added, changed and removed files --------------------------------
@pytest.mark.nginx
def test_sync_fetches_only_what_was_added_or_changed_and_deletes_what_went(
        nginx: Served, tree: Tree, tmp_path: Path) -> None:
    rng = random.Random(49)
    root = tree.mutable
    files = {f"{directory}/file {index}.dat": rng.randbytes(rng.randint(1, 4000))
             for directory in ("a", "a/b", "c") for index in range(20)}
    hour_ago = time.time() - 3600  # the listing's times are whole minutes: well before
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.utime(root / rel, (hour_ago, hour_ago))
    out, dest = dest_in(tmp_path)
    proc, report = get(nginx.url + "sync/", dest, tmp_path / "first.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_exactly(dest, files)

    time.sleep(1.1)  # the changes come after DEST stored the files, by the server's clock
    files["a/file 0.dat"] += b" and more"  # another size
    same_size = "a/b/file 3.dat"
    files[same_size] = bytes(reversed(files[same_size]))  # the same size, a new time
    files["c/new one.txt"] = b"added\n"
    for rel in ("a/file 0.dat", same_size, "c/new one.txt"):
        (root / rel).write_bytes(files[rel])
    (root / "c" / "file 7.dat").unlink()
    del files["c/file 7.dat"]
    mark = nginx.log.mark()
    proc, report = get(nginx.url + "sync/", dest, tmp_path / "sync.json", "--sync", "--delete")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_exactly(dest, files)
    only_dest(out)
    fetched = sorted(unquote(target)[len("/sync/"):] for _, target in nginx.log.since(mark)
                     if not target.endswith("/"))
    assert fetched == sorted(["a/file 0.dat", same_size, "c/new one.txt"])
    assert report["unchanged"] == len(files) - 3 and report["deleted"] == 1, report


# -- 10. checksum files: a directory's own, one above naming files below, sidecars ----------------
@pytest.mark.nginx
def test_checksum_files_above_and_beside_check_each_file_and_a_mismatch_fails_it(
        nginx: Served, tree: Tree, tmp_path: Path) -> None:
    root = tree.mutable.parent / "sums"
    rng = random.Random(48)
    files = {rel: rng.randbytes(rng.randint(1, 5000))
             for rel in ("x/a.bin", "x/b.bin", "x/c.bin", "x/d.bin", "y/e.bin", "y/f.bin")}
    sha, md5 = (lambda b: hashlib.sha256(b).hexdigest()), (lambda b: hashlib.md5(b).hexdigest())
    files["SHA256SUMS"] = (f"{sha(files['x/a.bin'])}  x/a.bin\n"  # in a directory below
                           f"{sha(b'not b')}  ./x/b.bin\n").encode()
    files["x/c.bin.sha256"] = f"{sha(files['x/c.bin'])}  c.bin\n".encode()  # as sha256sum
    files["x/d.bin.md5"] = f"{md5(b'not d')}\n".encode()  # the hex alone
    files["y/MD5SUMS"] = f"{md5(files['y/e.bin'])}  e.bin\n".encode()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    out, dest = dest_in(tmp_path)
    proc, report = get(nginx.url + "sums/", dest, tmp_path / "r.json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = {f["name"]: f["reason"] for f in report["failures"]}
    assert set(failed) == {"x/b.bin", "x/d.bin"}, failed
    assert "SHA-256 is not the one" in failed["x/b.bin"], failed
    assert "MD5 is not the one" in failed["x/d.bin"], failed
    good = {rel: data for rel, data in files.items() if rel not in failed}
    assert_exactly(dest, good)  # the two that failed their checks are not stored
    only_dest(out)
    # a and c by SHA-256 (from above, from a sidecar), e by MD5, and by size alone f and the
    # four checksum files
    assert report["checked"] == {"md5": 1, "digest": 2, "size_only": 5}, report["checked"]


# -- 11. a tree behind request headers -------------------------------------------------------------
@pytest.mark.nginx
@pytest.mark.parametrize("as_index", [True, False], ids=["--api index", "found by its answer"])
def test_request_headers_open_a_tree_and_never_follow_a_redirect_elsewhere(
        nginx: Served, tree: Tree, tmp_path: Path, as_index: bool) -> None:
    url = nginx.url + "keyed/"
    out, dest = dest_in(tmp_path)
    flags = ["--api", "index"] if as_index else []
    refused = subprocess.run(command(url, dest, *flags), capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "credentials" in refused.stderr and not dest.exists()
    proc, report = get(url, dest, tmp_path / "r.json", *flags, "--header",
                       f"X-Api-Key: {API_KEY}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["files_ok"] == len(KEYED)
    assert_exactly(dest, KEYED)  # away.bin too, from the other host, by the engine's hop
    only_dest(out)
    assert API_KEY not in proc.stderr + proc.stdout + (tmp_path / "r.json").read_text()
    if not as_index:
        assert NOTICE.format(url=url).split(":")[0] in proc.stderr
    sent = (Path(nginx.log.path).parent / "elsewhere.log").read_text().splitlines()
    assert sent and all(line.endswith("key=-") for line in sent), sent  # never the key


@pytest.mark.nginx
def test_ls_lists_a_tree_behind_request_headers(nginx: Served, tree: Tree,
                                                tmp_path: Path) -> None:
    url = nginx.url + "keyed/"
    refused = cli("ls", url)
    assert refused.returncode != 0 and "credentials" in refused.stderr, refused.stderr
    key_file = tmp_path / "key"
    key_file.write_text(f"X-Api-Key: {API_KEY}\n")
    listed = cli("ls", url, "--header-file", str(key_file))
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.splitlines()) == sorted(KEYED)
    assert API_KEY not in listed.stdout + listed.stderr
    wrong = cli("ls", str(tmp_path), "--header", "X-Api-Key: x")
    assert wrong.returncode == 2 and "--header" in wrong.stderr, wrong.stderr
