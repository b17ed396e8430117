"""The sinks under contract, each opened the way a run opens it: DEST prepared as
runners/local.py prepares it (the journal and its lock, DEST/.bulkfetch/tmp, and for tar the
shard index brought in line by prepare_shards), then sinks.open_sink() as a worker calls it.
What a sink stored is read back independently: the directory tree as files, tar shards with
Python's tarfile, the stream sinks' messages as bulkfetch.stream() reads them, and the null
sink must store nothing at all."""

from __future__ import annotations

import os
import re
import tarfile
from array import array
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.config import GetOptions, SinkOptions
from bulkfetch.dest.journal import Journal
from bulkfetch.runners.dest import prepare_shards
from bulkfetch.sinks import Sink, open_sink, sink_type
from bulkfetch.sinks.base import SinkAbilities
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sinks.spool import PARTIAL_DIR

STATE = ".bulkfetch"
# DEST/.bulkfetch of a run: the journal and its lock (dest/journal.py), the sinks' temporaries
# and partial files (emptied by a clean close), the dir sink's md5sum lines.
STATE_ENTRIES = {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm", "lock", "tmp",
                 "partial", "sums"}
# What a tar destination keeps beside its shards: the index, in WAL mode.
TAR_BOOKKEEPING = re.compile(r"index\.sqlite(-wal|-shm|-journal)?\Z")
FINISHED_SHARD = re.compile(r"shard-\d{3,}-\d{6,}\.tar\Z")


@dataclass(frozen=True)
class SinkCase:
    id: str
    options: SinkOptions

    @property
    def abilities(self) -> SinkAbilities:
        """What the case's kind of sink declares it does (sinks/base.py): the suite holds
        each sink to it, and skips what it does not declare."""
        return sink_type(self.options).abilities


SINK_CASES = (
    SinkCase("null", SinkOptions(kind="null")),
    SinkCase("dir", SinkOptions(kind="dir")),
    # what `bulkfetch pull` uses (fsync), with hash-prefix directories
    SinkCase("dir-fanout-fsync", SinkOptions(kind="dir", fanout=2, fsync=True)),
    SinkCase("tar", SinkOptions(kind="tar")),
    # a shard takes no new page once it holds 3 files: pages spread over many shards
    SinkCase("tar-small-shards", SinkOptions(kind="tar", shard_files=3)),
    # bulkfetch.stream(): a page's bodies up to the caller's process as one message, and
    # the one-message-a-body kind it is measured against
    SinkCase("stream", SinkOptions(kind="stream")),
    SinkCase("stream-each", SinkOptions(kind="stream-each")),
)


