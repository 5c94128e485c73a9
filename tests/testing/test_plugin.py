"""partitioner's pytest plugin, in a fresh project with no conftest.

Each run is a new ``python -m pytest`` in a temporary folder, bounded in time
(``timeout -k``), with the device settings this suite runs under (``XLA_FLAGS`` with
8 devices, which this suite gets from the plugin itself) removed from its environment, so only the plugin
can give it devices. The test file it runs is the one the how-to
(docs/howto/property-tests.md) shows, and the ini setting is the one it shows.

The plugin reaches pytest the way a user's does: through the ``pytest11`` entry point,
where partitioner is installed with it (CI's ``pip install -e ".[test]"``; a run under
``CI`` fails if the entry point is missing). Where it is not (a worktree run against an
environment installed from another checkout), the run names the plugin module with
``-p`` instead, and a separate test checks that pyproject.toml's entry point names that
module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import jax
import pytest
from jax.sharding import AxisType

ROOT = Path(__file__).resolve().parents[2]
HOWTO = ROOT / "docs" / "howto" / "property-tests.md"
PLUGIN = "_partitioner_pytest"
TIMEOUT_S = 240

#: How the plugin is loaded here: its entry point, else named with -p.
INSTALLED = any(
    e.name == "partitioner" and e.value == PLUGIN for e in entry_points(group="pytest11")
)


def _block(fence: str, first_line: str) -> str:
    """The how-to's block fenced ``fence`` whose first line is ``first_line``."""
    text = HOWTO.read_text()
    pattern = rf"^```{fence}\n({re.escape(first_line)}\n.*?)^```"
    found = re.search(pattern, text, re.S | re.M)
    assert found, f"{HOWTO.name} has no ```{fence} block starting {first_line!r}"
    return found.group(1)


def _project(tmp_path: Path, ini: str | None = None) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_sharding_rules.py").write_text(_block("py", "# test_sharding_rules.py"))
    if ini is not None:
        (project / "pyproject.toml").write_text(ini)
    return project


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    dropped = {"XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PYTHONPATH"] = str(ROOT)  # this checkout's partitioner, whichever is installed
    load = [] if INSTALLED else ["-p", PLUGIN]
    command = ["timeout", "-k", "10", str(TIMEOUT_S), sys.executable, "-m", "pytest"]
    command += ["-p", "no:cacheprovider", "-rs", *load, *args]
    return subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=TIMEOUT_S + 30
    )


def _outcome(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"


def test_the_entry_point_names_the_plugin_module() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"partitioner": PLUGIN}
    extras = project["optional-dependencies"]
    # The user-facing extra is named after what it installs, not `testing` (taken for `test`).
    assert extras["hypothesis"] == ["hypothesis"] and "testing" not in extras
    if os.environ.get("CI"):
        assert INSTALLED, "CI installs partitioner, so its pytest11 entry point must be there"


def test_this_suite_gets_its_eight_devices_from_the_plugin() -> None:
    """The suite is the plugin's first user: pyproject.toml's ini setting gives the 8
    devices (tests/conftest.py sets no count), and the XLA flags the conftest appends
    afterwards are in the environment jax created its backends from."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["virtual_devices"] == 8
    assert (
        "xla_force_host_platform_device_count" not in (ROOT / "tests" / "conftest.py").read_text()
    )
    assert jax.device_count() == 8
    flags = os.environ["XLA_FLAGS"].split()
    assert "--xla_force_host_platform_device_count=8" in flags
    assert "--xla_cpu_collective_timeout_seconds=60" in flags
    assert "--xla_backend_optimization_level=0" in flags  # as README.md says


def test_the_mesh_fixture_takes_axis_types_as_the_whole_kit_does(mesh: Any) -> None:
    explicit = mesh((4, 2), ("a", "b"), axis_types="explicit")  # one for every axis, by name
    assert explicit.axis_types == (AxisType.Explicit,) * 2
    mixed = mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto, "Explicit"))  # one per axis
    assert mixed.axis_types == (AxisType.Auto, AxisType.Explicit)
    with pytest.raises(ValueError, match=r"gives 1 types for the 2 axes \('a', 'b'\)"):
        mesh((4, 2), ("a", "b"), axis_types=[AxisType.Auto])
    with pytest.raises(ValueError, match=r"mesh: axis_types must be .* got 'sideways'"):
        mesh((4, 2), ("a", "b"), axis_types="sideways")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_virtual_devices_in_a_fresh_project(tmp_path: Path) -> None:
    """``pytest --virtual-devices 8`` with no conftest: 8 devices, the fixture, the marker."""
    done = _pytest(_project(tmp_path), "--virtual-devices", "8")
    assert done.returncode == 0, _outcome(done)
    assert re.search(r"\b3 passed, 1 skipped\b", done.stdout), _outcome(done)
    assert "needs 16 devices, jax has 8" in done.stdout, _outcome(done)
    if INSTALLED:  # pytest names the plugins it loaded from entry points
        assert re.search(r"^plugins:.*\bpartitioner-", done.stdout, re.M), _outcome(done)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_without_the_option_the_plugin_changes_nothing(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path), "-k", "not round_trip")  # the property needs no run
    assert done.returncode == 1, _outcome(done)
    assert "assert 1 == 8" in done.stdout, _outcome(done)  # jax's one CPU device
    assert "a (4, 2) mesh needs 8 devices, there are 1" in done.stdout, _outcome(done)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_ini_setting_and_the_option_winning_over_it(tmp_path: Path) -> None:
    ini = _block("toml", "[tool.pytest.ini_options]")
    assert "virtual_devices = 8" in ini
    project = _project(tmp_path, ini.replace("virtual_devices = 8", "virtual_devices = 4"))
    done = _pytest(project, "-k", "devices_are_there")
    assert done.returncode == 1 and "assert 4 == 8" in done.stdout, _outcome(done)
    done = _pytest(project, "-k", "devices_are_there", "--virtual-devices", "8")
    assert done.returncode == 0, _outcome(done)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_devices_created_before_the_plugin_are_a_usage_error(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "early_jax.py").write_text("import jax\n\njax.devices()\n")
    done = _pytest(project, "-p", "early_jax", "--virtual-devices", "8")
    assert done.returncode == 4, _outcome(done)  # pytest's usage error
    assert "--virtual-devices 8: jax's devices were created before" in done.stderr
    assert "(jax has 1 devices)" in done.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_bad_counts_are_usage_errors(tmp_path: Path) -> None:
    project = _project(tmp_path, '[tool.pytest.ini_options]\nvirtual_devices = "many"\n')
    done = _pytest(project)
    assert done.returncode == 4, _outcome(done)
    assert "the ini setting virtual_devices must be a whole number, got 'many'" in done.stderr
