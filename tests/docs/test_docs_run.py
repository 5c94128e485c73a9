"""Every Python block of README.md and docs/*.md runs as written.

The blocks of one file run in order in one fresh interpreter (later blocks use
names the earlier ones define), bounded in time, without the device count this suite
sets for itself, so the documentation cannot drift from the code. A ```` ```py ```` block is shown (highlighted) but not run: the
switching pages keep old code for APIs jax no longer has (the 2022 pjit,
host_callback) in such blocks, beside the runnable ```` ```python ```` version.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


#: A block that starts with ``# examples/<file>.py`` shows that file: it must match it
#: exactly, and it runs where the file runs (a multi-process example runs under the
#: launcher in tests/distributed/), not here.
_SHOWN_FILE = re.compile(r"^# (examples/\S+\.py)")


def python_blocks(path: Path) -> list[str]:
    return [b for b in _BLOCK.findall(path.read_text()) if not _SHOWN_FILE.match(b)]


def test_blocks_showing_a_file_match_it() -> None:
    shown = 0
    for path in DOCS:
        for block in _BLOCK.findall(path.read_text()):
            match = _SHOWN_FILE.match(block)
            if match:
                shown += 1
                assert block == (ROOT / match.group(1)).read_text(), (
                    f"{path.name}: {match.group(1)}"
                )
    assert shown >= 1


def test_the_readme_has_runnable_blocks() -> None:
    assert len(python_blocks(ROOT / "README.md")) >= 4


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in DOCS if python_blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_blocks_run(path: Path, tmp_path: Path) -> None:
    script = tmp_path / f"{path.stem}_blocks.py"
    script.write_text("\n\n".join(python_blocks(path)))
    # Without the 8 devices this suite runs under (partitioner's pytest plugin sets XLA_FLAGS): a
    # page must set its own device count, as a reader's fresh interpreter needs it to.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    # This checkout's partitioner, whatever an environment has installed (a worktree's
    # pages test its own code, as tests/helpers.run_json's processes do).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"{path.name} blocks failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
