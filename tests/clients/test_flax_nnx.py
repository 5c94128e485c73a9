"""flax nnx: eagerly sharded modules, ``nnx.split`` state and an optax optimizer under pjit.

The model is built under ``jax.set_mesh`` with ``nnx.with_partitioning``, so its
parameters are created sharded. ``nnx.split`` gives the parameter and the
rest (dropout's RNG key and count) states; ``nnx.get_partition_spec`` of each
is used directly as pjit's spec tree, and the optimizer state's specs come from
the parameter specs through ``optax.tree_map_params``. The donated step is
compared with jax.jit given the same NamedShardings.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from partitioner import PartitionSpec as P
from partitioner import pjit
from tests.clients.clients_helpers import (
    assert_specs_mirror,
    assert_tree_laid_out,
    named_shardings,
)
from tests.helpers import assert_close

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

D_IN, D_HIDDEN, D_OUT, BATCH, STEPS = 16, 64, 8, 32, 10
DATA = P("data")


def _sharded(init: Any, names: tuple[str | None, ...]) -> Any:
    return nnx.with_partitioning(init, names)


class MLP(nnx.Module):
    """Linear (columns over "model") -> LayerNorm -> dropout -> Linear (rows over "model")."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init, zeros, ones = (
            nnx.initializers.lecun_normal(),
            nnx.initializers.zeros,
            nnx.initializers.ones,
        )
        self.up = nnx.Linear(
            D_IN,
            D_HIDDEN,
            kernel_init=_sharded(init, (None, "model")),
            bias_init=_sharded(zeros, ("model",)),
            rngs=rngs,
        )
        self.norm = nnx.LayerNorm(
            D_HIDDEN,
            scale_init=_sharded(ones, ("model",)),
            bias_init=_sharded(zeros, ("model",)),
            rngs=rngs,
        )
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.down = nnx.Linear(
            D_HIDDEN, D_OUT, kernel_init=_sharded(init, ("model", None)), rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.drop(jax.nn.relu(self.norm(self.up(x)))))


TX = optax.adamw(1e-2, weight_decay=1e-2)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D_IN).astype(np.float32)
    y = np.tanh(x @ rng.randn(D_IN, D_OUT).astype(np.float32))
    return x, y


def _split_model() -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """A fresh model (same seeds every time), split into graph, params and the rest."""
    return nnx.split(MLP(nnx.Rngs(0, dropout=1)), nnx.Param, ...)


def _step_fn(graphdef: nnx.GraphDef) -> Any:
    def train_step(params: Any, rest: Any, opt_state: Any, x: Any, y: Any) -> Any:
        model = nnx.merge(graphdef, params, rest)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        _, params, rest = nnx.split(model, nnx.Param, ...)  # dropout advanced its RNG count
        updates, opt_state = TX.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), rest, opt_state, loss

    return train_step


def _specs(params: Any, rest: Any, opt_state: Any) -> tuple[Any, Any, Any]:
    param_specs = nnx.get_partition_spec(params)
    opt_specs = optax.tree_map_params(
        TX, lambda _, spec: spec, opt_state, param_specs, transform_non_params=lambda _: None
    )
    return param_specs, nnx.get_partition_spec(rest), opt_specs


def _train(step: Any, state: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[float]]:
    x, y = _batch()
    losses = []
    for _ in range(STEPS):
        *state, loss = step(*state, x, y)
        losses.append(float(loss))  # blocks each step (README "Known pitfall")
    return tuple(state), losses


def test_eager_sharding_gives_the_spec_tree(mesh_4x2) -> None:
    with jax.set_mesh(mesh_4x2):
        _, params, rest = _split_model()
        opt_state = TX.init(params)
    param_specs, rest_specs, opt_specs = _specs(params, rest, opt_state)
    assert param_specs["up"]["kernel"].get_value() == P(None, "model")
    assert param_specs["down"]["kernel"].get_value() == P("model", None)
    assert param_specs["down"]["bias"].get_value() == P()
    assert_tree_laid_out(params, mesh_4x2, param_specs)  # created sharded, no pjit needed
    assert_specs_mirror(opt_specs, opt_state)  # adamw's EmptyStates stay empty nodes
    adam = opt_specs[0]
    assert adam.count is None and adam.mu == param_specs and adam.nu == param_specs
    assert jax.tree.leaves(rest_specs) == [P(), P()]  # dropout's RNG count and key


def test_training_matches_jax_jit(partitioner_mode, mesh_4x2) -> None:
    with jax.set_mesh(mesh_4x2):
        graphdef, params, rest = _split_model()
        opt_state = TX.init(params)
        specs = _specs(params, rest, opt_state)
        train_step = _step_fn(graphdef)
        step = pjit(train_step, (*specs, DATA, DATA), (*specs, None), donate_argnums=(0, 1, 2))
        (params, rest, opt_state), losses = _train(step, (params, rest, opt_state))

        shardings = tuple(named_shardings(mesh_4x2, s) for s in specs)
        data = NamedSharding(mesh_4x2, DATA)
        ref_step = jax.jit(
            train_step,
            in_shardings=(*shardings, data, data),
            out_shardings=(*shardings, None),
            donate_argnums=(0, 1, 2),
        )
        _, ref_params, ref_rest = _split_model()
        (ref_params, ref_rest, ref_opt), ref_losses = _train(
            ref_step, (ref_params, ref_rest, TX.init(ref_params))
        )

    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    assert losses[-1] < 0.5 * losses[0], losses
    assert_close(params, ref_params)
    assert_close(opt_state, ref_opt)
    assert (
        int(rest["drop"]["rngs"]["count"].get_value())
        == STEPS
        == int(ref_rest["drop"]["rngs"]["count"].get_value())
    )
    for tree, spec in zip((params, rest, opt_state), specs):
        assert_tree_laid_out(tree, mesh_4x2, spec)


def test_the_donated_state_is_deleted(mesh_4x2) -> None:
    x, y = _batch()
    with jax.set_mesh(mesh_4x2):
        graphdef, params, rest = _split_model()
        opt_state = TX.init(params)
        specs = _specs(params, rest, opt_state)
        step = pjit(
            _step_fn(graphdef), (*specs, DATA, DATA), (*specs, None), donate_argnums=(0, 1, 2)
        )
        old = (params, rest, opt_state)
        *new, loss = step(*old, x, y)
        float(loss)
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))
        with pytest.raises(RuntimeError, match="deleted"):
            step(*old, x, y)
        *new, loss = step(*new, x, y)
        assert np.isfinite(float(loss))
