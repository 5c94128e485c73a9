"""flax linen, t5x style: logical axis names, a TrainState, adamw and dropout under pjit.

Kernels and biases carry logical names (``nn.with_logical_partitioning``);
``nn.logical_axis_rules`` maps them to mesh axes. The state's spec tree is
``nn.get_partition_spec`` of the abstract ``TrainState`` (``jax.eval_shape``)
turned into mesh specs by ``nn.logical_to_mesh``. Init and the donated train
step both run through ``partitioner.pjit``; every loss is compared with jax.jit
given the same NamedShardings on the same inputs and dropout keys. The mesh is
set with ``jax.set_mesh``, where both pjit and flax's logical constraints find it.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from tests.clients.clients_helpers import assert_tree_laid_out, named_shardings
from tests.helpers import assert_close

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

D_MODEL, D_HIDDEN, BATCH, STEPS = 16, 64, 32, 24
RULES = (("batch", "data"), ("embed", None), ("mlp", "model"))
DATA = P("data")


def _dense(features: int, names: tuple[str, str]) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[1:]),
    )


class MLPBlock(nn.Module):
    """A t5x-style MLP block: embed -> mlp (split over "model") -> embed."""

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        h = nn.relu(_dense(D_HIDDEN, ("embed", "mlp"))(x))
        # A no-op unless jax.set_mesh gives flax a mesh, as the tests below do.
        h = nn.with_logical_constraint(h, ("batch", "mlp"))
        h = nn.Dropout(0.1, deterministic=not train)(h)
        return _dense(D_MODEL, ("mlp", "embed"))(h)


MODEL = MLPBlock()
TX = optax.adamw(1e-2, weight_decay=1e-2)


def init_state(key: jax.Array, x: jax.Array) -> TrainState:
    params = MODEL.init(key, x, train=False)["params"]
    return TrainState.create(apply_fn=MODEL.apply, params=params, tx=TX)


def train_step(
    state: TrainState, x: jax.Array, y: jax.Array, dropout_key: jax.Array
) -> tuple[TrainState, jax.Array]:
    def loss_fn(params: Any) -> jax.Array:
        pred = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": dropout_key})
        return jnp.mean((pred - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D_MODEL).astype(np.float32)
    y = np.tanh(x @ rng.randn(D_MODEL, D_MODEL).astype(np.float32))
    return x, y


INIT_KEY = jax.random.key(0)
DROPOUT_KEYS = jax.random.split(jax.random.key(1), STEPS)  # typed keys, one a step


@pytest.fixture(scope="module")
def state_specs() -> Any:
    """Mesh specs for the whole TrainState: step, params and adamw's mu / nu."""
    x, _ = _batch()
    abstract = jax.eval_shape(init_state, INIT_KEY, x)
    with nn.logical_axis_rules(RULES):
        return nn.logical_to_mesh(nn.get_partition_spec(abstract))


def _train(step: Any, state: TrainState, steps: int = STEPS) -> tuple[TrainState, list[float]]:
    x, y = _batch()
    losses = []
    for i in range(steps):
        state, loss = step(state, x, y, DROPOUT_KEYS[i])
        losses.append(float(loss))  # blocks each step (README "Known pitfall")
    return state, losses


