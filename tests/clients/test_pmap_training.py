"""Data-parallel training with pmap on real clients: flax linen + optax adam.

The loop is examples/pmap_training.py's (loaded as a module, so the example and
this test cannot drift apart): the same steps through partitioner.pmap and
jax.pmap give the same losses, under both of XLA's partitioners.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import partitioner
from tests.clients.clients_helpers import load_example

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("partitioner_mode")
def test_flax_optax_data_parallel_training_matches_jax_pmap() -> None:
    ex = load_example("pmap_training")
    ours, theirs = ex.train(partitioner.pmap), ex.train(jax.pmap)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0]


def test_the_updated_state_is_a_pytree_of_jax_arrays_on_the_devices() -> None:
    ex = load_example("pmap_training")
    step = partitioner.pmap(ex.train_step, "batch", in_axes=(None, 0, 0), out_axes=None)
    x, y = ex.make_data()
    (params, opt_state), loss = step(ex.init_state(), x, y)
    leaves = jax.tree.leaves((params, opt_state, loss))
    assert leaves and all(isinstance(v, jax.Array) for v in leaves)
    assert all(len(v.sharding.device_set) == ex.DEVICES for v in leaves)
