"""The records of a file fetched in parts (engine/ranged.py): a durable one (an fsync of the
data, then the record) runs on a thread of its own, so that the hashing never waits behind an
fsync."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bulkfetch.engine import ranged as ranged_module
from bulkfetch.engine import resume
from bulkfetch.engine.layouts import PartLayouts
from bulkfetch.engine.parts import RangedFile, SplitPlan
from bulkfetch.engine.ranged import RangedFiles
from bulkfetch.sinks.spool import FileSpool

TOTAL = 3 << 20
BODY = os.urandom(TOTAL)


def ranged_files() -> RangedFiles:
    """Only the hashing and recording threads are used here: nothing is stored or retried."""
    transfers = SimpleNamespace(verify=True)

    def store(*_: object) -> bool:
        raise AssertionError("nothing is stored here")

    return RangedFiles(transfers, PartLayouts(None), store)  # type: ignore[arg-type]


def written_file(tmp_path: Path) -> RangedFile:
    """A file of two pieces, every byte written, none hashed yet."""
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    spool = FileSpool(dir_fd, "spool", str(tmp_path))
    file = RangedFile((None, "big.bin", "http://x/big.bin", 1), spool,
                      SplitPlan(TOTAL, '"v1"', {"md5": hashlib.md5(BODY).digest()}), 2)
    file.in_line = False
    os.pwrite(spool.fd, BODY, 0)
    for part in file.parts:
        part.written, part.complete = part.end - part.start, True
    file.done = len(file.parts)
    return file


def test_the_hashing_goes_on_while_a_durable_record_waits_for_its_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = ranged_files()
    file = written_file(tmp_path)
    release, entered = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if fd == file.spool.fd:  # gigabytes of dirty pages: seconds
            entered.set()
            assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(ranged_module.resume.os, "fsync", slow_fsync)
    try:
        files._checkpoint(file, durable=True)
        assert entered.wait(5)
        files.hash_more(file, 0)
        # behind the fsync on one thread, this would wait until the release below
        file.hashing.result(timeout=5)
        assert file.md5.digest() == hashlib.md5(BODY).digest()
        assert not file.idle()  # the record is still to come
    finally:
        release.set()
    file.recording.result(timeout=5)
    assert file.idle()
    record = resume.load(file.spool.dir_fd, file.spool.name)
    assert record is not None and record.written == TOTAL and record.durable is None
    files.close()
    file.spool.discard()


def test_a_plain_record_written_while_a_durable_one_waits_leaves_it_its_own_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two threads write records at once: each under its own temporary name, so the
    durable one, held in its fsync meanwhile, still lands whole and last."""
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    layout = ((0, 10, 10), (10, 20, 4))
    durable = resume.PartialRecord("big.bin", 20, '"v1"', layout)
    plain = resume.PartialRecord("big.bin", 20, '"v1"', ((0, 10, 10), (10, 20, 9)), (),
                                 "this-boot", layout)
    release, entered = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name == "durable":
            entered.set()
            assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(resume.os, "fsync", slow_fsync)
    failed: list[BaseException] = []

    def save_durable() -> None:
        try:
            resume.save(dir_fd, "spool", durable, durable=True)
        except BaseException as exc:  # reported below
            failed.append(exc)

    thread = threading.Thread(target=save_durable, name="durable")
    thread.start()
    assert entered.wait(5)
    resume.save(dir_fd, "spool", plain, durable=False)  # lands first
    release.set()
    thread.join(10)
    assert not failed, failed  # a shared temporary name: renamed away under it
    assert (tmp_path / ("spool" + resume.RECORD)).read_bytes() == durable.encode()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    os.close(dir_fd)


def test_waiting_for_the_hashing_is_not_ended_by_a_record_finished_long_ago(
        tmp_path: Path) -> None:
    """With every byte in, the loop waits for the hashing thread. A finished job beside the
    running one (the last durable record's) must not end that wait at once: the loop would
    spin, and on one core take the time the hashing needs."""
    from concurrent.futures import Future

    files = ranged_files()
    finished: Future[None] = Future()
    finished.set_result(None)
    running: Future[None] = Future()
    file = written_file(tmp_path)
    file.hashing, file.recording = running, finished
    files.files.add(file)
    timer = threading.Timer(0.2, running.set_result, (None,))
    timer.start()
    try:
        before = time.monotonic()
        files.wait_hashing(5.0)
        waited = time.monotonic() - before
    finally:
        timer.cancel()
    assert running.done() and waited >= 0.15  # woken by the hash job, not the old record
    files.close()
    file.spool.discard()
