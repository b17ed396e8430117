"""The README's quick start and its library examples hold as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_library_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    example = [block for block in blocks if '"example-dest"' in block]
    assert example, "the README has no download() example"
    result = subprocess.run([sys.executable, "-c", example[0]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "5,000 files, 0 failed, exit code 0" in result.stdout
    assert len(list((tmp_path / "example-dest").glob("f*"))) == 5000


def test_tar_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    tar = [block for block in blocks if "open_dataset" in block]
    assert tar, "the README has no open_dataset example"
    result = subprocess.run([sys.executable, "-c", tar[0]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "3,000 files in shards, 300,000 bytes" in result.stdout
    assert list((tmp_path / "example-shards").glob("shard-*.tar"))


def test_quick_start_has_exactly_two_commands() -> None:
    text = README.read_text()
    quick = text[text.index("## Quick start"):text.index("## Downloading")]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.DOTALL)
    assert [c.strip() for c in commands] == ["pip install -e . && bulkfetch demo", "bash .ci/run"]
