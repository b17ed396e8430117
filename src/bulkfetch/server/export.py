"""`bulkfetch serve --export-static DIR`: the synthetic data set as plain files, pre-rendered
list pages and an nginx config that answers the seed API byte-for-byte like `bulkfetch serve`.

nginx serves static bytes much faster than the Python server, so benchmarks can measure the
client rather than the server. What DIR holds:

    files/<name>          every body, with mtime = the data set's Last-Modified
    pages/first           the first list page
    pages/next/<token>    the page each NextMarker token addresses (tokens are base64url)
    etags.map             nginx map $uri -> quoted MD5; nginx cannot hash, and a name missing
                          from the map is answered 404 like an unknown name
    modified.map          nginx map entries $uri -> Last-Modified of a 304 (one nginx makes
                          itself carries only headers added to it), for each file that
                          --epoch/--mutate-rate changed; the rest have the data set's,
                          the map's default in nginx.conf
    nginx.conf            run with: nginx -c DIR/nginx.conf -g 'daemon off;'
    run/                  pid, error log and nginx's temp directories

With --s3 the config serves the bucket too: GET/HEAD /BUCKET/KEY from files/ (with the same
ETags), and the listing (GET /BUCKET?list-type=2...) passed to a live `bulkfetch serve --s3`
on a second port, whose command the export prints: a listing can start after any key, so it
cannot be pre-rendered.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bulkfetch.errors import UsageError
from bulkfetch.server.app import BAD_TOKEN_BODY, NOT_FOUND_BODY, http_date, render_page
from bulkfetch.server.dataset import Entry, SyntheticDataSet
from bulkfetch.server.options import ServeOptions
from bulkfetch.server.tokens import TokenCodec
from bulkfetch.util.ports import free_port

MARKER = ".bulkfetch-export"  # lets a later export replace this one, and nothing else
GET_PREFIX = "/get/"
# nginx map hash: each bucket has room for this many names, and there are as many buckets as
# names, so no bucket overflows and nginx builds the hash on its first try.
_NAMES_PER_BUCKET = 16
_CACHE_LINE = 64


@dataclass(frozen=True)
class ExportSummary:
    files: int
    pages: int
    bytes: int
    port: int
    config: str
    list_port: int | None = None  # with --s3: where the live server for listings must run
    list_command: str = ""  # ... started by this command


def export_static(options: ServeOptions, directory: str, progress: bool = False) -> ExportSummary:
    """Write the data set of `options` under `directory` with an nginx config serving it on
    options.host:options.port (port 0: a port free right now). With `progress`, report
    progress on stderr and, at the end, how to run nginx on stdout."""
    _refuse_dynamic_behaviour(options)
    dataset = SyntheticDataSet(options.files, options.page_size, options.seed,
                               options.file_size, options.nested, salt=options.etag_salt,
                               epoch=options.epoch, mutate_rate=options.mutate_rate)
    root = _prepare(Path(directory).absolute(), dataset)
    port = options.port or free_port(options.host)
    list_port = None
    if options.s3_bucket is not None:
        list_port = free_port(options.host)
        while list_port == port:
            list_port = free_port(options.host)
    meter = _Meter(options.files, sys.stderr if progress else None)
    with (open(root / "etags.map", "w", encoding="ascii") as etags,
          open(root / "modified.map", "w", encoding="ascii") as modified):
        etags.write("map $uri $bulkfetch_etag {\n    default \"\";\n")
        pages = _write_pages_and_files(dataset, root, etags, modified, meter)
        etags.write("}\n")
    config = root / "nginx.conf"
    config.write_text(_nginx_conf(root, options, dataset, port, list_port), encoding="utf-8")
    summary = ExportSummary(meter.files, pages, meter.bytes, port, str(config), list_port,
                            _list_command(options, list_port) if list_port else "")
    if progress:
        _announce(summary, options.host, meter.elapsed())
    return summary


def _refuse_dynamic_behaviour(options: ServeOptions) -> None:
    """nginx serves fixed bytes; whatever `bulkfetch serve` decides per request cannot be
    exported."""
    refused = []
    if options.root is not None:
        refused.append("--root")
    if options.hostile_names:
        refused.append("--hostile-names")
    if options.bad_pages:
        refused.append("--bad-pages")
    if options.huge_page is not None:
        refused.append("--huge-page")
    if options.faults.active:
        refused.append("fault injection (--*-rate, --latency, --lie-md5)")
    if options.shape != "seed":
        refused.append(f"--shape {options.shape}")
    if options.bearer_token is not None:
        refused.append("--require-bearer")
    if options.redirect_files_to is not None:
        refused.append("--redirect-files-to")
    if options.digest_header:
        refused.append("--digest-header")
    if options.bandwidth_per_connection:
        refused.append("--bandwidth-per-connection")
    if options.ignore_ranges:
        refused.append("--ignore-ranges")
    if options.wrong_content_range:
        refused.append("--wrong-content-range")
    if options.max_concurrent is not None:
        refused.append("--max-concurrent")
    if options.max_rps is not None:
        refused.append("--max-rps")
    if options.s3_credentials is not None:
        refused.append("--s3-credentials and --s3-session-token (nginx checks no signature)")
    if refused:
        raise UsageError(f"--export-static writes the synthetic data set only; it cannot "
                         f"export {', '.join(refused)}: use the live `bulkfetch serve` for that")


def _prepare(root: Path, dataset: SyntheticDataSet) -> Path:
    """An empty `root`, or an earlier export made ready for this one; anything else is refused
    so an export never deletes files it did not write."""
    if "$" in str(root):
        raise UsageError(f"--export-static {root}: nginx cannot name a path holding '$'")
    if root.exists() and not root.is_dir():
        raise UsageError(f"--export-static {root}: not a directory")
    if root.is_dir() and any(root.iterdir()):
        if not (root / MARKER).is_file():
            raise UsageError(f"--export-static {root}: the directory is not empty and holds no "
                             "earlier export; choose a new or empty directory")
        shutil.rmtree(root / "pages", ignore_errors=True)  # old tokens must be refused
        _remove_stale_files(root / "files", dataset)
    for sub in ("files", "pages/next", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / MARKER).touch()
    return root


def _remove_stale_files(files: Path, dataset: SyntheticDataSet) -> None:
    """Delete the files `dataset` does not name and keep the rest to be overwritten in place:
    ext4 creates files several times slower right after a mass deletion."""
    for directory, _, names in os.walk(files, topdown=False):
        relative = os.path.relpath(directory, files)
        prefix = "" if relative == "." else relative + "/"
        for name in names:
            if dataset.index_of(prefix + name) is None:
                os.unlink(os.path.join(directory, name))
        if relative != "." and not os.listdir(directory):
            os.rmdir(directory)


# -- data -------------------------------------------------------------------------------------
def _write_pages_and_files(
    dataset: SyntheticDataSet, root: Path, etags: TextIO, modified: TextIO, meter: _Meter
) -> int:
    """Walk the listing as a client would, writing each page and the files it names, their
    ETags and (for changed files only: the rest share the map's default) Last-Modified.
    Returns the number of pages."""
    codec = TokenCodec(dataset.identity)
    files_dir = str(root / "files")
    made_dirs = {files_dir}
    pages = 0
    cursor: bytes | None = None
    while True:
        names, following = dataset.page(cursor)
        next_token = None if following is None else codec.encode(following)
        page_path = root / "pages" / ("first" if cursor is None else f"next/{codec.encode(cursor)}")
        page_path.write_bytes(render_page(names, next_token))
        pages += 1
        for name in names:
            entry = dataset.lookup(name)
            assert entry is not None, name  # a listed name always resolves
            path = f"{files_dir}/{name}"
            parent = path.rpartition("/")[0]
            if parent not in made_dirs:
                os.makedirs(parent, exist_ok=True)
                made_dirs.add(parent)
            etag = _write_body(path, entry)
            etags.write(f"    {GET_PREFIX}{name} '{etag}';\n")
            if entry.last_modified != dataset.last_modified:
                modified.write(f"    {GET_PREFIX}{name} '{http_date(entry.last_modified)}';\n")
            meter.advance(entry.size)
        if following is None:
            return pages
        cursor = following


def _write_body(path: str, entry: Entry) -> str:
    """Stream the body to `path` and return its ETag (quoted hex MD5)."""
    digest = hashlib.md5()
    # No O_TRUNC: overwriting an earlier export's blocks is many times faster than freeing
    # and allocating them again; only a longer leftover is cut afterwards.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in entry.read(0, entry.size):
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        if os.fstat(fd).st_size > entry.size:
            os.ftruncate(fd, entry.size)
        os.utime(fd, (entry.last_modified, entry.last_modified))
    finally:
        os.close(fd)
    return '"' + digest.hexdigest() + '"'


class _Meter:
    """Counts files and bytes; with a stream, prints a line at most once a second."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total = total
        self.stream = stream
        self.files = 0
        self.bytes = 0
        self.started = time.monotonic()
        self.next_report = self.started + 1.0

    def advance(self, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.stream is not None and (now := time.monotonic()) >= self.next_report:
            self.next_report = now + 1.0
            share = self.files / self.total if self.total else 1.0
            self.stream.write(f"export: {self.files:,} of {self.total:,} files ({share:.0%}), "
                              f"{_megabytes(self.bytes)}, {self.elapsed():.0f} s\n")
            self.stream.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"


def _announce(summary: ExportSummary, host: str, seconds: float) -> None:
    config = summary.config
    url_host = f"[{host}]" if ":" in host else host
    print(f"exported {summary.files:,} files ({_megabytes(summary.bytes)}) and "
          f"{summary.pages:,} list page{'s' if summary.pages != 1 else ''} in {seconds:.1f} s\n"
          f"nginx config: {config}\n"
          f"run:          nginx -c {shlex.quote(config)} -g 'daemon off;'\n"
          f"serves:       http://{url_host}:{summary.port}/list")
    if summary.list_port is not None:
        print(f"S3 listings:  {summary.list_command}\n"
              f"S3 bucket:    --endpoint-url http://{url_host}:{summary.port} (path style)")


def _list_command(options: ServeOptions, list_port: int) -> str:
    """The `bulkfetch serve --s3` that answers the export's S3 listings."""
    words = ["bulkfetch", "serve", "--s3", "--s3-bucket", str(options.s3_bucket), "--files",
             str(options.files), "--page-size", str(options.page_size), "--file-size",
             options.file_size.spec(), "--seed", str(options.seed)]
    if options.nested:
        words.append("--nested")
    if options.etag_salt:
        words += ["--etag-salt", options.etag_salt]
    if options.epoch > 1 or options.mutate_rate > 0:  # the listing states ETags of the epoch
        words += ["--epoch", str(options.epoch), "--mutate-rate", repr(options.mutate_rate)]
    low, high = options.list_latency_ms
    if high > 0:
        words += ["--list-latency", f"{low:g}" if low == high else f"{low:g}-{high:g}"]
    words += ["--host", options.host, "--port", str(list_port), "--processes", "1"]
    return shlex.join(words)


# -- nginx ------------------------------------------------------------------------------------
def _nginx_string(text: str | bytes) -> str:
    """A single-quoted nginx string. `$` would start a variable, and nginx has no escape
    for it, so it is refused."""
    value = text.decode("utf-8") if isinstance(text, bytes) else text
    if "$" in value:
        raise ValueError(f"nginx cannot quote a literal '$': {value!r}")
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def _map_hash_sizes(dataset: SyntheticDataSet) -> tuple[int, int]:
    """(map_hash_max_size, map_hash_bucket_size) for the ETag map; nginx's element size is
    the key plus a pointer and two bytes, pointer-aligned."""
    longest_key = len(GET_PREFIX) + len(dataset.name(max(dataset.files - 1, 0)))
    element = -(-(8 + longest_key + 2) // 8) * 8
    bucket = -(-(_NAMES_PER_BUCKET * element + 8) // _CACHE_LINE) * _CACHE_LINE
    return max(dataset.files, 1024), bucket


def _listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _s3_locations(bucket: str, host: str, list_port: int) -> tuple[str, str]:
    """(the upstream block, the locations) of the bucket: listings proxied over kept-alive
    connections, objects served as the seed API's /get/ files."""
    upstream = (f"    upstream bulkfetch_s3_list {{\n"
                f"        server {_listen_address(host, list_port)};\n"
                f"        keepalive 64;\n    }}\n")
    locations = f"""
        location = /{bucket} {{
            proxy_pass http://bulkfetch_s3_list;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}

        location /{bucket}/ {{
            rewrite ^/{re.escape(bucket)}/(.*)$ /get/$1 last;
        }}
"""
    return upstream, locations


def _nginx_conf(root: Path, options: ServeOptions, dataset: SyntheticDataSet, port: int,
                list_port: int | None = None) -> str:
    run = root / "run"
    upstream, s3_locations = ("", "") if options.s3_bucket is None or list_port is None \
        else _s3_locations(options.s3_bucket, options.host, list_port)
    max_size, bucket_size = _map_hash_sizes(dataset)
    user = "user root;\n" if os.geteuid() == 0 else ""  # root's tmp dirs are often mode 0700
    total = (f"        add_header X-Total-Files {dataset.total};\n"
             if options.show_total else "")
    temp_paths = "".join(f"    {kind}_temp_path {_nginx_string(str(run / kind))};\n"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""\
# Written by `bulkfetch serve --export-static`: {options.describe()}.
# Run: nginx -c {shlex.quote(str(root / "nginx.conf"))} -g 'daemon off;'
{user}worker_processes 1;
worker_rlimit_nofile 10240;  # room for worker_connections; the usual soft limit is 1024
pid {_nginx_string(str(run / "nginx.pid"))};
lock_file {_nginx_string(str(run / "nginx.lock"))};
error_log {_nginx_string(str(run / "error.log"))} warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    server_tokens off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 100000000;
{temp_paths}
    types {{}}
    default_type application/octet-stream;
    etag off;  # the ETag is the body's MD5, from etags.map
    max_ranges 1;  # several ranges at once: the whole body, as bulkfetch serve answers
    merge_slashes off;  # "/get//x" names "/x", which does not exist

    map_hash_max_size {max_size};
    map_hash_bucket_size {bucket_size};
    include {_nginx_string(str(root / "etags.map"))};
    map $uri $bulkfetch_modified {{
        default {_nginx_string(http_date(dataset.last_modified))};
        include {_nginx_string(str(root / "modified.map"))};
    }}
{upstream}
    # $arg_next-marker cannot be written (the hyphen ends the name), so match the query.
    map $args $bulkfetch_page {{
        "~(?:^|&)next-marker=(?<token>[A-Za-z0-9_-]+)(?:&|$)" /next/$token;
        "~(?:^|&)next-marker(?:[=&]|$)" /forged;  # not base64url: no such page, so 400
        default /first;
    }}

    server {{
        listen {_listen_address(options.host, port)} backlog=4096;
        error_page 404 @not_found;

        location = /list {{
            root {_nginx_string(str(root / "pages"))};
            default_type application/json;
{total}            add_header Last-Modified "";  # list pages are not cacheable files
            if_modified_since off;
            max_ranges 0;
            try_files $bulkfetch_page @bad_token;
        }}

        location /get/ {{
            alias {_nginx_string(str(root / "files") + "/")};
            # Not in the map: not a name of the data set (nested names' directories too).
            if ($bulkfetch_etag = "") {{
                return 404;
            }}
            # nginx tests If-None-Match before add_header sets the ETag, so answer an
            # exact match here.
            if ($http_if_none_match = $bulkfetch_etag) {{
                add_header ETag $bulkfetch_etag always;
                add_header Last-Modified $bulkfetch_modified always;
                return 304;
            }}
            add_header ETag $bulkfetch_etag always;
        }}
{s3_locations}
        location / {{
            return 404;
        }}

        location @not_found {{
            default_type application/json;
            return 404 {_nginx_string(NOT_FOUND_BODY)};
        }}

        location @bad_token {{
            default_type application/json;
            return 400 {_nginx_string(BAD_TOKEN_BODY)};
        }}
    }}
}}
"""