@pytest.fixture(scope="module")
def reference(state_specs: Any) -> tuple[Any, list[float]]:
    """jax.jit's final params and losses, with the same NamedShardings.

    Run once for the module, so over a mesh built here: the plugin's ``mesh`` fixture
    builds one per test. It equals the tests' ``mesh_4x2``.
    """
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    shardings, data = named_shardings(mesh, state_specs), NamedSharding(mesh, DATA)
    init = jax.jit(init_state, in_shardings=(None, data), out_shardings=shardings)
    step = jax.jit(
        train_step,
        in_shardings=(shardings, data, data, None),
        out_shardings=(shardings, None),
        donate_argnums=0,
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        state, losses = _train(step, init(INIT_KEY, _batch()[0]))
    return jax.device_get(state.params), losses


def test_the_spec_tree_follows_the_logical_rules(state_specs: Any) -> None:
    params = state_specs.params
    assert params["Dense_0"]["kernel"] == P(None, "model")
    assert params["Dense_0"]["bias"] == P("model")
    assert params["Dense_1"]["kernel"] == P("model", None)
    assert params["Dense_1"]["bias"] == P(None)
    adam = state_specs.opt_state[0]
    assert adam.mu == params and adam.nu == params and adam.count == P()


def test_logical_constraints_reach_the_lowered_module(mesh_4x2, state_specs) -> None:
    """Under jax.set_mesh, nn.with_logical_constraint pins the hidden layer in the StableHLO."""
    step = pjit(train_step, (state_specs, DATA, DATA, None), (state_specs, None))
    x, y = _batch()
    with (
        jax.set_mesh(mesh_4x2),
        nn.logical_axis_rules(RULES),
        partitioner.spmd_partitioner("shardy"),
    ):
        state = pjit(init_state, (None, DATA), state_specs)(INIT_KEY, x)
        text = step.lower(state, x, y, DROPOUT_KEYS[0]).as_text()
    hidden = f"tensor<{BATCH}x{D_HIDDEN}xf32>"
    assert any(
        '<@mesh, [{"data"}, {"model"}]>' in line and line.endswith(hidden)
        for line in text.splitlines()
        if "sdy.sharding_constraint" in line
    ), text


def test_training_matches_jax_jit(partitioner_mode, mesh_4x2, state_specs, reference) -> None:
    ref_params, ref_losses = reference
    init = pjit(init_state, (None, DATA), state_specs)
    step = pjit(train_step, (state_specs, DATA, DATA, None), (state_specs, None), donate_argnums=0)
    with jax.set_mesh(mesh_4x2), nn.logical_axis_rules(RULES):
        state = init(INIT_KEY, _batch()[0])
        assert_tree_laid_out(state, mesh_4x2, state_specs)  # sharded by init's out specs
        state, losses = _train(step, state)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    assert losses[-1] < 0.5 * losses[0], losses
    assert_close(state.params, ref_params)
    assert_tree_laid_out(state, mesh_4x2, state_specs)


def test_the_donated_state_is_deleted_and_reusing_it_raises(mesh_4x2, state_specs) -> None:
    init = pjit(init_state, (None, DATA), state_specs)
    step = pjit(train_step, (state_specs, DATA, DATA, None), (state_specs, None), donate_argnums=0)
    x, y = _batch()
    # partitioner.mesh, the classic context: flax's logical constraints are no-ops under it.
    with partitioner.mesh(mesh_4x2.devices, mesh_4x2.axis_names), nn.logical_axis_rules(RULES):
        old = init(INIT_KEY, x)
        state, loss = step(old, x, y, DROPOUT_KEYS[0])
        float(loss)
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))
        with pytest.raises(
            RuntimeError,
            match=r"(?s)^Array has been deleted.*argument state\.step is an array that has been deleted",
        ):
            step(old, x, y, DROPOUT_KEYS[1])
        # The process is fine and the live state still steps.
        state, loss = step(state, x, y, DROPOUT_KEYS[1])
        assert np.isfinite(float(loss))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))


def test_jax_jit_around_the_pjit_step(
    jax_partitioner_mode, mesh_4x2, state_specs, reference
) -> None:
    """``jax.jit(pjit(step))`` with numpy (uncommitted) batches: same losses and layouts."""
    ref_params, ref_losses = reference
    init = pjit(init_state, (None, DATA), state_specs)
    inner = pjit(train_step, (state_specs, DATA, DATA, None), (state_specs, None), donate_argnums=0)
    step = jax.jit(inner, donate_argnums=0)
    with jax.set_mesh(mesh_4x2), nn.logical_axis_rules(RULES):
        state, losses = _train(step, init(INIT_KEY, _batch()[0]))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    assert_close(state.params, ref_params)
    assert_tree_laid_out(state, mesh_4x2, state_specs)
