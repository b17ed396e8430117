"""The sources under contract, each built the way `bulkfetch get` builds it (make_source() of
the GetOptions the CLI would pass), over real inputs: the reference server's seed API and
S3 bucket, URL lists and tables on disk, and (when its tools are installed) a registry's
blobs. Each case also knows what its listing must hold: name -> the body's size and MD5,
from the synthetic data set's formula, never from what the source says."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bulkfetch.config import (
    ApiShape,
    CrawlOptions,
    GetOptions,
    RequestAuth,
    S3Options,
    TableOptions,
)
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.hostile import (
    COLLISION_NAMES,
    MALFORMED_NAMES,
    TRAVERSAL_NAMES,
    HostileNames,
    hostile_body,
)
from bulkfetch.sources import Source, make_source
from bulkfetch.util.sizes import parse_size_spec

# The data set every listing case serves: more files than one page of any source (1000
# rows, lines or keys, the seed API's 250 names), nested names, sizes from 0 bytes up.
FILES = 1200
SEED_PAGE_SIZE = 250
SEED = 7
FILE_SIZES = "uniform:0:3000"
BUCKET = "bulkfetch"
REGION = "us-east-1"
ACCESS_KEY = "contract-access"
SECRET_KEY = "contract-secret-Zq81Fw"  # test credentials: describe() must never show them
SESSION_TOKEN = "contract-session-token-Kp20Lm"
URL_USER, URL_PASSWORD = "contract-user", "contract-password-Xy55"

# What a hostile listing's server serves: the synthetic set with --hostile-names.
HOSTILE_FILES = 5


@dataclass(frozen=True)
class Body:
    """What a listed name must fetch: `size` and `md5` of the bytes, or a JSON object
    (a table's --save-cols data, compared parsed: key order and spacing are the source's)."""

    size: int | None = None
    md5: str | None = None
    json: object = None

    @classmethod
    def of(cls, data: bytes) -> Body:
        return cls(len(data), hashlib.md5(data).hexdigest())


@dataclass
class SourceCase:
    """One implementation under the listing contract."""

    id: str
    options: GetOptions
    expected: dict[str, Body]  # every name the whole listing must resolve to
    min_pages: int = 2
    secrets: tuple[str, ...] = ()  # text describe() must never show
    # the process environment the source is built in (S3: credentials, no ~/.aws)
    environment: Callable[[], contextlib.AbstractContextManager[object]] = \
        contextlib.nullcontext

    def make(self, listing: bool = True) -> Source:
        """A new source; listing=False: a worker's, which only resolves items."""
        with self.environment():
            return make_source(self.options, listing=listing)


@dataclass
class HostileCase:
    """One implementation fed unsafe names the way that source naturally carries them."""

    id: str
    options: GetOptions
    bodies: dict[str, bytes]  # name -> body, for safe names whose bytes are known
    min_refused: int  # at least this many listed items must be refused (the attack arrived)
    unlisted: tuple[str, ...] = ()  # items resolve() is given without a listing (OCI)
    environment: Callable[[], contextlib.AbstractContextManager[object]] = \
        contextlib.nullcontext

    def make(self) -> Source:
        with self.environment():
            return make_source(self.options)


def signer_of(source: Source) -> Callable[[str], list[str]] | None:
    """url -> the headers a GET of it needs, for sources that sign requests (S3, a registry)."""
    return source.abilities().request_headers


# -- the data set ---------------------------------------------------------------------------
def data_set() -> SyntheticDataSet:
    return SyntheticDataSet(FILES, SEED_PAGE_SIZE, SEED, parse_size_spec(FILE_SIZES), nested=True)


def data_server_args() -> tuple[str, ...]:
    return ("--files", str(FILES), "--page-size", str(SEED_PAGE_SIZE), "--seed", str(SEED),
            "--file-size", FILE_SIZES, "--nested", "--s3", "--s3-bucket", BUCKET,
            "--s3-credentials", f"{ACCESS_KEY}:{SECRET_KEY}",
            "--s3-session-token", SESSION_TOKEN)


