"""A FUSE network filesystem on loopback for a DEST: sshfs (SFTP) mounted from a private sshd
on 127.0.0.1, as a node would mount shared storage. Its locking and rename are not ext4's:
locks are the kernel's on this one mount (other mounts of the same export do not see
them), and rename goes through OpenSSH's posix-rename extension."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch.util.ports import free_port

SSHD = "/usr/sbin/sshd"


@contextlib.contextmanager
def sshfs_mount(home: Path) -> Iterator[tuple[Path, Path]]:
    """(the export on local disk, its sshfs mount); skipped, with the reason, where this
    machine cannot mount FUSE or lacks sshfs/sshd (.ci/run installs both)."""
    if shutil.which("sshfs") is None or not os.path.exists(SSHD):
        pytest.skip("needs sshfs and sshd (Debian sshfs, openssh-server)")
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        pytest.skip("needs /dev/fuse and root to mount it")
    export, mount = home / "export", home / "mnt"
    export.mkdir()
    mount.mkdir()
    for name in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / name)],
                       check=True)
    shutil.copy(home / "userkey.pub", home / "authorized_keys")
    port = free_port()
    (home / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {home / 'hostkey'}\n"
        f"AuthorizedKeysFile {home / 'authorized_keys'}\nPasswordAuthentication no\n"
        f"PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        f"PidFile {home / 'sshd.pid'}\nSubsystem sftp internal-sftp\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    sshd = subprocess.Popen([SSHD, "-D", "-f", str(home / "sshd_config"), "-E",
                             str(home / "sshd.log")])
    try:
        mounted = None
        for _ in range(50):  # sshd takes a moment to listen
            mounted = subprocess.run(
                ["sshfs", "-p", str(port), "-o", f"IdentityFile={home / 'userkey'},"
                 "StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,reconnect",
                 f"root@127.0.0.1:{export}", str(mount)], capture_output=True, text=True)
            if mounted.returncode == 0:
                break
            time.sleep(0.1)
        if mounted is None or mounted.returncode != 0:
            pytest.skip(f"sshfs could not mount here: {mounted.stderr.strip() if mounted else ''}")
        try:
            yield export, mount
        finally:
            subprocess.run(["fusermount", "-u", "-z", str(mount)], capture_output=True)
    finally:
        sshd.terminate()
        sshd.wait(10)
