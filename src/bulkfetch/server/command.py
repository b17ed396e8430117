"""`bulkfetch serve`: flags -> ServeOptions -> run. Only click is imported here; the server's
modules load when the command runs."""

from __future__ import annotations

import errno
import os
import shlex
import sys

import click

from bulkfetch.errors import NOT_WRITABLE_ERRNOS, UsageError

MAX_RPS = 10_000_000  # as server.limits.MAX_RPS (not imported: the server loads when it runs)
MAX_EPOCH = 1000  # as server.dataset.MAX_EPOCH, for the same reason

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# As server.shapes.SHAPES (not imported: the server loads when it runs)
SHAPE_CHOICES = ("seed", "gcs", "link", "drf", "hf-tree", "index", "index-json")


def _rate(name: str, help_text: str):  # type: ignore[no-untyped-def]
    return click.option(name, type=click.FloatRange(0, 1), default=0.0, show_default=True,
                        metavar="P", help=help_text)


@click.command(context_settings=CONTEXT)
@click.option("--files", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Number of synthetic files (any size: nothing is stored, so 10^10 is fine).")
@click.option("--page-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Names per list page.")
@click.option("--file-size", default="100", show_default=True, metavar="SPEC",
              help="Bytes per file: N, 'uniform:MIN:MAX' or 'lognormal:MEDIAN:SIGMA:MAX' "
                   "(k/m/g suffixes allowed).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of names, bodies and faults: same seed, same data, same faults.")
@click.option("--nested", is_flag=True, help="Names with subdirectories, e.g. 07/42/f0000074213.")
@click.option("--root", type=click.Path(exists=True, file_okay=False), default=None,
              help="Serve the real files under this directory instead of synthetic ones.")
@click.option("--no-total", is_flag=True, help="Leave out the X-Total-Files header on list pages.")
@_rate("--fail-rate", "Answer this share of requests with 500, or 503 with Retry-After "
                      "(seconds or HTTP-date, as --retry-after says).")
@_rate("--throttle-rate", "Answer this share with 429 and Retry-After (seconds or HTTP-date).")
@click.option("--retry-after", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="SECONDS",
              help="Retry-After sent with --fail-rate's 503 and --throttle-rate's 429 answers; "
                   "any size (1000000000 too): the HTTP-date form stops at the year 9999. A "
                   "client like bulkfetch pauses the whole host that long on each one, so a "
                   "random share of them with SECONDS > 0 slows every client down.")
@click.option("--latency", default=None, metavar="MS|MIN-MAX",
              help="Delay every answer by MS milliseconds, or uniformly MIN-MAX.")
@_rate("--truncate-rate", "Announce the full length but close the connection mid-body.")
@_rate("--corrupt-rate", "Send the right length with wrong bytes (the ETag no longer matches).")
@_rate("--reset-rate", "Reset the connection (TCP RST) instead of answering.")
@_rate("--stall-rate", "Read the request and never answer.")
@_rate("--trickle-rate", "Send the head (full Content-Length) at once, then the body one byte "
                         "every --trickle-interval; stops when the client goes away.")
@click.option("--trickle-interval", type=click.FloatRange(min=0.001), default=1.0,
              show_default=True, metavar="SECONDS", help="Pause between trickled body bytes.")
@_rate("--overlong-rate", "Send the Content-Length bytes, then 64 garbage bytes past them, "
                          "then close the connection.")
@_rate("--redirect-rate", "Answer 302 to the place --redirect-to picks (per request).")
@click.option("--redirect-to", default="all", show_default=True, metavar="KIND[,KIND...]",
              help="Redirect kinds to pick from: other-host (same target on "
                   "http://localhost:PORT), file (file:///etc/passwd), loop (the same target, "
                   "for ever after), relative (same target plus redirected=1). Requests "
                   "with Host localhost:PORT or redirected=1 are not redirected again, "
                   "except by loop.")
@_rate("--encoding-rate", "Answer file GETs with 'Content-Encoding: gzip, gzip' over a gzip "
                          "bomb: ~2.5 KB sent, 1 GiB of zeros decoded (ETag: MD5 of the bytes "
                          "sent).")
@click.option("--deny-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              metavar="P",
              help="Deny this share of file NAMES, every attempt alike, with 400, 401, 403, "
                   "404 or 410 (by name). Not part of the per-request rates' sum of at most 1.")
@click.option("--stale-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              metavar="P",
              help="With --s3 or --shape: for this share of NAMES, listings state another "
                   "ETag or digest (half of them another size too) than GETs serve, as if "
                   "each object changed after it was listed. Not part of the per-request "
                   "rates' sum.")
@click.option("--lie-md5", "lie_md5", multiple=True, metavar="NAME",
              help="With --s3 or --shape (repeatable): the listing states another MD5 (and "
                   "SHA-256, or S3 ETag) of the file NAME than its GET serves, size right, "
                   "so a client that checks the listing fails exactly that file.")
@click.option("--huge-page", type=click.IntRange(min=1), default=None, metavar="N",
              help="The first list page holds the first N names (at most --files), streamed; "
                   "later pages hold --page-size names from there on.")
@click.option("--hostile-names", is_flag=True,
              help="Mix path-traversal, malformed and colliding names into the first page.")
@click.option("--bad-pages", "bad_pages", is_flag=False, flag_value="all", default=None,
              metavar="[KINDS]",
              help="Break pagination: comma list of empty, repeat, content-type, malformed, "
                   "loop (default with no value: all; pages 1, 1, 2, 3 and the last).")
@click.option("--digest-header", is_flag=True,
              help="Send 'Repr-Digest: sha-256=:BASE64:' (RFC 9530) with every file answer "
                   "(GET and HEAD, 200 and 206): the SHA-256 of the whole body, on a 206 too. "
                   "Computed with the ETag's MD5 in one pass and cached.")
@click.option("--bandwidth-per-connection", "bandwidth", default=None, metavar="RATE",
              help="Send each connection's body bytes at no more than RATE bytes/s (k/m/g "
                   "suffixes, binary: 40m); N connections get N x RATE, as splitting a file "
                   "into ranges does against a real server. 0 or unset: no limit.")
@click.option("--ignore-ranges", is_flag=True,
              help="Hostile: answer every ranged GET with 200 and the whole body (no 206, no "
                   "416, If-Range ignored), while still sending 'Accept-Ranges: bytes' to lure "
                   "clients into splitting.")
@click.option("--wrong-content-range", is_flag=True,
              help="Hostile: answer a ranged GET with a 206 of a different range, labelled "
                   "truthfully in Content-Range: the next range of the same length (for one "
                   "that ends the file, the one before it; for the whole file, bytes 1-end). "
                   "A client that does not check Content-Range stores wrong bytes.")
@click.option("--etag-salt", default="", metavar="TEXT",
              help="Mix TEXT into every synthetic file's body, ETag and Last-Modified: restart "
                   "with another TEXT and every file has changed (names and list tokens stay); "
                   "If-Range with an old ETag gets 200 and the new body. Not with --root.")
@click.option("--epoch", type=click.IntRange(1, MAX_EPOCH), default=1, show_default=True,
              metavar="N",
              help="Serve the synthetic files as they are in epoch N: in each epoch 2..N, each "
                   "file changes with probability --mutate-rate, decided by (seed, file, "
                   "epoch), so restarting with a higher N changes a reproducible share of the "
                   "files (body, ETag and Last-Modified; sizes and names stay) and leaves the "
                   "rest byte for byte as they were. Epoch 1 is the unchanged data set. With "
                   "a larger --files too, the new names come after the others, which stay. "
                   "Not with --root.")
@click.option("--mutate-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              metavar="P",
              help="With --epoch: the share of files that change in each epoch after the first. "
                   "A file last changed in epoch V has a new body of the same size, its MD5 as "
                   "ETag and a Last-Modified V-1 days after the original's, so If-None-Match "
                   "and If-Modified-Since both see the change. 0, or --epoch 1: nothing "
                   "changes.")
@click.option("--s3", "s3", is_flag=True,
              help="Also serve the data set as an S3 bucket, path style: ListObjectsV2 and V1 "
                   "(prefix, delimiter, start-after, continuation-token, max-keys, "
                   "encoding-type=url) on GET /BUCKET, GetObject/HeadObject on /BUCKET/KEY, "
                   "S3's XML errors; the fault switches apply. Use it with `bulkfetch get "
                   "s3://BUCKET DEST --endpoint-url http://HOST:PORT`, s5cmd, rclone or boto3.")
@click.option("--s3-bucket", default="bulkfetch", show_default=True, metavar="NAME",
              help="The bucket's name with --s3.")
@click.option("--s3-credentials", default=None, metavar="KEY:SECRET",
              help="With --s3: refuse any S3 request not signed (SigV4, any region) with "
                   "this access key and secret, as a real store does (403 "
                   "SignatureDoesNotMatch, InvalidAccessKeyId, AccessDenied). Unset: "
                   "signatures are not checked.")
@click.option("--s3-session-token", default=None, metavar="TOKEN",
              help="With --s3-credentials: the credentials are temporary, and every request "
                   "must carry this session token (x-amz-security-token, signed), else 403 "
                   "InvalidToken.")
@click.option("--shape", type=click.Choice(SHAPE_CHOICES), default="seed", show_default=True,
              help="List the data set as a real API lists files, beside the seed API (see "
                   "SHAPES above and src/bulkfetch/server/shapes.py): gcs (Cloud Storage "
                   "JSON API), link (GitHub/GitLab Link headers), drf (Django REST "
                   "framework), hf-tree (Hugging Face Hub tree), index and index-json "
                   "(nginx autoindex directory listings, HTML or JSON). Not with --s3.")
@click.option("--index-fanout", type=click.IntRange(2, 100_000), default=50, show_default=True,
              metavar="F",
              help="With --shape index or index-json: at most F entries a directory. File i "
                   "lives in leaf directory i // F; the leaf directories are laid out F to a "
                   "directory in as many dNNN levels as it takes (none for --files <= F, one "
                   "up to F*F, two up to F**3, ...).")
@click.option("--require-bearer", "--bearer-token", "bearer_token", default=None,
              metavar="TOKEN", envvar="BULKFETCH_SERVE_BEARER", show_envvar=True,
              help="Answer every request (listings and files) without 'Authorization: "
                   "Bearer TOKEN' with 401 and a WWW-Authenticate challenge. The access "
                   "log says whether a request carried Authorization, never its value. "
                   "Not with --s3 (see --s3-credentials).")
@click.option("--redirect-files-to", default=None, metavar="http://HOST:PORT",
              help="Answer every file GET and HEAD with 302 to the same path on this "
                   "origin, e.g. a second `bulkfetch serve` with the same data set and "
                   "--shape (and no --require-bearer): whether a client sends its "
                   "credentials to another host shows in that server's access log. "
                   "Listings are answered here. Unlike --redirect-rate's other-host, every "
                   "file and to a real second server. Not with --s3.")
@click.option("--list-latency", default=None, metavar="MS|MIN-MAX",
              help="Delay every list page (seed API and S3) by MS milliseconds, or uniformly "
                   "MIN-MAX, on top of --latency: a store far away, for listing benchmarks.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N requests in flight at once, counted across all server processes "
                   "(from the parsed head until the answer is written; waiting out --latency "
                   "counts). One more is answered at once with 503 and Retry-After: 1 (S3: "
                   "SlowDown), logged as fault 'overload'. Off by default.")
@click.option("--max-rps", type=click.IntRange(1, MAX_RPS), default=None, metavar="N",
              help="At most N requests accepted in any one second, counted across all server "
                   "processes. One more is answered at once with 429 and Retry-After: 1 (S3: "
                   "503 SlowDown), logged as fault 'rate'. Off by default.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on; 0 picks a free one.")
@click.option("--processes", type=click.IntRange(min=1), default=None,
              help="Server processes sharing the port (SO_REUSEPORT). [default: cores]")
@click.option("--access-log", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Log every request to FILE (no value: stderr). Off by default. Fields: "
                   "time pid method target status length fault auth(yes/no) host.")
@click.option("--export-static", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Instead of serving, write the data set as files, pre-rendered list pages "
                   "and an nginx config serving the identical API, then exit.")
def serve(files: int, page_size: int, file_size: str, seed: int, nested: bool,
          root: str | None, no_total: bool, fail_rate: float, throttle_rate: float,
          retry_after: int, latency: str | None, truncate_rate: float, corrupt_rate: float,
          reset_rate: float, stall_rate: float, trickle_rate: float, trickle_interval: float,
          overlong_rate: float, redirect_rate: float, redirect_to: str, encoding_rate: float,
          deny_rate: float, stale_rate: float, huge_page: int | None, hostile_names: bool,
          bad_pages: str | None, digest_header: bool, bandwidth: str | None,
          ignore_ranges: bool, wrong_content_range: bool, etag_salt: str, epoch: int,
          mutate_rate: float, s3: bool,
          s3_bucket: str, s3_credentials: str | None, s3_session_token: str | None,
          lie_md5: tuple[str, ...], shape: str, index_fanout: int,
          bearer_token: str | None,
          redirect_files_to: str | None,
          list_latency: str | None, max_concurrent: int | None, max_rps: int | None, host: str,
          port: int, processes: int | None, access_log: str | None,
          export_static: str | None) -> None:
    """Run the reference file server: GET /list, GET /list?next-marker=TOKEN, GET /get/NAME;
    with --s3, the same files as an S3 bucket too; with --shape, listed as a real API lists.

    The first line on stdout is 'serving http://HOST:PORT ...'; with --s3, the lines after
    it give the bucket's endpoint and the `bulkfetch get` (and with --s3-credentials the
    AWS_* exports) to paste. Stop it with Ctrl-C. It runs on uvloop's event loop when
    installed (pip install 'bulkfetch[serve]'), else on asyncio's own, which serves fewer
    requests a second.

    SHAPES (--shape; the fault switches apply to their list pages and files alike):

    \b
    gcs      Google Cloud Storage JSON API (cloud.google.com/storage/docs/json_api/v1):
             GET /storage/v1/b/bulkfetch/o?pageToken=T&maxResults=N -> {"kind":
             "storage#objects", "items": [{"name", "bucket", "size" (a string),
             "md5Hash" (base64), "etag", "generation", "mediaLink", ...}],
             "nextPageToken"}; bytes at /storage/v1/b/bulkfetch/o/NAME?alt=media and
             /download/storage/v1/b/bulkfetch/o/NAME?alt=media (NAME with '/' as %2F).
    link     GitHub/GitLab pagination (docs.github.com/en/rest/using-the-rest-api/
             using-pagination-in-the-rest-api): GET /files?page=N&per_page=M -> [{"name",
             "path", "size", "digest" ("sha256:HEX"), "md5", "download_url",
             "browser_download_url", ...}], Link: <http://HOST/files?page=N+1&per_page=M>;
             rel="next" (and prev, last, first; absolute URLs); bytes at /raw/NAME.
    drf      Django REST framework pagination (django-rest-framework.org/api-guide/
             pagination): GET /api/files/?page=N, or ?limit=L&offset=O -> {"count", "next"
             (absolute URL or null), "previous", "results": [{"name", "size", "md5",
             "url"}]}; bytes at /media/NAME.
    hf-tree  Hugging Face Hub tree (huggingface_hub's HfApi.list_repo_tree):
             GET /api/models/bulkfetch/synthetic/tree/main?cursor=C -> [{"type": "file",
             "oid", "size", "path", "lfs": {"oid" (SHA-256), "size", "pointerSize"}}],
             Link: <...&cursor=C2>; rel="next"; bytes at
             /bulkfetch/synthetic/resolve/main/PATH (/api/datasets/..., /datasets/... too).
    index    nginx autoindex, HTML (nginx.org/en/docs/http/ngx_http_autoindex_module.html):
             GET /archive/[dNNN/...] -> nginx's <pre> page of '<a href="NAME">NAME</a>
             DATE SIZE' lines (exact sizes, '-' for a directory), '../' first; files at
             /archive/[dNNN/...]NAME; /archive/dNNN is 301 to /archive/dNNN/. At most
             --index-fanout (50) entries a directory: with 50, 2,500 files are
             /archive/dNNN/NAME, 125,000 /archive/dNNN/dNNN/NAME, and so on.
    index-json
             the same tree as nginx's autoindex_format json: [{"name", "type": "file" or
             "directory", "mtime" (RFC 1123), "size" (files)}].
    """
    from bulkfetch.server.faults import FaultConfig, parse_latency, parse_redirect_kinds
    from bulkfetch.server.hostile import BAD_PAGE_KINDS
    from bulkfetch.server.options import ServeOptions
    from bulkfetch.server.runner import is_loopback
    from bulkfetch.server.runner import serve as run_server
    from bulkfetch.util.sizes import parse_bytes, parse_size_spec

    kinds: frozenset[str] = frozenset()
    if bad_pages is not None:
        kinds = frozenset(BAD_PAGE_KINDS) if bad_pages == "all" else frozenset(
            k.strip() for k in bad_pages.split(",") if k.strip())
    try:
        options = ServeOptions(
            files=files,
            page_size=page_size,
            file_size=parse_size_spec(file_size),
            seed=seed,
            nested=nested,
            root=root,
            show_total=not no_total,
            faults=FaultConfig(
                stall_rate=stall_rate,
                reset_rate=reset_rate,
                fail_rate=fail_rate,
                throttle_rate=throttle_rate,
                truncate_rate=truncate_rate,
                corrupt_rate=corrupt_rate,
                trickle_rate=trickle_rate,
                overlong_rate=overlong_rate,
                redirect_rate=redirect_rate,
                encoding_rate=encoding_rate,
                deny_rate=deny_rate,
                stale_rate=stale_rate,
                latency_ms=parse_latency(latency) if latency else (0.0, 0.0),
                retry_after=retry_after,
                trickle_interval=trickle_interval,
                redirect_to=parse_redirect_kinds(redirect_to),
                lie_md5=frozenset(lie_md5),
            ),
            hostile_names=hostile_names,
            bad_pages=kinds,
            huge_page=huge_page,
            host=host,
            port=port,
            processes=processes or os.cpu_count() or 1,
            access_log=access_log,
            digest_header=digest_header,
            bandwidth_per_connection=parse_bytes(bandwidth) if bandwidth else 0,
            ignore_ranges=ignore_ranges,
            wrong_content_range=wrong_content_range,
            etag_salt=etag_salt,
            epoch=epoch,
            mutate_rate=mutate_rate,
            s3_bucket=s3_bucket if s3 else None,
            s3_credentials=s3_credentials,
            s3_session_token=s3_session_token,
            list_latency_ms=parse_latency(list_latency, "--list-latency") if list_latency
            else (0.0, 0.0),
            max_concurrent=max_concurrent,
            max_rps=max_rps,
            shape=shape,
            index_fanout=index_fanout,
            bearer_token=bearer_token,
            redirect_files_to=redirect_files_to,
        )
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None

    if export_static:
        from bulkfetch.server.export import export_static as write_export

        try:
            write_export(options, export_static, progress=True)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
        except OSError as exc:
            message = (f"--export-static {export_static}: cannot write "
                       f"{exc.filename or export_static}: {exc.strerror or exc}")
            if exc.errno in NOT_WRITABLE_ERRNOS:
                raise click.UsageError(message + ": choose a directory you can write to") \
                    from None
            raise click.ClickException(message) from None  # (a full disk: exit 1)
        return
    if not is_loopback(options.host):
        click.echo(f"warning: listening on {options.host}, which is not a loopback address; "
                   "anyone who can reach it can read the data set", err=True)

    def announce(line: str) -> None:
        click.echo(line)  # the first line, which tests and scripts parse
        if options.s3_bucket is not None:
            endpoint = line.split()[1]  # http://HOST:PORT as bound (--port 0: the real port)
            for hint in s3_hints(endpoint, options.s3_bucket, s3_credentials,
                                 s3_session_token):
                click.echo(hint)
        sys.stdout.flush()

    try:
        code = run_server(options, announce)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.UsageError(f"port {options.port} on {options.host} is in use (another "
                                   "server listens there): stop it, or give another --port "
                                   "(0 picks a free one)") from None
        raise click.ClickException(f"cannot listen on {options.host}:{options.port}: "
                                   f"{exc.strerror or exc}") from None
    sys.exit(code)


def s3_hints(endpoint: str, bucket: str, credentials: str | None,
             session_token: str | None) -> list[str]:
    """The lines `serve --s3` prints after its first: where the bucket is and what to paste
    to read it, so a reader never has to work out the endpoint or the AWS variables.
    `credentials` is --s3-credentials (KEY:SECRET, already checked), shown in full: this is
    a test store whose secret the user just typed."""
    where = f"s3: the bucket s3://{bucket} at {endpoint}"
    get = f"bulkfetch get s3://{bucket} DEST --endpoint-url {endpoint}"
    if credentials is None:
        return [f"{where} \N{EM DASH} {get} --no-sign-request"]
    key, _, secret = credentials.partition(":")
    names = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
             "AWS_REGION": "us-east-1"}  # any region signs right here; the AWS tools want one
    if session_token is not None:
        names["AWS_SESSION_TOKEN"] = session_token
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in names.items())
    return [f"{where}, signed requests only; paste into the shell that runs bulkfetch:",
            f"export {exports}",
            get]
