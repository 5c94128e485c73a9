"""optax optimizers whose states hold empty and masked nodes, under a donated pjit step.

Each optimizer's state is a pytree with ``EmptyState()``, ``MaskedState`` /
``MaskedNode()`` or ``()`` nodes next to copies of the parameter tree. Its spec
tree is built by mapping over the (abstract) state itself, so every empty node
stays an empty node there; the state is initialised and updated through pjit
and compared step by step with jax.jit given the same NamedShardings.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.tree_util import DictKey

import partitioner
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

D_IN, D_HIDDEN, D_OUT, BATCH, STEPS = 16, 64, 8, 32, 6
DATA = P("data")

#: Sharded and replicated leaves: Megatron-style weights, a replicated bias and scalar.
PARAM_SPECS: dict[str, Any] = {
    "w1": P(None, "model"),
    "b1": P("model"),
    "w2": P("model", None),
    "b2": None,
    "scale": None,
}
LABELS = {"w1": "train", "b1": "train", "w2": "train", "b2": "frozen", "scale": "frozen"}
ADAM_ON_WEIGHTS = {"w1": True, "b1": False, "w2": True, "b2": False, "scale": False}

#: name -> (optimizer, the kinds of empty node its state holds)
OPTIMIZERS: dict[str, tuple[optax.GradientTransformation, set[type]]] = {
    "adamw": (optax.adamw(1e-3), {optax.EmptyState}),
    "clip+adamw": (
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
        {optax.EmptyState},
    ),
    "multi_transform(frozen)": (
        optax.multi_transform({"train": optax.adam(1e-3), "frozen": optax.set_to_zero()}, LABELS),
        {optax.EmptyState, optax.MaskedNode},
    ),
    "MultiSteps": (optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2), {optax.EmptyState}),
    "masked(adam)": (
        optax.chain(optax.masked(optax.scale_by_adam(), ADAM_ON_WEIGHTS), optax.scale(-1e-3)),
        {optax.EmptyState, optax.MaskedNode},
    ),
    "adamw(mask=)": (optax.adamw(1e-3, mask=ADAM_ON_WEIGHTS), {optax.EmptyState}),
}


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    return {
        "w1": (rng.randn(D_IN, D_HIDDEN) / np.sqrt(D_IN)).astype(np.float32),
        "b1": np.zeros(D_HIDDEN, np.float32),
        "w2": (rng.randn(D_HIDDEN, D_OUT) / np.sqrt(D_HIDDEN)).astype(np.float32),
        "b2": np.full(D_OUT, 0.1, np.float32),
        "scale": np.float32(1.0),
    }


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    x = rng.randn(BATCH, D_IN).astype(np.float32)
    y = np.tanh(x @ rng.randn(D_IN, D_OUT).astype(np.float32))
    return x, y


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    pred = params["scale"] * (h @ params["w2"] + params["b2"])
    return jnp.mean((pred - y) ** 2)


def opt_state_specs(abstract_state: Any) -> Any:
    """A spec per state leaf: a copy of a parameter gets that parameter's spec.

    Optimizer states hold copies of the parameter dict (``mu``, ``nu``,
    ``acc_grads``, masked copies), so a leaf reached through ``[name]`` for a
    parameter ``name`` of the same shape is laid out like it; counters and
    other scalars are replicated. Mapping over the state keeps its empty nodes.
    """
    shapes = {k: np.shape(v) for k, v in init_params().items()}

    def spec(path: tuple[Any, ...], leaf: Any) -> Any:
        last = path[-1] if path else None
        if isinstance(last, DictKey) and shapes.get(last.key) == leaf.shape:
            return PARAM_SPECS[last.key]
        return None

    return jax.tree_util.tree_map_with_path(spec, abstract_state)


def _empty_kinds(state: Any) -> set[type]:
    kinds = (optax.EmptyState, optax.MaskedNode)
    nodes = jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, kinds))
    return {type(n) for n in nodes if isinstance(n, kinds)}


def _update_fn(tx: optax.GradientTransformation) -> Any:
    def update(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return update


def _run(init: Any, update: Any) -> tuple[list[Any], list[Any], list[float]]:
    """STEPS updates from the same start; the params after each, the final opt state, losses."""
    x, y = _batch()
    params = init_params()
    opt_state = init(params)
    history, losses = [], []
    for _ in range(STEPS):
        params, opt_state, loss = update(params, opt_state, x, y)
        losses.append(float(loss))  # blocks each step (README "Known pitfall")
        history.append(jax.device_get(params))
    return history, [params, opt_state], losses


#: Each optimizer under one of XLA's partitioners, in turn: what differs between the chains
#: is their state's pytree, which both partitioners see the same (the other test files run
#: every step under both).
CASES = [(name, ("gspmd", "shardy")[k % 2]) for k, name in enumerate(OPTIMIZERS)]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_donated_update_matches_jax_jit(mesh_4x2, name: str, mode: str) -> None:
    with partitioner.spmd_partitioner(mode):
        check_donated_update(mesh_4x2, name)


def check_donated_update(mesh: Mesh, name: str) -> None:
    tx, empty_kinds = OPTIMIZERS[name]
    abstract_state = jax.eval_shape(tx.init, init_params())
    assert _empty_kinds(abstract_state) == empty_kinds
    opt_specs = opt_state_specs(abstract_state)
    assert_specs_mirror(opt_specs, abstract_state)

    update = _update_fn(tx)
    with jax.set_mesh(mesh):
        init = pjit(tx.init, (PARAM_SPECS,), opt_specs)
        step = pjit(
            update,
            (PARAM_SPECS, opt_specs, DATA, DATA),
            (PARAM_SPECS, opt_specs, None),
            donate_argnums=(0, 1),
        )
        history, (params, opt_state), losses = _run(init, step)

    param_sh, opt_sh = named_shardings(mesh, PARAM_SPECS), named_shardings(mesh, opt_specs)
    data = NamedSharding(mesh, DATA)
    ref_init = jax.jit(tx.init, in_shardings=(param_sh,), out_shardings=opt_sh)
    ref_step = jax.jit(
        update,
        in_shardings=(param_sh, opt_sh, data, data),
        out_shardings=(param_sh, opt_sh, None),
        donate_argnums=(0, 1),
    )
    ref_history, (_, ref_opt_state), ref_losses = _run(ref_init, ref_step)

    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(history, ref_history, strict=True):
        assert_close(got, want)
    assert_close(opt_state, ref_opt_state)
    assert_tree_laid_out(params, mesh, PARAM_SPECS)
    assert_tree_laid_out(opt_state, mesh, opt_specs)
    assert losses[-1] < losses[0], losses
    if name == "multi_transform(frozen)":
        start = init_params()
        for frozen in ("b2", "scale"):
            np.testing.assert_array_equal(params[frozen], start[frozen])