def index_server_args() -> tuple[str, ...]:
    """The data set (flat names) as nginx's directory listings under /archive/, 50 files a
    directory (server/index_shape.py)."""
    return ("--files", str(FILES), "--page-size", str(SEED_PAGE_SIZE), "--seed", str(SEED),
            "--file-size", FILE_SIZES, "--shape", "index")


def hostile_server_args() -> tuple[str, ...]:
    return ("--files", str(HOSTILE_FILES), "--hostile-names", "--s3", "--s3-bucket", BUCKET)


def served_bodies(dataset: SyntheticDataSet) -> dict[str, Body]:
    """name -> Body of every file the data set serves."""
    return {dataset.name(i): Body.of(dataset.body(i)) for i in range(dataset.files)}


def hostile_bodies() -> dict[str, bytes]:
    """What the --hostile-names server serves: its good files and its attack names."""
    inner = SyntheticDataSet(HOSTILE_FILES, 1000, 0, parse_size_spec("100"))
    bodies = {inner.name(i): inner.body(i) for i in range(HOSTILE_FILES)}
    for name in HostileNames(inner).extra:
        bodies.setdefault(name, hostile_body(name))
    return bodies


@contextlib.contextmanager
def aws_environment(home: Path, access_key: str | None = None, secret_key: str | None = None,
                    session_token: str | None = None) -> Iterator[None]:
    """The environment the AWS tools (and resolve_settings) read, holding only these keys:
    no profile, no ~/.aws of the machine running the tests."""
    wanted = {"HOME": str(home), "AWS_CONFIG_FILE": os.devnull,
              "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
    if access_key is not None and secret_key is not None:
        wanted |= {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    if session_token is not None:
        wanted["AWS_SESSION_TOKEN"] = session_token
    dropped = [name for name in os.environ if name.startswith("AWS_") and name not in wanted]
    saved = {name: os.environ.get(name) for name in [*wanted, *dropped]}
    try:
        for name in dropped:
            del os.environ[name]
        os.environ.update(wanted)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- listing cases ----------------------------------------------------------------------------
def fileserver_case(server_url: str, dest: Path) -> SourceCase:
    # Credentials in the URL are sent to the server (it ignores them) and must never be shown.
    with_user = server_url.replace("http://", f"http://{URL_USER}:{URL_PASSWORD}@", 1)
    dataset = data_set()
    return SourceCase("fileserver", GetOptions(source=with_user, dest=str(dest)),
                      served_bodies(dataset), min_pages=-(-FILES // SEED_PAGE_SIZE),
                      secrets=(URL_PASSWORD,))


def index_case(server_url: str, dest: Path) -> SourceCase:
    """A web server's directory tree, crawled (sources/crawl.py): file i in d{i // 50}/."""
    dataset = SyntheticDataSet(FILES, SEED_PAGE_SIZE, SEED, parse_size_spec(FILE_SIZES))
    expected = {f"d{i // 50:03d}/{dataset.name(i)}": Body.of(dataset.body(i))
                for i in range(FILES)}
    return SourceCase("index", GetOptions(source=f"{server_url}/archive/", dest=str(dest),
                                          crawl=CrawlOptions()),
                      expected, min_pages=1 + -(-FILES // 50))


# The seed API read by the generic JSON source (sources/jsonapi.py), as `get --items
# FileNames --next NextMarker --next-param next-marker --list-path /list` reads it, sending
# a header (the server ignores it) that describe() must never show.
JSON_HEADER_VALUE = "contract-header-secret-Qw73"


def jsonapi_options(server_url: str, dest: Path) -> GetOptions:
    return GetOptions(source=server_url, dest=str(dest),
                      api=ApiShape(items="FileNames", next="NextMarker",
                                   next_param="next-marker"),
                      auth=RequestAuth((("X-Contract", JSON_HEADER_VALUE),)))


def jsonapi_case(server_url: str, dest: Path) -> SourceCase:
    return SourceCase("jsonapi", jsonapi_options(server_url, dest), served_bodies(data_set()),
                      min_pages=-(-FILES // SEED_PAGE_SIZE), secrets=(JSON_HEADER_VALUE,))


def s3_case(server_url: str, dest: Path, home: Path, prefix: str = "") -> SourceCase:
    """The bucket, signed with temporary credentials (key, secret and session token) from
    the environment, as `bulkfetch get s3://BUCKET[/PREFIX] DEST --endpoint-url URL` runs."""
    expected = served_bodies(data_set())
    if prefix:
        expected = {name.removeprefix(prefix + "/"): body for name, body in expected.items()
                    if name.startswith(prefix + "/")}
    options = GetOptions(source=f"s3://{BUCKET}/{prefix}" if prefix else f"s3://{BUCKET}",
                         dest=str(dest), s3=S3Options(endpoint_url=server_url, region=REGION))
    return SourceCase("s3-prefix" if prefix else "s3", options, expected,
                      min_pages=1 if prefix else -(-FILES // 1000),
                      secrets=(SECRET_KEY, SESSION_TOKEN),
                      environment=lambda: aws_environment(home, ACCESS_KEY, SECRET_KEY,
                                                          SESSION_TOKEN))


def busiest_prefix() -> str:
    """The data set's first directory holding the most files (an S3 prefix with content)."""
    counts: dict[str, int] = {}
    for name in served_bodies(data_set()):
        top = name.split("/", 1)[0]
        counts[top] = counts.get(top, 0) + 1
    return max(sorted(counts), key=counts.__getitem__)


def urllist_case(server_url: str, work: Path, dest: Path) -> SourceCase:
    """One URL a line, with what a hand-written list holds besides: comments, blank lines,
    CRLF endings and spaces around a URL."""
    dataset = data_set()
    path = work / "urls.txt"
    with path.open("w", newline="") as handle:
        handle.write("# the contract's URL list\n\n")
        for i in range(FILES):
            ending = "\r\n" if i % 3 == 0 else "\n"
            padding = "  " if i % 5 == 0 else ""
            handle.write(f"{padding}{server_url}/get/{dataset.name(i)}{padding}{ending}")
            if i % 97 == 0:
                handle.write("   \n# a comment between URLs\n")
    expected = {f"get/{name}": body for name, body in served_bodies(dataset).items()}
    return SourceCase("urllist", GetOptions(source=str(path), dest=str(dest), from_file=True),
                      expected, min_pages=2)


def caption(i: int) -> str:
    return f'row {i}, "quoted", ünïcode\nsecond line' if i % 4 == 0 else f"row {i}"


def csv_case(server_url: str, work: Path, dest: Path) -> SourceCase:
    """A CSV of URLs (and a caption with commas, quotes and newlines); names from the URLs."""
    dataset = data_set()
    path = work / "table.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["caption", "url"])
        for i in range(FILES):
            writer.writerow([caption(i), f"{server_url}/get/{dataset.name(i)}"])
    expected = {f"get/{name}": body for name, body in served_bodies(dataset).items()}
    return SourceCase("csv", GetOptions(source=str(path), dest=str(dest), from_file=True),
                      expected)


def tsv_name(i: int) -> str:
    return f"tsv/{i % 11:02d}/ünï-{i:05d}.bin"


def tsv_case(server_url: str, work: Path, dest: Path) -> SourceCase:
    """A TSV whose --name-col gives non-ASCII names (so no page is plain)."""
    dataset = data_set()
    path = work / "table.tsv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["key", "url"])
        for i in range(FILES):
            writer.writerow([tsv_name(i), f"{server_url}/get/{dataset.name(i)}"])
    expected = {tsv_name(i): Body.of(dataset.body(i)) for i in range(FILES)}
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_col="key"))
    return SourceCase("tsv-name-col", options, expected)


def jsonl_case(server_url: str, work: Path, dest: Path) -> SourceCase:
    """JSONL with --name-template and --save-cols: each row also lists its columns as a
    <key>.json item, a data: URL stored without a transfer."""
    dataset = data_set()
    path = work / "table.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(FILES):
            handle.write(json.dumps({"url": f"{server_url}/get/{dataset.name(i)}",
                                     "caption": caption(i), "n": i}) + "\n")
    expected: dict[str, Body] = {}
    for i in range(FILES):
        expected[f"{i:06d}"] = Body.of(dataset.body(i))
        expected[f"{i:06d}.json"] = Body(json={"caption": caption(i), "n": i})
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_template="{index:06d}{ext}",
                                            save_cols=("caption", "n")))
    return SourceCase("jsonl-template-save-cols", options, expected)


def parquet_name(i: int) -> str:
    return f"pq/{i % 7}/{i:05d}.bin"


def parquet_case(server_url: str, work: Path, dest: Path) -> SourceCase:
    """Parquet in row groups of 400 (a page of 1,000 rows spans three) with --name-col and
    --save-cols."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = data_set()
    path = work / "table.parquet"
    rows = [{"url": f"{server_url}/get/{dataset.name(i)}", "name": parquet_name(i),
             "caption": caption(i)} for i in range(FILES)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=400)
    expected: dict[str, Body] = {}
    for i in range(FILES):
        expected[parquet_name(i)] = Body.of(dataset.body(i))
        expected[parquet_name(i).removesuffix(".bin") + ".json"] = Body(
            json={"caption": caption(i)})
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_col="name", save_cols=("caption",)))
    return SourceCase("parquet-name-col-save-cols", options, expected)


@dataclass
class OciImage:
    """A small image pushed to a real registry, and the blobs a pull of it must fetch."""

    options: GetOptions  # what `bulkfetch pull` hands the engine (pull.engine_options)
    blobs: dict[str, bytes] = field(default_factory=dict)  # blobs/sha256/HEX -> bytes


def oci_case(image: OciImage) -> SourceCase:
    expected = {name: Body.of(data) for name, data in image.blobs.items()}
    return SourceCase("oci", image.options, expected, min_pages=len(expected))


# -- hostile cases ----------------------------------------------------------------------------
# Names a table's name column can hold: every attack the reference server knows, a name
# reaching into bulkfetch's own state, and a NUL that would split "name NUL url" items.
TABLE_ATTACKS = (*TRAVERSAL_NAMES, *MALFORMED_NAMES, *COLLISION_NAMES,
                 ".bulkfetch/journal.sqlite", "x\0http://elsewhere.invalid/get/f0000000000",
                 "a\nb", "ok/../../../../tmp/escape")


def hostile_fileserver(server_url: str, dest: Path) -> HostileCase:
    return HostileCase("fileserver", GetOptions(source=server_url, dest=str(dest)),
                       hostile_bodies(), min_refused=len(TRAVERSAL_NAMES))


def hostile_jsonapi(server_url: str, dest: Path) -> HostileCase:
    return HostileCase("jsonapi", jsonapi_options(server_url, dest), hostile_bodies(),
                       min_refused=len(TRAVERSAL_NAMES))


def hostile_s3(server_url: str, dest: Path, home: Path) -> HostileCase:
    options = GetOptions(source=f"s3://{BUCKET}", dest=str(dest),
                         s3=S3Options(endpoint_url=server_url, region=REGION,
                                      no_sign_request=True))
    return HostileCase("s3", options, hostile_bodies(), min_refused=len(TRAVERSAL_NAMES),
                       environment=lambda: aws_environment(home))


def hostile_urllist(server_url: str, work: Path, dest: Path) -> HostileCase:
    """URLs whose paths decode to unsafe names: encoded dots and slashes, NUL, backslashes,
    overlong UTF-8, full-width dots, bulkfetch's own state, other schemes, and a second
    URL (another host name) giving an earlier line's name."""
    host = server_url.removeprefix("http://")
    lines = [
        f"{server_url}/get/..%2F..%2Fetc%2Fpasswd",
        f"{server_url}/%2e%2e/%2e%2e/escape",
        f"{server_url}/get/../../../escape",
        f"{server_url}/get/nul%00byte",
        f"{server_url}/get/a%5C..%5C..%5Cx",
        f"{server_url}/get/%C0%AE%C0%AE/overlong",
        f"{server_url}/%EF%BC%8E%EF%BC%8E/fullwidth",
        f"{server_url}/.bulkfetch/journal.sqlite",
        f"{server_url}/get/trailing-dot.",
        f"{server_url}/",
        "file:///etc/passwd",
        "ftp://127.0.0.1/get/f0000000000",
        f"{server_url}//etc/passwd",  # an empty first segment: the name is etc/passwd
        f"{server_url}/%2Fetc%2Fpasswd",
        f"{server_url}/get/f0000000001",
        f"http://localhost:{host.rpartition(':')[2]}/get/f0000000001",  # the same name
        f"{server_url}/get/caf%C3%A9",
        f"{server_url}/get/cafe%CC%81",
    ]
    path = work / "hostile-urls.txt"
    path.write_text("\n".join(lines) + "\n")
    bodies = {f"get/{name}": body for name, body in hostile_bodies().items()}
    return HostileCase("urllist", GetOptions(source=str(path), dest=str(dest), from_file=True),
                       bodies, min_refused=12)


def _table_rows(server_url: str) -> tuple[list[dict[str, str]], dict[str, bytes]]:
    """Rows of hostile names (each fetching a good file), plus rows whose URL is not one."""
    inner = SyntheticDataSet(HOSTILE_FILES, 1000, 0, parse_size_spec("100"))
    rows: list[dict[str, str]] = []
    bodies: dict[str, bytes] = {}
    for at, name in enumerate(TABLE_ATTACKS):
        index = at % HOSTILE_FILES
        rows.append({"name": name, "url": f"{server_url}/get/{inner.name(index)}"})
        bodies.setdefault(name, inner.body(index))
    rows += [{"name": "nul-in-url", "url": f"{server_url}/get/{inner.name(0)}\0junk"},
             {"name": "crlf-in-url", "url": f"{server_url}/get/{inner.name(0)}\r\nX-Injected: 1"},
             {"name": "file-scheme", "url": "file:///etc/passwd"},
             {"name": "no-url", "url": ""},
             {"name": "data-url", "url": "data:application/json;base64,e30="},
             {"name": "broken-host", "url": "http://[::1/get/x"}]
    return rows, bodies


def hostile_csv(server_url: str, work: Path, dest: Path) -> HostileCase:
    rows, bodies = _table_rows(server_url)
    path = work / "hostile.csv"
    # surrogateescape: the lone surrogate of a bad-UTF-8 name goes to the file as its byte
    with path.open("w", newline="", encoding="utf-8", errors="surrogateescape") as handle:
        writer = csv.DictWriter(handle, ["name", "url"])
        writer.writeheader()
        writer.writerows(rows)
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_col="name"))
    return HostileCase("csv-name-col", options, bodies, min_refused=len(TRAVERSAL_NAMES) + 4)


def hostile_jsonl(server_url: str, work: Path, dest: Path) -> HostileCase:
    rows, bodies = _table_rows(server_url)
    path = work / "hostile.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows)
                    + "[1, 2]\nnot json\n")
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_col="name", save_cols=("url",)))
    return HostileCase("jsonl-name-col", options, bodies, min_refused=len(TRAVERSAL_NAMES) + 6)


def hostile_parquet(server_url: str, work: Path, dest: Path) -> HostileCase:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, bodies = _table_rows(server_url)
    # Arrow strings are UTF-8: a lone surrogate cannot be stored at all
    rows = [row for row in rows if not any("\udc80" <= c <= "\udcff" for c in row["name"])]
    path = work / "hostile.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    options = GetOptions(source=str(path), dest=str(dest), from_file=True,
                         table=TableOptions(name_col="name"))
    return HostileCase("parquet-name-col", options, bodies,
                       min_refused=len(TRAVERSAL_NAMES) + 3)


def hostile_oci(image: OciImage) -> HostileCase:
    """A pull lists only the blobs its manifests name (their digests are checked by
    oci/reference.py first), so the way in is an item that is not one of them."""
    unlisted = ("../x", "/etc/passwd", "blobs/sha256/../../../x", "blobs/sha256/" + "0" * 64,
                "", "nul\0byte")
    return HostileCase("oci", image.options, dict(image.blobs), min_refused=len(unlisted),
                       unlisted=unlisted)
