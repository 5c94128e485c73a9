"""A train state saved with orbax by a 2-process 2x4 job restores into 1x8 and 4x2.

The job (``workers/checkpoint_save.py``) trains with pjit over a mesh whose "data"
axis spans its processes, so each process holds and writes only part of the
state. Here, in one process of 8 devices, orbax restores it onto other meshes
through abstract targets. Every leaf must arrive laid out as asked and hold the
saved values bit for bit, and those must be the values the same steps give under
``jax.jit``. That last comparison allows float32 rounding: the job's all-reduces
(gloo, across processes) add in another order than one device does, which moves
the last bits (measured: at most ~1e-7 relative); a wrong, misplaced or stale
shard is off by far more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding

from partitioner import PartitionSpec as P
from partitioner.testing.plugin import MeshFactory
from tests.distributed.mp_helpers import lines_of, run_job, values
from tests.distributed.workers import checkpoint_save as job

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The checkpoint the 2x4 job wrote, and the values it saved (leaf path -> array)."""
    tmp = tmp_path_factory.mktemp("checkpoint")
    done = run_job("checkpoint_save", str(tmp / "state"), str(tmp / "saved.npz"), timeout=120)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for process in (0, 1):
        assert "saved" in lines_of(done.stdout, process)
        # Each process held half of w1's shards: the save really was split.
        assert values(done.stdout, process, "holds ['params']['w1']") == ["4 8"]
    with np.load(tmp / "saved.npz") as npz:
        return tmp / "state", dict(npz)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """The job's init and steps under ``jax.jit`` in this process (leaf path -> array)."""
    x, y = job.make_data()
    state = jax.jit(job.init_state)(jax.random.key(0))
    step = jax.jit(job.train_step)
    for _ in range(job.STEPS):
        state = step(state, x, y)
    flat = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def restore_onto(directory: Path, mesh: Mesh) -> tuple[Any, Any]:
    """The state restored onto ``mesh`` with the job's specs, and the shardings asked for."""
    shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, s or P()),
        job.state_specs(),
        is_leaf=lambda s: s is None or isinstance(s, P),
    )
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        jax.eval_shape(job.init_state, jax.random.key(0)),
        shardings,
    )
    checkpointer = ocp.StandardCheckpointer()
    try:
        return checkpointer.restore(directory, target), shardings
    finally:
        checkpointer.close()


@pytest.mark.parametrize("shape", [(1, 8), (4, 2)], ids=["1x8", "4x2"])
def test_restores_onto_another_mesh(
    saved: tuple[Path, dict[str, np.ndarray]],
    reference: dict[str, np.ndarray],
    shape: tuple[int, int],
    mesh: MeshFactory,
) -> None:
    directory, saved_values = saved
    jax_mesh = mesh(shape, ("data", "model"))
    state, shardings = restore_onto(directory, jax_mesh)
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    assert sorted(jax.tree_util.keystr(p) for p, _ in flat) == sorted(saved_values)
    for (path, leaf), sharding in zip(flat, jax.tree.leaves(shardings), strict=True):
        name = jax.tree_util.keystr(path)
        assert leaf.sharding == sharding, name
        np.testing.assert_array_equal(leaf, saved_values[name], err_msg=name)
        want = reference[name]
        np.testing.assert_allclose(
            leaf, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=name
        )
