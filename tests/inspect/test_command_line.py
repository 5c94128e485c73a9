"""``python -m partitioner.inspect`` on a CPU gives jax the devices its ``--mesh`` needs.

Each run is a fresh process, bounded in time (``timeout -k``), with the device count
this suite runs under (``XLA_FLAGS``' entry, ``JAX_NUM_CPU_DEVICES``) removed from its
environment, so only the command can give it devices (or too few, which it raises). The
module it reports on builds an array when imported: the count is set before the module
is imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAG = "--xla_force_host_platform_device_count"
TIMEOUT_S = 120

MODEL = """\
import jax.numpy as jnp

SCALE = jnp.float32(2.0)  # an array, made when the module is imported


def step(x, w):
    return jnp.tanh(x @ w) * SCALE
"""

#: A module that sets jax's device count itself, then creates its devices.
SETS_ITS_OWN_COUNT = """\
import jax

jax.config.update("jax_num_cpu_devices", 2)
ONE = jax.numpy.ones(())


def step(x, w):
    return x @ w
"""

ARGS = ["--mesh", "data=4,model=2", "--arg", "f32[32,16]", "--in", "P(None, 'model')"]
ARGS += ["--arg", "f32[16,8]", "--in", "P('model')"]


def _inspect(
    tmp_path: Path, source: str, extra_flags: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python -m partitioner.inspect mymodel:step ARGS`` with no device count set."""
    (tmp_path / "mymodel.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    kept = re.sub(rf"{FLAG}=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*kept, *extra_flags.split()])
    env["JAX_PLATFORMS"] = "cpu"  # as on a machine without an accelerator
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    command = ["timeout", "-k", "5", str(TIMEOUT_S), sys.executable, "-m", "partitioner.inspect"]
    return subprocess.run(
        [*command, "mymodel:step", *ARGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S + 30,
    )


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("extra_flags", ["", f"{FLAG}=2"], ids=["no count", "too few"])
def test_the_command_sets_the_cpu_devices_its_mesh_needs(tmp_path: Path, extra_flags: str) -> None:
    done = _inspect(tmp_path, MODEL, extra_flags)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "over mesh data=4 x model=2" in done.stdout, done.stdout
    assert "all-reduce" in done.stdout and "over 'model'" in done.stdout, done.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_module_changing_the_count_when_imported_is_named(tmp_path: Path) -> None:
    done = _inspect(tmp_path, SETS_ITS_OWN_COUNT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        "needs 8 devices, the backend has 2 (jax was to create 8 or more CPU devices, but the "
        "module imported set another count (jax_num_cpu_devices)"
    ) in done.stderr, done.stderr[-2000:]
