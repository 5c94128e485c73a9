"""NOTE [loop-safe layouts]: ``state = step(state, batch)`` with AUTO state runs for
any number of steps, AdamW included, whether the outputs are AUTO or left to XLA;
a committed argument laid out otherwise is an error naming the output that laid it out."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P

STEPS, D, FF, LAYERS = 4, 32, 64, 4


def _params(key: jax.Array) -> dict[str, Any]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (64, D)) * 0.1,
        "w1": jax.random.normal(k2, (LAYERS, D, FF)) / math.sqrt(D),
        "w2": jax.random.normal(k3, (LAYERS, FF, D)) / math.sqrt(FF) / 4,
    }


def _loss(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    h = params["embed"][tokens]

    def layer(h: jax.Array, w: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return h + jax.nn.gelu(h @ w[0]) @ w[1], None

    h = jax.lax.scan(layer, h, (params["w1"], params["w2"]))[0]
    return jnp.mean((h @ params["embed"].T) ** 2)


OPTIMIZER = optax.adamw(1e-2)


def _step(state: tuple[Any, Any], tokens: jax.Array) -> tuple[tuple[Any, Any], jax.Array]:
    params, opt_state = state
    loss, grads = jax.value_and_grad(_loss)(params, tokens)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss


def _state() -> tuple[Any, Any]:
    params = _params(jax.random.key(0))
    return params, OPTIMIZER.init(params)


@pytest.mark.parametrize("outputs", ["left to XLA", "AUTO"])
def test_an_adamw_loop_runs_its_steps_with_auto_state(mesh, outputs: str) -> None:
    mesh_3 = mesh((2, 2, 2), ("a", "b", "c"))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (16, 8)))
    batch = NamedSharding(mesh_3, P("a"))
    kwargs = {} if outputs == "left to XLA" else {"out_shardings": (AUTO, None)}
    partitioner.clear_caches()
    ours = partitioner.jit(_step, in_shardings=(AUTO, batch), **kwargs)
    theirs = jax.jit(_step)
    state, want = _state(), _state()
    for _ in range(STEPS):
        state, loss = ours(state, tokens)
        want, want_loss = theirs(want, tokens)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-4)
    laid = ours.lower(_state(), tokens).compile().input_shardings[0][0]
    wanted = jax.tree.leaves(laid, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    for leaf, sharding in zip(jax.tree.leaves(state), wanted, strict=True):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (leaf.shape, sharding)


def test_a_committed_argument_laid_out_otherwise_names_the_output_that_did_it(mesh) -> None:
    mesh_3 = mesh((2, 2, 2), ("a", "b", "c"))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (16, 8)))
    batch = NamedSharding(mesh_3, P("a"))
    partitioner.clear_caches()
    auto = partitioner.jit(_step, in_shardings=(AUTO, batch))
    params, opt_state = auto.lower(_state(), tokens).compile().input_shardings[0][0]
    chosen = params["w1"].spec
    other = P(None, None, "c") if chosen != P(None, None, "c") else P(None, "c")

    def elsewhere(state: tuple[Any, Any]) -> tuple[Any, Any]:
        return state

    # every leaf as AUTO laid it out but w1
    placing = partitioner.jit(elsewhere, out_shardings=({**params, "w1": other}, opt_state))
    with jax.set_mesh(mesh_3):
        placed = placing(_state())
    with pytest.raises(ValueError, match=r"laid out by result\[0\]\['w1'\] of jit elsewhere"):
        auto(placed, tokens)


GPT_STEPS, GPT_LAYERS = 20, 4


@pytest.mark.parametrize("body", ["plain scan", "pipeline(axis=AUTO)"])
def test_the_small_gpt_trains_twenty_adamw_steps_as_jax_jit(mesh, body: str) -> None:
    """The small GPT (tied embedding head, pre-LN causal blocks, ``benchmarks/models.py``;
    4 blocks here to keep the test short) with AdamW on a 2x2x2 mesh, batch over 'b',
    parameters and optimizer state AUTO in and out: fed its own outputs for 20 steps,
    its losses are jax.jit's plain scan's, whether or not its body may pipeline."""
    from benchmarks import models

    mesh_3 = mesh((2, 2, 2), ("a", "b", "c"))
    stack = (
        models.plain_scan(models.gpt_block)
        if body == "plain scan"
        else partitioner.pipeline(models.gpt_block, axis=AUTO)
    )
    params = models.gpt_params(jax.random.key(0), layers=GPT_LAYERS)
    tokens, targets = models.gpt_batch(jax.random.key(1))
    data = NamedSharding(mesh_3, P("b"))
    partitioner.clear_caches()
    ours = partitioner.jit(
        models.adamw_step(models.gpt_loss(stack)),
        in_shardings=(AUTO, AUTO, data, data),
        out_shardings=(AUTO, AUTO, None),
    )
    theirs = jax.jit(models.adamw_step(models.gpt_loss(models.plain_scan(models.gpt_block))))
    state = want = (params, models.adamw().init(params))
    for step in range(GPT_STEPS):
        *state, loss = ours(*state, tokens, targets)
        *want, want_loss = theirs(*want, tokens, targets)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-4, err_msg=f"step {step}")
