"""What the benchmark scripts share; the code lives in `bulkfetch.bench.harness` (used by
`bulkfetch bench` too) and is re-exported here so the scripts import it as before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import bulkfetch.bench.harness  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bulkfetch.bench.harness import (
    CLOCK_TICKS,
    Measured,
    Pinning,
    Server,
    TreeMemory,
    alternating_rounds,
    bulkfetch_command,
    cached_export,
    export_for_nginx,
    fit_open_file_cache,
    free_port,
    log,
    per_file,
    pinning,
    report_verified,
    run_measured,
    settle,
    start_nginx,
    start_reference,
    tree_cpu_seconds,
    tree_pids,
)
from bulkfetch.bench.scratch import FreshFilesystems
from bulkfetch.bench.stats import median_interval, verdict


def pages_done(dest: str | os.PathLike[str]) -> int:
    """Pages the journal of DEST holds done (0 while it cannot be read yet)."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{dest}/.bulkfetch/journal.sqlite?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM pages WHERE status = 'done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


HERE = Path(__file__).resolve().parent
INSTALL_HEADERS = ("libcurl's headers are missing: install them (Debian/Ubuntu: apt-get install "
                   "-y --no-install-recommends libcurl4-openssl-dev; Fedora: dnf install "
                   "libcurl-devel)")


def pycurl_libcurl() -> Path | None:
    """The libcurl shared library pycurl's extension module loads (a wheel bundles its own)."""
    import pycurl

    module = next(Path(pycurl.__file__).parent.glob("_pycurl*.so"), None)
    if module is None:  # an older layout: pycurl.cpython-*.so beside the package
        import importlib.util

        spec = importlib.util.find_spec("pycurl")
        origin = spec.origin if spec else None
        module = Path(origin) if origin and origin.endswith(".so") else None
    if module is None or shutil.which("ldd") is None:
        return None
    found = subprocess.run(["ldd", str(module)], capture_output=True, text=True).stdout
    for line in found.splitlines():
        name, _, rest = line.strip().partition(" => ")
        if name.startswith("libcurl") and rest.startswith("/"):
            return Path(rest.split(" (")[0])
    return None


def build_curl_loop(work: Path, libcurl: str) -> tuple[Path, str]:
    """curl_loop compiled into `work`; (binary, how it was linked)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("no C compiler: install gcc (apt-get install -y gcc)")
    binary = work / "curl_loop"
    link, how = ["-lcurl"], "libcurl -lcurl"
    if libcurl == "pycurl":
        library = pycurl_libcurl()
        if library is None:
            raise SystemExit("cannot find the libcurl pycurl loads; run with --libcurl system")
        link, how = [str(library), f"-Wl,-rpath,{library.parent}"], f"pycurl's {library.name}"
    done = subprocess.run([gcc, "-O2", str(HERE / "curl_loop.c"), *link, "-o", str(binary)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if "curl/curl.h" in done.stderr:
            raise SystemExit(INSTALL_HEADERS)
        raise SystemExit(f"compiling curl_loop.c failed:\n{done.stderr.strip()}")
    return binary, how


def warm_memory(nbytes: int) -> None:
    """Touch `nbytes` of free memory and free it again, just before a row that writes about
    that much. Why: on a VM whose balloon driver reports free pages to the host (virtio
    free page reporting, as here), memory freed a while ago is handed back, and the next
    process to touch it pays the host's fault on every page. Writing 4 GiB into tmpfs here
    cost 0.39 s of CPU per GiB for the first 3 GiB and 2.2-2.9 s for the 4th; right after
    6 GiB were written and deleted, 0.39 and 0.80 (2026-11-27, session 23). Without this,
    whichever row of a benchmark runs first on cold memory pays for it."""
    where = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(dir=where, prefix="bulkfetch-warm-")
    block = bytes(8 << 20)  # zeros still take a page each in tmpfs
    try:
        for _ in range(-(-nbytes // len(block))):
            os.write(fd, block)
    finally:
        os.close(fd)
        os.unlink(path)


__all__ = [
    "CLOCK_TICKS",
    "FreshFilesystems",
    "Measured",
    "Pinning",
    "Server",
    "TreeMemory",
    "alternating_rounds",
    "build_curl_loop",
    "bulkfetch_command",
    "cached_export",
    "export_for_nginx",
    "fit_open_file_cache",
    "free_port",
    "log",
    "median_interval",
    "pages_done",
    "per_file",
    "pinning",
    "report_verified",
    "run_measured",
    "settle",
    "start_nginx",
    "start_reference",
    "tree_cpu_seconds",
    "tree_pids",
    "verdict",
    "warm_memory",
]
