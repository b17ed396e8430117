"""`bulkfetch pull REF... DEST`: container images into an OCI image layout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bulkfetch.cli.s3_flags import tls_options
from bulkfetch.errors import BulkfetchError, UsageError

if TYPE_CHECKING:
    from bulkfetch.models import Progress
    from bulkfetch.oci.blobs import BlobPlan
    from bulkfetch.oci.pull import PullOptions, PullResult, Resolved

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _say(text: str) -> None:
    click.echo(f"bulkfetch: {text}", err=True)


@click.command(context_settings=CONTEXT)
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@click.argument("dest", metavar="DEST")
@click.option("--platform", default=None, metavar="OS/ARCH[/VARIANT]",
              help="Which image of a multi-platform index to pull. [default: this machine's]")
@click.option("--cache", "cache_dir", default=None, metavar="DIR",
              type=click.Path(file_okay=False),
              help="The blob cache every pull shares: a layer already there is linked (or "
                   "copied) into DEST, never fetched again; new layers are added once "
                   "verified. [default: $XDG_CACHE_HOME/bulkfetch/oci]")
@click.option("--no-cache", is_flag=True, help="Neither read nor fill the blob cache.")
@click.option("--plain-http", is_flag=True,
              help="Speak plain HTTP to the registry (a registry on loopback always is).")
@click.option("--username", default=None, help="Registry user (with --password-stdin). "
              "[default: the Docker config's auths for the registry, else anonymous]")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes fetching blobs.")
@click.option("-c", "--concurrency", type=click.IntRange(min=2), default=64,
              show_default=True,
              help="Connections per worker; a blob being fetched in pieces uses up to "
                   "--parts of them, and blobs take at most half.")
@click.option("--parts", type=click.IntRange(min=1), default=8, show_default=True,
              help="Connections one big layer is fetched over at once.")
@click.option("--split-above", default="16m", show_default=True, metavar="BYTES",
              help="A layer at least this big is fetched in pieces (16 MiB or more each) "
                   "over --parts connections, and a killed pull resumes it byte by byte; a "
                   "smaller one comes in one piece and starts over.")
@click.option("--retries", type=click.IntRange(min=0), default=8, show_default=True,
              help="Retries per blob after the first attempt.")
@click.option("--connect-timeout", type=click.FloatRange(min=0.001), default=10.0,
              show_default=True, metavar="SECONDS")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=30.0, show_default=True,
              metavar="SECONDS", help="Give up on a transfer silent this long.")
@tls_options
@click.option("--unpack", "rootfs", default=None, metavar="ROOTFS",
              type=click.Path(file_okay=False),
              help="Also apply the image's layers in order into this new directory, as a "
                   "container runtime builds a root file system (whiteouts honoured; a "
                   "layer that would write outside ROOTFS is refused).")
@click.option("-q", "--quiet", is_flag=True, help="No progress; errors only.")
@click.option("--plain", is_flag=True, help="Plain status lines even on a terminal.")
def pull(refs: tuple[str, ...], dest: str, platform: str | None, cache_dir: str | None,
         no_cache: bool, plain_http: bool, username: str | None, password_stdin: bool,
         workers: int, concurrency: int, parts: int, split_above: str, retries: int,
         connect_timeout: float, idle_timeout: float, ca_bundle: str | None, insecure: bool,
         rootfs: str | None, quiet: bool, plain: bool) -> None:
    """Pull container images (REF like 127.0.0.1:5000/team/app:v1, registry/repo@sha256:...,
    or a Docker Hub name like alpine:3) into DEST, an OCI image layout that skopeo, umoci
    and podman read (oci:DEST:TAG).

    All layers of all REFs are fetched at once, big ones in ranges over several
    connections, each checked against its manifest's digest and size before it is
    renamed into place. An interrupted pull keeps its partial layers: rerun the same
    command to go on from there. Exit status: 0 pulled, 1 some layers failed, 2 usage
    error (bad reference, refused credentials), 130 interrupted.
    """
    from bulkfetch.config import Limits, RetryPolicy, Timeouts
    from bulkfetch.net.tls import resolve_tls
    from bulkfetch.oci.pull import PullOptions, check_unpack_target
    from bulkfetch.util.sizes import parse_bytes

    try:
        if password_stdin and username is None:
            raise UsageError("--password-stdin needs --username")
        if username is not None and not password_stdin:
            raise UsageError("--username needs --password-stdin (a password on the command "
                             "line would show in the process list)")
        password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
        if no_cache and cache_dir is not None:
            raise UsageError("give --cache DIR or --no-cache, not both")
        if rootfs is not None:
            check_unpack_target(rootfs, refs)
        try:
            split = parse_bytes(split_above)
        except UsageError as exc:
            raise UsageError(f"--split-above: {exc}") from None
        options = PullOptions(
            refs=refs, dest=dest, platform=platform,
            cache_dir="" if no_cache else cache_dir, plain_http=plain_http,
            username=username, password=password,
            limits=Limits(workers=workers, concurrency=concurrency, parts=parts,
                          split_above=split),
            retry=RetryPolicy(retries=retries),
            timeouts=Timeouts(connect_s=connect_timeout, idle_s=idle_timeout),
            tls=resolve_tls(ca_bundle, insecure))
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    if insecure:
        from bulkfetch.net.tls import INSECURE_WARNING

        click.echo(INSECURE_WARNING, err=True)
    sys.exit(_run(options, rootfs, quiet=quiet, plain=plain))


def _run(options: PullOptions, rootfs: str | None, *, quiet: bool, plain: bool) -> int:
    from bulkfetch.cli.pull_display import LayerBoard, Row, make_pull_display
    from bulkfetch.oci.pull import pull

    display = None
    say = (lambda text: None) if quiet else _say

    def on_plan(images: list[Resolved], plan: BlobPlan, result: PullResult) -> None:
        nonlocal display
        fetching = {blob.name for blob in plan.blobs}
        rows: list[Row] = []
        seen: set[str] = set()
        for image in images:
            for layer in image.blobs:
                name = layer.digest.path
                if name in seen:
                    continue
                seen.add(name)
                state = "waiting" if name in fetching else (
                    "cached" if name in result.cached_names else "exists")
                rows.append(Row(name, layer.digest.short, layer.size, state))
        display = make_pull_display(LayerBoard(Path(options.dest), rows), quiet=quiet,
                                    plain=plain)
        display.start()

    def on_progress(progress: Progress) -> None:
        if display is not None:
            display.update(progress)

    try:
        result = pull(options, say, on_progress=on_progress, on_plan=on_plan)
    except UsageError as exc:
        click.echo(f"bulkfetch: error: {exc}", err=True)
        return 2
    except BulkfetchError as exc:
        click.echo(f"bulkfetch: error: {exc}", err=True)
        return 1
    except OSError as exc:  # the layout or the cache (disk full, permissions)
        click.echo(f"bulkfetch: error: {exc}; rerun the same command once fixed", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("bulkfetch: interrupted; rerun the same command to go on.", err=True)
        return 130
    finally:
        if display is not None:
            display.stop()
    report = result.report
    if report is not None and report.interrupted:
        click.echo("bulkfetch: interrupted; partial layers are kept: rerun the same command "
                   "to go on.", err=True)
        return 130
    if report is not None and report.error:
        click.echo(f"bulkfetch: error: {report.error}", err=True)
        if report.usage_error:  # e.g. a certificate the run does not trust
            return 2
    if report is not None:
        for failure in report.failures[:20]:
            click.echo(f"bulkfetch: failed: {failure.name}: {failure.reason}", err=True)
    for problem in result.cache_errors[:5]:
        click.echo(f"bulkfetch: warning: not cached: {problem}", err=True)
    if not quiet:
        _say(f"layers: {result.fetched} fetched ({result.fetched_bytes:,} bytes), "
             f"{result.cached} from the cache, {result.present} already in {options.dest}")
        for image in result.complete:
            _say(f"pulled {image.ref} -> oci:{options.dest}:{image.ref.ref_name} "
                 f"({image.manifest.digest})")
    if not result.ok:
        missing = [str(image.ref) for image in result.images if image not in result.complete]
        click.echo(f"bulkfetch: not pulled: {', '.join(missing)}; rerun the same command to "
                   "retry", err=True)
        return 1
    if rootfs is not None:
        return _unpack(options, result.complete[0], rootfs, quiet)
    return 0


def _unpack(options: PullOptions, image: Resolved, rootfs: str, quiet: bool) -> int:
    from bulkfetch.oci.rootfs import UnpackError, unpack

    dest = Path(options.dest)
    layers = [(dest / layer.digest.path, layer.media_type, layer.digest.short)
              for layer in image.blobs]
    try:
        stats = unpack(Path(rootfs), layers)
    except UnpackError as exc:
        click.echo(f"bulkfetch: error: --unpack: {exc}", err=True)
        return 1
    if not quiet:
        _say(f"unpacked into {rootfs}: {stats.files:,} files, {stats.dirs:,} directories, "
             f"{stats.symlinks:,} symlinks, {stats.whiteouts:,} whiteouts applied")
    return 0
