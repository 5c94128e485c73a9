"""The wheel a user installs: type marker, testing helpers and the pytest plugin in it.

``nox -s package`` installs the wheel into a fresh venv and runs the quick start from
it; this test is the part of that check the suite can afford: build the wheel from a
copy of the package and read what is in it.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_wheel_ships_py_typed_testing_and_plugin(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("partitioner", "_partitioner_pytest"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("partitioner-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        plugin_entry = zf.read(entry_points).decode()
    assert "partitioner/py.typed" in names
    assert {"partitioner/testing/plugin.py", "partitioner/testing/strategies.py"} <= names
    assert "_partitioner_pytest/__init__.py" in names
    assert "[pytest11]\npartitioner = _partitioner_pytest" in plugin_entry
