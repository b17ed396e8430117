"""The README's quick start and its library examples hold as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def run_example(marker: str, cwd: Path) -> str:
    """Run the README's python block containing `marker` as written; its stdout."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    chosen = [block for block in blocks if marker in block]
    assert chosen, f"the README has no python example with {marker}"
    result = subprocess.run([sys.executable, "-c", chosen[0]], cwd=cwd, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_library_example_runs(tmp_path: Path) -> None:
    assert "5,000 files, 0 failed, exit code 0" in run_example('"example-dest"', tmp_path)
    assert len(list((tmp_path / "example-dest").glob("f*"))) == 5000


def test_tar_example_runs(tmp_path: Path) -> None:
    assert "3,000 files in shards, 300,000 bytes" in run_example("open_dataset", tmp_path)
    assert list((tmp_path / "example-shards").glob("shard-*.tar"))


def test_quick_start_has_exactly_two_commands() -> None:
    text = README.read_text()
    quick = text[text.index("## Quick start"):text.index("## Downloading")]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.DOTALL)
    assert [c.strip() for c in commands] == ["pip install -e . && bulkfetch demo", "bash .ci/run"]
