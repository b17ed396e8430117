"""`bulkfetch pull` beside `skopeo copy`, against Debian's docker-registry on loopback:

    python benchmarks/pull.py [--scale 1.0] [--rate 24m] [--rounds 2] [--work DIR]

The image (issue 22): 8 layers of 64, 128, ..., 512 MB (times --scale) in a multi-platform
index (linux/amd64 with the big layers, linux/arm64 with one small one), built as an OCI
layout and pushed with skopeo. A second image shares 6 of the 8 layers.

Rows, in one run:
- speed, no limits: skopeo copy docker://... oci:... (with
  --dest-oci-accept-uncompressed-layers, so it stores the layers as served, as pull does)
  and bulkfetch pull, in ABBA rounds; seconds, CPU of the process tree, peak RSS. skopeo
  does not fsync what it writes and pull does: a third column runs skopeo then `sync`.
- speed, per-connection bandwidth limit: the registry's redirect middleware sends every
  blob GET to nginx serving the registry's storage with `limit_rate` (--rate) per
  connection, as a CDN that paces each connection does. Same clients.
- resume: a pull through the limited host killed with SIGKILL once its resume records say
  about half the bytes are in, then the same command: the bytes the blob host sent to the
  rerun, over the image's size.
- shared layers: the second image pulled into the layout of the first: which blobs the
  registry served.
- checks: `skopeo copy oci:DEST:TAG dir:X` and `umoci unpack` accept every pulled layout, and
  each layer's sha256 is its digest.
Bars: limited >= 1.5x skopeo, unlimited >= 1.0x, rerun <= 55% of the bytes, only the 2 new
layers fetched, peak RSS < 200 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bulkfetch.testing.images import LayerSpec, build_image, build_index, push
from bulkfetch.testing.registry import BlobHost, Registry
from bulkfetch.util.sizes import parse_bytes
from harness import Measured, bulkfetch_command, log, run_measured

MB = 1_000_000
SPEED_LIMITED_BAR = 1.5
SPEED_FREE_BAR = 1.0
RERUN_BAR = 0.55
RSS_BAR_MB = 200


def layers(scale: float) -> list[LayerSpec]:
    return [LayerSpec(100 + at, max(1 << 20, int(64 * MB * at * scale))) for at in range(1, 9)]


def shared(scale: float) -> list[LayerSpec]:
    first = layers(scale)
    return [*first[:6], LayerSpec(200, int(10 * MB * scale) + 1),
            LayerSpec(201, int(20 * MB * scale) + 1)]


def skopeo(ref: str, dest: Path, sync: bool) -> list[str]:
    copy = ["skopeo", "copy", "-q", "--insecure-policy", "--src-tls-verify=false",
            "--dest-oci-accept-uncompressed-layers", f"docker://{ref}", f"oci:{dest}:big"]
    if not sync:
        return copy
    return ["sh", "-c", " ".join(copy) + f" && sync -f {dest}/index.json"]


def pull(ref: str, dest: Path, *extra: str) -> list[str]:
    return [*bulkfetch_command(), "pull", "-q", "--no-cache", "--platform", "linux/amd64",
            *extra, ref, str(dest)]


def check(dest: Path, tag: str, work: Path, expected: list[tuple[str, int]]) -> str:
    out, bundle = work / "check-dir", work / "check-bundle"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    copied = subprocess.run(["skopeo", "copy", "--insecure-policy", f"oci:{dest}:{tag}",
                             f"dir:{out}"], capture_output=True, text=True)
    if copied.returncode:
        return f"skopeo refused: {copied.stderr.strip()[-200:]}"
    for digest, size in expected:
        path = dest / "blobs" / "sha256" / digest.split(":")[1]
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
        if "sha256:" + hasher.hexdigest() != digest or path.stat().st_size != size:
            return f"layer {digest} wrong"
    unpacked = subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{dest}:{tag}",
                               str(bundle)], capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    if unpacked.returncode:
        return f"umoci refused: {unpacked.stderr.strip()[-200:]}"
    return "ok"


def measure(label: str, command: list[str], dest: Path, env: dict[str, str]) -> Measured:
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["sync"])
    result = run_measured(command, env=env)
    if result.returncode:
        raise SystemExit(f"{label} failed ({result.returncode}): {result.stderr[-2000:]}")
    log(f"{label}: {result.seconds:.2f} s, CPU {result.cpu_seconds:.2f} s, "
        f"RSS {result.peak_rss / MB:.0f} MB")
    return result


def speed_rows(name: str, ref: str, work: Path, rounds: int, env: dict[str, str],
               total: int) -> dict[str, list[Measured]]:
    rows: dict[str, list[Measured]] = {"skopeo": [], "skopeo+sync": [], "bulkfetch": []}
    for round_ in range(rounds):
        order = ["skopeo", "skopeo+sync", "bulkfetch"]
        if round_ % 2:
            order.reverse()
        for label in order:
            dest = work / f"out-{label}"
            command = pull(ref, dest) if label == "bulkfetch" else \
                skopeo(ref, dest, label.endswith("sync"))
            rows[label].append(measure(f"{name} {label} round {round_ + 1}", command, dest,
                                       env))
    print(f"\n{name}: {total / MB:,.0f} MB in 8 layers, {rounds} rounds (median)")
    print(f"{'client':<14} {'seconds':>8} {'MB/s':>8} {'CPU s':>7} {'peak RSS MB':>12}")
    for label, results in rows.items():
        seconds = statistics.median(r.seconds for r in results)
        print(f"{label:<14} {seconds:>8.2f} {total / MB / seconds:>8.1f} "
              f"{statistics.median(r.cpu_seconds for r in results):>7.2f} "
              f"{max(r.peak_rss for r in results) / MB:>12.0f}")
    return rows


def ratio(rows: dict[str, list[Measured]], other: str) -> float:
    return statistics.median(r.seconds for r in rows[other]) / \
        statistics.median(r.seconds for r in rows["bulkfetch"])


def resume_row(ref: str, blobs: BlobHost, work: Path, total: int, env: dict[str, str],
               ) -> tuple[int, int]:
    dest = work / "out-resume"
    shutil.rmtree(dest, ignore_errors=True)
    process = subprocess.Popen(pull(ref, dest), start_new_session=True,
                               env={**os.environ, **env})
    partial = dest / ".bulkfetch" / "partial"
    mark = len(blobs.access_log())
    blobs_dir = dest / "blobs" / "sha256"
    while process.poll() is None:
        # layers in place, plus what the resume records of those on their way say
        written = sum(path.stat().st_size for path in blobs_dir.glob("*")) \
            if blobs_dir.exists() else 0
        for record in partial.glob("*.json") if partial.exists() else ():
            with contextlib.suppress(ValueError, KeyError, OSError):
                written += sum(part[2] for part in json.loads(record.read_text())["parts"])
        if written >= total * 0.5:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):  # (a pull faster than the check ends)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    first = sum(entry.bytes for entry in blobs.access_log()[mark:])
    mark = len(blobs.access_log())
    result = run_measured(pull(ref, dest), env=env)
    if result.returncode:
        raise SystemExit(f"the rerun failed: {result.stderr[-2000:]}")
    return first, sum(entry.bytes for entry in blobs.access_log()[mark:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rate", default="24m", help="per-connection limit of the blob host")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bulkfetch-pull-bench-"))
    env = {"XDG_CACHE_HOME": str(work / "xdg")}
    layout = work / "layout"
    shutil.rmtree(layout, ignore_errors=True)
    started = time.monotonic()
    index = build_index(layout, "big", {"linux/amd64": layers(args.scale),
                                        "linux/arm64": [LayerSpec(300, 1 << 20)]})
    second = build_image(layout, "second", shared(args.scale))
    image = index.images["linux/amd64"]
    total = sum(size for _, size in image.layers)
    log(f"built {total / MB:,.0f} MB of layers in {time.monotonic() - started:.0f} s")
    rate = parse_bytes(args.rate)
    with Registry(work / "reg-plain") as plain:
        push(layout, "big", plain.address, "team/big", all_platforms=True)
        push(layout, "second", plain.address, "team/big")
        log("pushed")
        free = speed_rows("no limits", f"{plain.address}/team/big:big", work, args.rounds,
                          env, total)
        verdicts = [check(work / "out-bulkfetch", "big", work, list(image.layers))]
        with BlobHost(plain.data_dir, limit_rate=rate) as blobs, \
                Registry(work / "reg-limited", redirect_to=blobs,
                         data_dir=plain.data_dir) as limited:
            ref = f"{limited.address}/team/big:big"
            paced = speed_rows(f"blob GETs paced at {rate / MB:.0f} MB/s per connection", ref,
                               work, args.rounds, env, total)
            first, rerun = resume_row(ref, blobs, work, total, env)
            verdicts.append(check(work / "out-resume", "big", work, list(image.layers)))
        mark = len(plain.access_log())
        dest = work / "out-bulkfetch"
        result = run_measured([*bulkfetch_command(), "pull", "-q", "--no-cache",
                               f"{plain.address}/team/big:second", str(dest)], env=env)
        layers_of_second = {digest for digest, _ in second.layers}
        fetched = {entry.path.rsplit("/", 1)[1] for entry in plain.access_log()[mark:]
                   if "/blobs/" in entry.path and entry.status in (200, 206)
                   and entry.path.rsplit("/", 1)[1] in layers_of_second}
        new = layers_of_second - {digest for digest, _ in image.layers}
        verdicts.append(check(dest, "second", work, list(second.layers))
                        if result.returncode == 0 else f"exit {result.returncode}")
    rows = [
        ("pull vs skopeo, per-connection limit", ratio(paced, "skopeo"), SPEED_LIMITED_BAR),
        ("pull vs skopeo, no limits", ratio(free, "skopeo"), SPEED_FREE_BAR),
        ("pull vs skopeo+sync, no limits", ratio(free, "skopeo+sync"), SPEED_FREE_BAR),
    ]
    print(f"\n{'bar':<40} {'value':>8} {'bar':>8}  met")
    for label, value, bar in rows:
        print(f"{label:<40} {value:>7.2f}x {bar:>7.2f}x  {'yes' if value >= bar else 'NO'}")
    share = rerun / total
    print(f"{'rerun after kill -9 at ~50%':<40} {share:>8.0%} {RERUN_BAR:>8.0%}  "
          f"{'yes' if share <= RERUN_BAR else 'NO'}   (killed run got {first / MB:,.0f} MB)")
    print(f"{'second image: layers fetched':<40} {len(fetched):>8} {len(new):>8}  "
          f"{'yes' if fetched == new else 'NO'}")
    peak = max(r.peak_rss for r in paced["bulkfetch"] + free["bulkfetch"]) / MB
    print(f"{'pull peak RSS (MB)':<40} {peak:>8.0f} {RSS_BAR_MB:>8}  "
          f"{'yes' if peak < RSS_BAR_MB else 'NO'}")
    print(f"{'layouts read by skopeo and umoci':<40} {', '.join(verdicts)}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
