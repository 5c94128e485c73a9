"""Data-parallel training with pmap on real clients: flax linen + optax adam (issue 13).

The loop is examples/pmap_training.py's (loaded as a module, so the example and
this test cannot drift apart): the same steps through partitioner.pmap and
jax.pmap give the same losses, under both of XLA's partitioners.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import jax
import numpy as np
import pytest

import partitioner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pmap_training.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pmap_training_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("partitioner_mode")
def test_flax_optax_data_parallel_training_matches_jax_pmap() -> None:
    ex = _example()
    ours, theirs = ex.train(partitioner.pmap), ex.train(jax.pmap)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0]


def test_the_updated_state_is_a_pytree_of_jax_arrays_on_the_devices() -> None:
    ex = _example()
    step = partitioner.pmap(ex.train_step, "batch", in_axes=(None, 0, 0), out_axes=None)
    x, y = ex.make_data()
    (params, opt_state), loss = step(ex.init_state(), x, y)
    leaves = jax.tree.leaves((params, opt_state, loss))
    assert leaves and all(isinstance(v, jax.Array) for v in leaves)
    assert all(len(v.sharding.device_set) == ex.DEVICES for v in leaves)
