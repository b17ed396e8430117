"""--sink tar keeps webdataset samples whole (issue 19): a tree of samples of 1-3 members
(nested directories, multi-dot extensions) served with `bulkfetch serve --root` through
faults, fetched by 2 workers into small shards, read back by the webdataset package; and
the same after kill -9 twice and a rerun."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from getkit import kill_after_pages

from bulkfetch.testing import ReferenceServer, read_samples, write_sample_tree

SAMPLES = 3000
PAGE = 50


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("samples") / "src"
    return root, write_sample_tree(root, SAMPLES, seed=19)


@pytest.fixture(scope="module")
def server(tree: tuple[Path, dict[str, dict[str, str]]]) -> Iterator[ReferenceServer]:
    with ReferenceServer("--root", str(tree[0]), "--page-size", str(PAGE), "--latency", "3",
                         "--fail-rate", "0.02", "--reset-rate", "0.01") as running:
        yield running


def command(url: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "bulkfetch", "get", url, str(dest), "--sink", "tar",
            "--shard-files", "120", "-w", "2", "--quiet"]


def test_webdataset_reads_every_sample_whole_through_faults(
        server: ReferenceServer, tree: tuple[Path, dict[str, dict[str, str]]],
        tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    done = subprocess.run(command(server.url, dest), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    count, found = read_samples(dest)
    assert count == SAMPLES
    assert found == tree[1]
    assert len(list(dest.glob("shard-*.tar"))) > 10  # samples met many shard boundaries


def test_kill_9_at_two_moments_then_a_rerun_still_gives_every_sample_once(
        server: ReferenceServer, tree: tuple[Path, dict[str, dict[str, str]]],
        tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    pages = -(-sum(map(len, tree[1].values())) // PAGE)
    rng = random.Random()
    moments = sorted((rng.randint(3, pages // 3), rng.randint(pages // 3 + 3, 2 * pages // 3)))
    for moment in moments:
        run = subprocess.Popen(command(server.url, dest), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        kill_after_pages(run, dest, moment)
    final = subprocess.run(command(server.url, dest), capture_output=True, text=True,
                           timeout=300)
    assert final.returncode == 0, final.stderr
    count, found = read_samples(dest)
    assert (count, moments) == (SAMPLES, moments)
    assert found == tree[1]
