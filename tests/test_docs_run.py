"""Every Python block of README.md and docs/*.md runs as written (issue 8, item 8).

The blocks of one file run in order in one fresh interpreter (later blocks use
names the earlier ones define), bounded in time, so the documentation cannot
drift from the code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text())


def test_the_readme_has_runnable_blocks() -> None:
    assert len(python_blocks(ROOT / "README.md")) >= 4


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_blocks_run(path: Path, tmp_path: Path) -> None:
    script = tmp_path / f"{path.stem}_blocks.py"
    script.write_text("\n\n".join(python_blocks(path)))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"{path.name} blocks failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
