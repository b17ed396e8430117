"""What machine a session ran on: CPU, cores, memory, kernel and the versions of every tool
measured; and the short slug naming its results directory."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from bulkfetch.bench import peers

TOOLS = ("nginx", "wrk", "rclone", "aria2c", "wget2", "curl")
PACKAGES = ("bulkfetch", "pycurl", "aiohttp", "requests", "uvloop", "matplotlib")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return None


def cores() -> int:
    return os.cpu_count() or 1


def slug(today: datetime.date | None = None) -> str:
    """<YYYY-MM-DD>-<cores>c-<cpu>, e.g. 2026-11-22-2c-intel-xeon-platinum-8375c."""
    day = (today or datetime.date.today()).isoformat()
    model = re.sub(r"\((r|tm)\)|cpu|@.*$|processor", " ", cpu_model().lower())
    words = re.sub(r"[^a-z0-9]+", "-", model).strip("-")
    return f"{day}-{cores()}c-{words[:40].strip('-') or 'unknown'}"


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _libcurl() -> str:
    try:
        import pycurl

        return str(pycurl.version)
    except ImportError:
        return "pycurl not installed"


def _packer() -> str:
    """Which tar packer the measured bulkfetch runs, as that bulkfetch says (asked in a
    process of its own: the bench reads the product only from outside)."""
    try:
        found = subprocess.run(
            [sys.executable, "-c", "from bulkfetch.sinks.ustar import PACKER_NOTE; "
             "print(PACKER_NOTE)"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return found.stdout.strip() or f"unknown ({found.stderr.strip()[-200:]})"


def _git() -> str:
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "not a git checkout"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def describe(placement: str) -> str:
    """machine.txt: one `key: value` line each."""
    memory = memory_gb()
    lines = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": f"{cores()} (usable here: {len(os.sched_getaffinity(0))})",
        "memory": "unknown" if memory is None else f"{memory:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "placement": placement,
        "python": sys.version.split()[0] + f" ({sys.executable})",
        "libcurl": _libcurl(),
        "bulkfetch git": _git(),
        "bulkfetch tar packer": _packer(),
    }
    lines.update({tool: peers.version(tool) for tool in TOOLS})
    lines.update({f"python {name}": _package(name) for name in PACKAGES})
    return "".join(f"{key}: {value}\n" for key, value in lines.items())
