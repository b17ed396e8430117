"""`bulkfetch serve --s3` says on startup where its bucket is and what to paste to read it;
pasting exactly that (DEST filled in) downloads the bucket, unsigned and signed."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bulkfetch.server.command import s3_hints

KEY, SECRET, TOKEN = "AKIDPASTE", "se/cr+et=x", "a session token"
FILES = 300


@pytest.fixture
def started() -> Iterator[Callable[..., list[str]]]:
    """Start `bulkfetch serve --s3 ARGS --port 0`; returns its first `count` stdout lines."""
    processes: list[subprocess.Popen[str]] = []

    def start(count: int, *args: str) -> list[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "bulkfetch", "serve", "--s3", "--port", "0",
             "--processes", "1", "--files", str(FILES), *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True)
        processes.append(process)
        assert process.stdout is not None
        return [process.stdout.readline().rstrip("\n") for _ in range(count)]

    yield start
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def environment(**extra: str) -> dict[str, str]:
    """This environment without any AWS setting of the machine's, plus `extra`."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return kept | {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                   **extra}


def run_pasted(command: str, dest: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command.replace("DEST", shlex.quote(str(dest))))
    assert words[0] == "bulkfetch"
    return subprocess.run([sys.executable, "-m", "bulkfetch", *words[1:], "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120)


def test_an_open_bucket_prints_the_get_to_paste(started: Callable[..., list[str]],
                                                 tmp_path: Path) -> None:
    first, hint = started(2)
    assert first.startswith("serving http://127.0.0.1:")  # still the line tests parse
    endpoint = first.split()[1]
    where, _, command = hint.partition(" \N{EM DASH} ")
    assert where == f"s3: the bucket s3://bulkfetch at {endpoint}"
    assert command == (f"bulkfetch get s3://bulkfetch DEST --endpoint-url {endpoint} "
                       "--no-sign-request")
    done = run_pasted(command, tmp_path / "dest", environment())
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "dest").glob("f*"))) == FILES


def test_a_signed_bucket_prints_the_exports_and_they_work(started: Callable[..., list[str]],
                                                          tmp_path: Path) -> None:
    first, hint, exports, command = started(4, "--s3-bucket", "photos", "--s3-credentials",
                                            f"{KEY}:{SECRET}", "--s3-session-token", TOKEN)
    endpoint = first.split()[1]
    assert hint == (f"s3: the bucket s3://photos at {endpoint}, signed requests only; paste "
                    "into the shell that runs bulkfetch:")
    words = shlex.split(exports)
    assert words[0] == "export"
    pasted = dict(word.split("=", 1) for word in words[1:])
    assert pasted == {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                      "AWS_REGION": "us-east-1", "AWS_SESSION_TOKEN": TOKEN}
    assert command == f"bulkfetch get s3://photos DEST --endpoint-url {endpoint}"
    done = run_pasted(command, tmp_path / "dest", environment(**pasted))
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "dest").glob("f*"))) == FILES
    # and the server does check them: without the exports the same command is refused
    refused = run_pasted(command, tmp_path / "other", environment(AWS_ACCESS_KEY_ID=KEY,
                                                                  AWS_SECRET_ACCESS_KEY="no"))
    assert refused.returncode == 2, refused.stderr


def test_hints_quote_what_a_shell_would_split() -> None:
    lines = s3_hints("http://[::1]:9000", "b1", "K:s e'cret", None)
    assert shlex.split(lines[1])[2] == "AWS_SECRET_ACCESS_KEY=s e'cret"
    assert lines[2] == "bulkfetch get s3://b1 DEST --endpoint-url http://[::1]:9000"
