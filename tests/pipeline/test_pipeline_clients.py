"""A pipeline in a real training loop: a flax linen layer, optax's adamw, typed PRNG keys,
parameters staged once and donated step after step; every value against jax.jit running
the plain scan on the same inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax.sharding import NamedSharding

import partitioner
from benchmarks import models
from partitioner import PartitionSpec as P

LAYERS, BATCH, WIDTH, STEPS = 8, 32, 32, 4


class Block(nn.Module):
    """A pre-LN residual MLP block with dropout (a typed key per step)."""

    @nn.compact
    def __call__(self, h: jax.Array, key: jax.Array) -> jax.Array:
        x = nn.LayerNorm()(h)
        x = nn.gelu(nn.Dense(4 * WIDTH)(x))
        x = nn.Dropout(0.1, deterministic=False)(x, rng=key)
        return h + nn.Dense(WIDTH)(x)


BLOCK = Block()


def layer(params, carried):
    """One block on each example with the example's own dropout key (carried along, so
    a microbatch's examples keep their keys)."""

    def one(h: jax.Array, key: jax.Array) -> jax.Array:
        return BLOCK.apply({"params": params}, h[None], key)[0]

    return {"h": jax.vmap(one)(carried["h"], carried["key"]), "key": carried["key"]}


def stacked_init(key: jax.Array):
    keys = jax.random.split(key, LAYERS)
    h = jnp.zeros((1, WIDTH))
    return jax.vmap(lambda k: BLOCK.init(k, h, jax.random.key(0))["params"])(keys)


def loss_with(forward):
    def loss(params, x, y, key):
        # one dropout key per example (the layer acts on each example on its own)
        keys = jax.random.split(key, x.shape[0])
        out = forward(params, {"h": x, "key": keys})["h"]
        return jnp.mean((out - y) ** 2)

    return loss


plain = models.plain_scan(layer)


def train_step(forward, tx):
    def step(state, x, y, key):
        params, opt = state
        value, grads = jax.value_and_grad(loss_with(forward))(params, x, y, key)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    return step


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_a_flax_layer_trained_with_optax_adamw_as_jax_jit(mesh, schedule) -> None:
    m = mesh((4, 2), ("stage", "data"))
    # adam divides by the gradients' scale: where one is near zero, the float rounding of
    # another summation order becomes a +-lr step; an eps above that rounding keeps the
    # comparison of the final parameters tight
    tx = optax.adamw(1e-2, eps=1e-3)
    params = stacked_init(jax.random.key(0))
    kx, ky = jax.random.split(jax.random.key(1))
    x, y = jax.random.normal(kx, (BATCH, WIDTH)), jax.random.normal(ky, (BATCH, WIDTH))
    keys = jax.random.split(jax.random.key(2), STEPS)
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule=schedule, mesh=m)

    staged = run.stage(params)
    state = (staged, tx.init(staged))
    stages = NamedSharding(m, P("stage"))
    specs = jax.tree.map(lambda leaf: stages if np.ndim(leaf) >= 1 else None, state)
    data = NamedSharding(m, P("data"))
    step = partitioner.jit(
        train_step(run, tx),
        in_shardings=(specs, data, data, None),
        out_shardings=(specs, None),
        donate_argnums=0,
    )
    reference = jax.jit(train_step(plain, tx))
    theirs = (params, tx.init(params))
    for key in keys:
        state, value = step(state, x, y, key)
        theirs, their_value = reference(theirs, x, y, key)
        np.testing.assert_allclose(value, their_value, rtol=2e-5)
    ours = jax.tree.map(np.asarray, state[0].unstage())
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs[0]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert isinstance(state[0], partitioner.StagedParams)  # optax kept the staged form
