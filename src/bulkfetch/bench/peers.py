"""Peer downloaders from Debian's packages, as the benchmark runs them.

    rclone    `rclone copy` with the HTTP backend over an nginx autoindex of the files
              (rclone cannot speak the seed API; the autoindex is one listing page), with
              `--files-from` naming the files when it runs on a subset
    aria2c    a URL list (`-i`), 64 downloads at once
    wget2     a URL list (`-i`), 64 threads
    curl      a URL list (`-K` config of `url = ...` lines), `--parallel`, 64 at once (curl >= 7.73)

Each writes DEST/<name> (one file per download) and keeps connections alive. Every command
is given the same 64 transfers in flight as bulkfetch and the asyncio designs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PARALLEL = 64
AUTOINDEX_PATH = "/files/"  # where the patched nginx config lists the export's files


@dataclass(frozen=True)
class Peer:
    name: str  # the row's name
    binary: str
    package: str  # Debian package providing `binary`
    subset: int  # runs on 1/subset of the files (1: all)


PEERS = (
    Peer("rclone", "rclone", "rclone", 2),
    Peer("aria2c", "aria2c", "aria2", 40),
    Peer("wget2", "wget2", "wget2", 2),
    Peer("curl", "curl", "curl", 2),
)


def missing(peer: Peer) -> str | None:
    """Why `peer` cannot run here, or None."""
    if shutil.which(peer.binary) is None:
        return f"{peer.binary} is not installed (apt-get install {peer.package})"
    if peer.name == "curl" and not curl_has_parallel():
        return "this curl has no --parallel/--output-dir (needs curl >= 7.73)"
    return None


def curl_has_parallel() -> bool:
    try:
        out = subprocess.run(["curl", "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    match = re.match(r"curl (\d+)\.(\d+)", out)
    return match is not None and (int(match.group(1)), int(match.group(2))) >= (7, 73)


def file_url(base: str, name: str) -> str:
    return f"{base}/get/{urllib.parse.quote(name)}"


def write_url_list(path: Path, base: str, names: Iterable[str]) -> int:
    """One URL per line (aria2c -i, wget2 -i, bulkfetch --from-file). Returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for name in names:
            out.write(file_url(base, name) + "\n")
            count += 1
    return count


def write_names(path: Path, names: Iterable[str]) -> int:
    """One name per line (rclone --files-from). Returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for name in names:
            out.write(name + "\n")
            count += 1
    return count


def write_curl_config(path: Path, base: str, names: Iterable[str]) -> int:
    """A curl -K config: one `url = "..."` line per file. Returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for name in names:
            url = file_url(base, name).replace("\\", "\\\\").replace('"', '\\"')
            out.write(f'url = "{url}"\n')
            count += 1
    return count


def with_autoindex(config_text: str, files_dir: Path) -> str:
    """The export's nginx config plus `location /files/` listing the files (autoindex), for
    rclone's HTTP backend. The seed API's locations are untouched."""
    if "$" in str(files_dir) or "'" in str(files_dir):
        raise ValueError(f"nginx cannot serve {files_dir}")
    block = (f"        location {AUTOINDEX_PATH} {{\n"
             f"            alias '{files_dir}/';\n"
             f"            autoindex on;\n"
             f"        }}\n\n")
    anchor = "        location / {\n"
    if anchor not in config_text:
        raise ValueError("the export's nginx.conf has no `location / {` to insert before")
    return config_text.replace(anchor, block + anchor, 1)


def command(peer: Peer, base: str, dest: Path, url_list: Path, curl_config: Path,
            names: Path | None = None) -> list[str]:
    """The command line running `peer` into the fresh directory `dest`; rclone fetches only
    the files `names` lists when given."""
    if peer.name == "rclone":
        subset = ["--files-from", str(names)] if names is not None else []
        return ["rclone", "copy", "--http-url", base + AUTOINDEX_PATH, ":http:", str(dest),
                "--transfers", str(PARALLEL), "--checkers", str(PARALLEL),
                "--http-no-head",  # no HEAD per file: the listing gives sizes
                "--no-check-dest", "--no-traverse",  # DEST is fresh
                *subset, "-q"]
    if peer.name == "aria2c":
        return ["aria2c", "-i", str(url_list), "-d", str(dest), "-j", str(PARALLEL),
                "--deferred-input=true", "--file-allocation=none",
                "--auto-file-renaming=false", "--allow-overwrite=true",
                "--console-log-level=error", "--summary-interval=0",
                "--download-result=hide", "-q"]
    if peer.name == "wget2":
        return ["wget2", "-i", str(url_list), "-P", str(dest), f"--max-threads={PARALLEL}",
                "-nd", "--no-robots", "-q"]
    if peer.name == "curl":
        return ["curl", "--parallel", "--parallel-max", str(PARALLEL), "--parallel-immediate",
                "--fail", "--no-progress-meter", "--output-dir", str(dest), "--remote-name-all",
                "-K", str(curl_config)]
    raise ValueError(f"unknown peer {peer.name!r}")


def version(binary: str) -> str:
    """The first line `binary` prints about its version, or why there is none."""
    if shutil.which(binary) is None:
        return "not installed"
    flag = "version" if binary == "rclone" else "--version"
    try:
        done = subprocess.run([binary, flag] if binary != "nginx" else [binary, "-v"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return text[0] if text else "unknown"