class Outbox:
    """A worker's results channel as the stream sinks see it: what they sent, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, ...]] = []

    def put(self, message: tuple[object, ...]) -> None:
        self.sent.append(message)

    def bodies(self) -> list[tuple[str, bytes]]:
        """(name, body) of every body sent, decoded as bulkfetch.stream() decodes them."""
        found: list[tuple[str, bytes]] = []
        for message in self.sent:
            if message[0] == "body":
                found.append((str(message[1]), bytes(message[2])))  # type: ignore[arg-type]
                continue
            assert message[0] == "bodies", f"not a stream message: {message[0]!r}"
            _, _, names, sizes, data = message
            lengths = array("Q")
            lengths.frombytes(sizes)  # type: ignore[arg-type]
            assert sum(lengths) == len(data), "sizes do not add up to the page's buffer"  # type: ignore[arg-type]
            start = 0
            for name, size in zip(str(names).split("\0"), lengths, strict=True):
                found.append((name, data[start:start + size]))  # type: ignore[index]
                start += size
        return found


class SinkHarness:
    """DEST for one case, prepared like a run's, and the sinks opened on it."""

    def __init__(self, case: SinkCase, dest: Path) -> None:
        self.case = case
        self.dest = dest
        self.options = GetOptions(source="http://127.0.0.1:9/contract", dest=str(dest),
                                  sink=case.options)
        self.journal = Journal.open(dest, self.options.fingerprint())
        (dest / TMP_DIR).mkdir(parents=True, exist_ok=True)
        if case.options.kind == "tar":
            prepare_shards(dest, self.journal, restart=False)
        self.unclosed: list[Sink] = []
        self.outbox = Outbox()  # the stream sinks' channel, shared as the workers share it

    def open(self, worker: int = 0) -> Sink:
        sink = open_sink(self.case.options, self.dest, worker, self.outbox)
        self.unclosed.append(sink)
        return sink

    def close(self, sink: Sink) -> None:
        self.unclosed.remove(sink)
        sink.close()

    def finish(self) -> None:
        for sink in list(self.unclosed):
            self.close(sink)
        self.journal.close()

    # -- reading back ----------------------------------------------------------------------
    def stored(self) -> list[tuple[str, bytes]]:
        """(name, body) of everything stored under a final name, in storage order for tar
        (shards by name, members in order), by path for a directory."""
        kind = self.case.options.kind
        if kind == "tar":
            return self._tar_members()
        if kind.startswith("stream"):
            return self.outbox.bodies()
        found: list[tuple[str, bytes]] = []
        for root, dirs, files in os.walk(self.dest):
            relative = Path(root).relative_to(self.dest).parts
            if not relative:
                dirs[:] = [d for d in dirs if d != STATE]
            dirs.sort()
            for file in sorted(files):
                path = Path(root, file)
                assert not path.is_symlink(), f"a symlink under DEST: {path}"
                parts = (*relative, file)[self.case.options.fanout:]
                found.append(("/".join(parts), path.read_bytes()))
        return found

    def _tar_members(self) -> list[tuple[str, bytes]]:
        found: list[tuple[str, bytes]] = []
        for shard in sorted(p for p in self.dest.iterdir() if FINISHED_SHARD.match(p.name)):
            with tarfile.open(shard) as archive:
                for member in archive:
                    assert member.isfile(), f"{shard.name}: {member.name} is not a file"
                    extracted = archive.extractfile(member)
                    assert extracted is not None
                    found.append((member.name, extracted.read()))
        return found

    def stored_map(self) -> dict[str, bytes]:
        """name -> body; a name stored twice is a contract failure of its own."""
        stored = self.stored()
        names = [name for name, _ in stored]
        twice = sorted({name for name in names if names.count(name) > 1})
        assert not twice, f"stored more than once: {twice[:5]}"
        return dict(stored)

    # -- what must not be left ------------------------------------------------------------
    def temporaries(self) -> list[str]:
        """Files a finished sink must not leave: anything in DEST/.bulkfetch/tmp or
        .bulkfetch/partial, and any *.part file anywhere in DEST."""
        left: list[str] = []
        for where in (TMP_DIR, PARTIAL_DIR):
            for root, _, files in os.walk(self.dest / where):
                left += [str(Path(root, f).relative_to(self.dest)) for f in files]
        for root, _, files in os.walk(self.dest):
            left += [str(Path(root, f).relative_to(self.dest)) for f in files
                     if f.endswith(".part")]
        return sorted(set(left))

    def state_entries(self) -> list[str]:
        """What DEST/.bulkfetch holds beyond a run's own state (journal, lock, the sinks'
        tmp, partial and sums directories), and anything left in tmp or partial, even an
        empty directory (a worker's tmp directory goes with its sink)."""
        state = self.dest / STATE
        extra = sorted(set(os.listdir(state)) - STATE_ENTRIES)
        for where in (TMP_DIR, PARTIAL_DIR):
            if (self.dest / where).is_dir():
                extra += [f"{where}/{entry}" for entry in os.listdir(self.dest / where)]
        return extra

    def strangers(self, written: set[str]) -> list[str]:
        """Entries outside DEST/.bulkfetch that are neither a stored file of `written`
        (dir) nor a finished shard or its index (tar); the null sink may leave none."""
        kind = self.case.options.kind
        if kind == "tar":
            return sorted(entry.name for entry in self.dest.iterdir()
                          if entry.name != STATE and not FINISHED_SHARD.match(entry.name)
                          and not TAR_BOOKKEEPING.match(entry.name))
        if not self.case.abilities.resumes:
            return sorted(entry.name for entry in self.dest.iterdir() if entry.name != STATE)
        return sorted(name for name, _ in self.stored() if name not in written)
