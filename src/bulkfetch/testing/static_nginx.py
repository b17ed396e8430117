"""An nginx configuration serving a directory as it is (stock ETags and Last-Modified), with
an access log of "STATUS BODY_BYTES TARGET" lines: what get --sync's tests and benchmarks
point at (`settings`: extra lines for the server block, e.g. `etag off;`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ACCESS_LINE = re.compile(r"^(?P<status>\d{3}) (?P<bytes>\d+) (?P<target>\S+)$")


def static_site_config(home: Path, root: Path, port: int, settings: str = "") -> Path:
    """Write `home`/nginx.conf serving `root` on 127.0.0.1:`port`, its pid, error log and
    access log (`home`/run/access.log, ACCESS_LINE lines) under `home`/run; its path."""
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""  # root's tmp dirs are often 0700
    temps = "".join(f'    {kind}_temp_path "{run / kind}";\n'
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    config = home / "nginx.conf"
    config.write_text(f"""\
{user}worker_processes 1;
pid "{run / 'nginx.pid'}";
lock_file "{run / 'nginx.lock'}";
error_log "{run / 'error.log'}" warn;
events {{ worker_connections 1024; }}
http {{
    log_format answers '$status $body_bytes_sent $request_uri';
    access_log "{run / 'access.log'}" answers;
{temps}    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root "{root}";
{settings}    }}
}}
""")
    return config
