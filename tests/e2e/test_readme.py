"""The README's library example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_library_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "the README has no python example"
    result = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "5,000 files, 0 failed, exit code 0" in result.stdout
    assert len(list((tmp_path / "example-dest").glob("f*"))) == 5000


def test_quick_start_has_exactly_two_commands() -> None:
    text = README.read_text()
    quick = text[text.index("## Quick start"):text.index("## Downloading")]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.DOTALL)
    assert [c.strip() for c in commands] == ["pip install -e . && bulkfetch demo", "bash .ci/run"]
