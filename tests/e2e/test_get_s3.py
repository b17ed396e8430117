"""`bulkfetch get s3://BUCKET/PREFIX DEST` against real S3 servers on loopback: SeaweedFS (a
real store that checks SigV4 signatures) and moto (broad S3 semantics), through the real CLI,
checked with boto3 (an independent client) and the bytes on disk."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from getkit import STATE
from s3kit import (  # noqa: F401
    CorruptingRelay,
    moto,
    put_multipart,
    put_objects,
    s3_client,
    seaweed,
)

AWKWARD = ["a b+c=d%e~f.txt", "ünïcødé/файл.bin", "deep/" * 12 + "leaf.txt", "x&y<z>.txt",
           "semi;colon,comma!.dat", "tilde~/under_score-dash.txt", "plus+/sp ace/q'uote"]


def run(server, *args: str, env: dict[str, str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bulkfetch", "get", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else server.env())


def stored(dest: Path) -> dict[str, bytes]:
    found = {}
    for root, dirs, names in os.walk(dest):
        if Path(root) == dest:
            dirs[:] = [d for d in dirs if d != STATE]
        for name in names:
            path = Path(root) / name
            found[path.relative_to(dest).as_posix()] = path.read_bytes()
    return found


def objects(count: int, prefix: str) -> dict[str, bytes]:
    found = {f"{prefix}{key}": f"body of {key}".encode() * 3 for key in AWKWARD}
    for i in range(count):
        key = f"{prefix}set/{i % 7}/object-{i:05d}.bin"
        found[key] = hashlib.sha256(key.encode()).digest() * (1 + i % 5)
    return found


def test_signed_bucket_every_object_under_its_name(seaweed, tmp_path: Path) -> None:
    client = s3_client(seaweed)
    data = objects(3000, "data/")
    outside = {"other/x.txt": b"not under the prefix", "data": b"a key equal to the prefix"}
    put_objects(client, "signed", data | outside)
    dest = tmp_path / "dest"
    proc = run(seaweed, "s3://signed/data", str(dest), "-w", "2", "--list-concurrency", "8",
               "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = {key.removeprefix("data/"): body for key, body in data.items()}
    got = stored(dest)
    assert set(got) == set(want)
    assert all(got[name] == body for name, body in want.items())
    # a rerun has nothing to do
    again = run(seaweed, "s3://signed/data", str(dest), "-w", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    # no secret anywhere
    outputs = proc.stdout + proc.stderr + (tmp_path / "r.json").read_text()
    journal = (dest / STATE / "journal.sqlite").read_bytes()
    assert seaweed.secret_key not in outputs
    assert seaweed.secret_key.encode() not in journal


def test_wrong_secret_stops_at_once_in_plain_words(seaweed, tmp_path: Path) -> None:
    client = s3_client(seaweed)
    put_objects(client, "wrongsecret", {"a.txt": b"a"})
    env = seaweed.env() | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    dest = tmp_path / "dest"
    proc = run(seaweed, "s3://wrongsecret", str(dest), env=env, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "signature does not match" in " ".join(proc.stderr.lower().split())
    assert "not-the-secret" not in proc.stderr + proc.stdout
    assert stored(dest) == {}


def test_include_exclude_and_a_tar_sink(seaweed, tmp_path: Path) -> None:
    client = s3_client(seaweed)
    data = {f"p/{i:03d}.{ext}": f"{i}.{ext}".encode() for i in range(300)
            for ext in ("jpg", "txt", "tmp")}
    put_objects(client, "filtered", data)
    dest = tmp_path / "dest"
    proc = run(seaweed, "s3://filtered/p/", str(dest), "--include", "*.jpg", "--include",
               "*.txt", "--exclude", "00*", "--sink", "tar", "--shard-files", "100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = {k.removeprefix("p/"): body for k, body in data.items() if not k.endswith(".tmp")
            and not k.startswith("p/00")}
    members: dict[str, bytes] = {}
    for shard in sorted(dest.glob("shard-*.tar")):
        with tarfile.open(shard) as archive:
            for member in archive.getmembers():
                assert member.name not in members
                members[member.name] = archive.extractfile(member).read()
    assert members == want
    # a sample's members are neighbours in one shard (the range listing keeps them whole)
    import webdataset

    samples = list(webdataset.WebDataset(sorted(str(p) for p in dest.glob("shard-*.tar")),
                                         shardshuffle=False, empty_check=False))
    assert len(samples) == len({name.split(".")[0] for name in want})
    assert all({"jpg", "txt"} <= set(sample) for sample in samples)


def test_hostile_keys_refused_one_by_one(moto, tmp_path: Path) -> None:
    client = s3_client(moto)
    hostile = ["../x", "a/../../x", "/etc/x", "ok/../../../y", "./dot"]
    put_objects(client, "hostile", {key: b"evil" for key in hostile} | {"fine.txt": b"ok"})
    listed = [o["Key"] for o in client.list_objects_v2(Bucket="hostile")["Contents"]]
    dest = tmp_path / "inner" / "dest"
    proc = run(moto, "s3://hostile", str(dest), "-w", "1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert stored(dest) == {"fine.txt": b"ok"}
    assert sorted(p.name for p in (tmp_path / "inner").iterdir()) == ["dest"]
    failures = (dest / STATE / "failures.jsonl").read_text()
    for key in listed:
        if key != "fine.txt":
            assert "unsafe name" in failures and key.replace("\\", "\\\\") in failures


def test_missing_bucket_is_a_usage_error(moto, tmp_path: Path) -> None:
    proc = run(moto, "s3://no-such-bucket-here", str(tmp_path / "d"), timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no such bucket" in " ".join(proc.stderr.lower().split())


def test_no_credentials_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "s3://bkt/p",
                           str(tmp_path / "d"), "--endpoint-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    said = " ".join(proc.stderr.split())
    assert "AWS_ACCESS_KEY_ID" in said and "--no-sign-request" in said
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://UPPER_case"])
def test_bad_s3_urls(url: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", url, str(tmp_path / "d"),
                           "--no-sign-request"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and url in " ".join(proc.stderr.split()), proc.stderr


MODES = {"spooled": [], "ranged": ["--split-above", "6m", "--parts", "2"],
         "held in memory": ["--spool-above", "32m"]}


@pytest.mark.parametrize("mode", list(MODES))
def test_multipart_objects_checked_by_their_stored_checksum(moto, tmp_path: Path,
                                                            mode: str) -> None:
    pytest.importorskip("awscrt")  # CRC64NVME
    client = s3_client(moto)
    data = os.urandom(11 << 20)  # 3 parts of 5 MiB (the last smaller)
    put_multipart(client, "multipart", "full.bin", data, 5 << 20, "CRC64NVME")  # FULL_OBJECT
    put_multipart(client, "multipart", "composite.bin", data, 5 << 20, "SHA256")
    put_multipart(client, "multipart", "plain.bin", data, 5 << 20)
    put_objects(client, "multipart", {"single.txt": b"one part: an MD5 ETag"})
    dest, report_path = tmp_path / "dest", tmp_path / "r.json"
    # each body spooled (over --spool-above, 1 MiB), in ranges, or held in memory
    proc = run(moto, "s3://multipart", str(dest), "-w", "1", "--report", str(report_path),
               *MODES[mode])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {name: hashlib.md5(body).hexdigest() for name, body in stored(dest).items()} == {
        "full.bin": hashlib.md5(data).hexdigest(),
        "composite.bin": hashlib.md5(data).hexdigest(),
        "plain.bin": hashlib.md5(data).hexdigest(),
        "single.txt": hashlib.md5(b"one part: an MD5 ETag").hexdigest()}
    report = json.loads(report_path.read_text())
    said = " ".join(proc.stdout.split() + proc.stderr.split())
    if mode == "held in memory":
        # the full-object CRC64NVME checks one; a checksum of the parts' checksums (SHA256
        # COMPOSITE) and none at all leave the size (a body held in memory is not probed
        # for its parts); the single part has its MD5 ETag
        assert report["checked"] == {"md5": 1, "digest": 1, "size_only": 2}
        assert "1 by MD5 · 1 by checksum · 2 by size only" in said
    else:
        # with the layout of the parts (HEAD ?partNumber=1): the composite SHA256 checks
        # one, the multipart ETag (MD5 of the parts' MD5s) the other
        assert report["checked"] == {"md5": 2, "digest": 2, "size_only": 0}
        assert "2 by MD5 · 2 by checksum" in said and "size only" not in said


@pytest.mark.parametrize("mode", ["spooled", "ranged"])
def test_a_multipart_body_corrupted_in_transit_is_caught_and_fetched_again(
        moto, tmp_path: Path, mode: str) -> None:
    """An object uploaded in parts with no checksum but its ETag: 16 bytes of part 2 are
    changed on the way once (the store's copy stays right). Checked by size alone, as
    before, the changed body would be stored."""
    client = s3_client(moto)
    data = os.urandom(11 << 20)
    put_multipart(client, "corrupted", "plain.bin", data, 5 << 20)
    marker = data[7 << 20:(7 << 20) + 16]
    with CorruptingRelay(moto.port, marker, bytes(b ^ 0xFF for b in marker)) as relay:
        report_path = tmp_path / "r.json"
        proc = run(moto, "s3://corrupted", str(tmp_path / "dest"), "-w", "1", "--endpoint-url",
                   relay.endpoint, "--report", str(report_path), *MODES[mode])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert relay.replaced == 1
    assert stored(tmp_path / "dest") == {"plain.bin": data}
    report = json.loads(report_path.read_text())
    assert report["retries"] == 1
    assert report["checked"] == {"md5": 1, "digest": 0, "size_only": 0}


def test_parts_of_more_than_one_size_keep_the_object_checked_by_size(moto,
                                                                     tmp_path: Path) -> None:
    """Parts of 5, 6 and 1 MiB: part 1's size cuts 12 MiB into 3 parts too, at the wrong
    places. The parts' MD5 fails twice alike (the same bytes came): the object is kept,
    checked by its size, not failed."""
    client = s3_client(moto)
    client.create_bucket(Bucket="uneven")
    data = os.urandom(12 << 20)
    upload = client.create_multipart_upload(Bucket="uneven", Key="uneven.bin")["UploadId"]
    parts, start = [], 0
    for number, size in enumerate([5 << 20, 6 << 20, 1 << 20], 1):
        answer = client.upload_part(Bucket="uneven", Key="uneven.bin", UploadId=upload,
                                    PartNumber=number, Body=data[start:start + size])
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        start += size
    client.complete_multipart_upload(Bucket="uneven", Key="uneven.bin", UploadId=upload,
                                     MultipartUpload={"Parts": parts})
    report_path = tmp_path / "r.json"
    proc = run(moto, "s3://uneven", str(tmp_path / "dest"), "-w", "1",
               "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stored(tmp_path / "dest") == {"uneven.bin": data}
    report = json.loads(report_path.read_text())
    assert report["checked"] == {"md5": 0, "digest": 0, "size_only": 1}
    assert report["retries"] == 1


def test_a_signed_layout_probe_is_accepted_by_a_store_that_checks_signatures(
        seaweed, tmp_path: Path) -> None:
    """SeaweedFS checks the SigV4 of `HEAD key?partNumber=1` (s3/signer.headers_for) for a
    key with a space, '+', '=' and unicode; its answer gives the layout."""
    client = s3_client(seaweed)
    data = os.urandom(11 << 20)
    key = "multi part/big+object=ü.bin"
    put_multipart(client, "probed", key, data, 5 << 20)
    report_path = tmp_path / "r.json"
    proc = run(seaweed, "s3://probed", str(tmp_path / "dest"), "-w", "1",
               "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stored(tmp_path / "dest") == {key: data}
    assert json.loads(report_path.read_text())["checked"] == \
        {"md5": 1, "digest": 0, "size_only": 0}


def test_profile_credentials_and_endpoint_from_the_aws_files(seaweed, tmp_path: Path) -> None:
    client = s3_client(seaweed)
    put_objects(client, "profiled", {"a/1.txt": b"one", "a/2.txt": b"two"})
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n"
        f"[dev]\naws_access_key_id = {seaweed.access_key}\n"
        f"aws_secret_access_key = {seaweed.secret_key}\n")
    (home / ".aws" / "config").write_text(
        f"[profile dev]\nregion = {seaweed.region}\nendpoint_url = {seaweed.endpoint}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "HOME": str(home)}
    by_flag = run(seaweed, "s3://profiled/a", str(tmp_path / "flag"), "--profile", "dev",
                  env=env)
    assert by_flag.returncode == 0, by_flag.stderr[-2000:]
    assert stored(tmp_path / "flag") == {"1.txt": b"one", "2.txt": b"two"}
    by_variable = run(seaweed, "s3://profiled/a", str(tmp_path / "var"),
                      env=env | {"AWS_PROFILE": "dev"})
    assert by_variable.returncode == 0, by_variable.stderr[-2000:]
    assert stored(tmp_path / "var") == {"1.txt": b"one", "2.txt": b"two"}
    # the default profile's keys are wrong: the store says so, and the run stops (exit 2)
    default = run(seaweed, "s3://profiled/a", str(tmp_path / "default"), "--endpoint-url",
                  seaweed.endpoint, env=env)
    assert default.returncode == 2, default.stderr[-2000:]
    missing = run(seaweed, "s3://profiled/a", str(tmp_path / "missing"), "--profile", "nope",
                  env=env)
    assert missing.returncode == 2 and "nope" in missing.stderr
    for proc in (by_flag, by_variable, default, missing):
        assert seaweed.secret_key not in proc.stdout + proc.stderr


def test_unsigned_requests_for_a_public_bucket(moto, tmp_path: Path) -> None:
    client = s3_client(moto)
    put_objects(client, "public", {"open.txt": b"for anyone", "closed.txt": b"not for all"})
    client.put_bucket_acl(Bucket="public", ACL="public-read")  # anyone may list
    client.put_object_acl(Bucket="public", Key="open.txt", ACL="public-read")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    proc = run(moto, "s3://public", str(tmp_path / "d"), "--no-sign-request",
               "--endpoint-url", moto.endpoint, env=env)
    # the private object is a failure of its own (403), the public one is stored
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert stored(tmp_path / "d") == {"open.txt": b"for anyone"}
    failures = [json.loads(line) for line in
                (tmp_path / "d" / STATE / "failures.jsonl").read_text().splitlines()]
    assert [(f["name"], f["status"]) for f in failures] == [("closed.txt", 403)]
    assert failures[0]["reason"] == "HTTP 403"  # moto's 403 to the anonymous has no body
    assert "unsigned" in " ".join((proc.stdout + proc.stderr).split())  # the source line
