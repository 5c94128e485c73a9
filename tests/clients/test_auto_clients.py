"""AUTO on real clients: flax linen and nnx models, optax states and typed PRNG keys.

The whole training state (parameters and the optimizer state optax builds, with its
scalar step count and empty nodes) is one AUTO subtree; the batch is fixed to
``P("data")``. Each loop runs donated, step by step beside jax.jit on the same
inputs, and must compile once: the layouts chosen for the outputs are those the
next step's inputs were chosen with.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh

import partitioner
from partitioner import AUTO, pjit
from partitioner import PartitionSpec as P

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

D_IN, D_HIDDEN, BATCH, STEPS = 64, 256, 32, 4
#: The donated linen loop runs past the CPU window's 16 launches in flight.
LOOP_STEPS = 20
DATA = P("data")


def assert_close(got: Any, want: Any, rtol: float, atol: float) -> None:
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        h = nn.gelu(nn.Dense(D_HIDDEN)(x))
        h = nn.Dropout(0.1, deterministic=not train)(h)
        return nn.Dense(D_IN)(nn.LayerNorm()(h))


def _batch() -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(7))
    return jax.random.normal(kx, (BATCH, D_IN)), jax.random.normal(ky, (BATCH, D_IN))


#: The chosen layout sums in another order than jax.jit's one device, and adamw divides by
#: the gradients' running scale, so the losses drift apart by float32 rounding over the
#: steps (1.5e-5 relative by the last one, seen with LLVM's optimizations off).
LOSS_RTOL = 5e-5


def test_flax_linen_optax_adamw_with_a_typed_key_trains_as_jax_jit(mesh_4x2: Mesh) -> None:
    model = LinenMLP()
    tx = optax.adamw(1e-2)
    x, y = _batch()
    params = model.init(jax.random.key(0), x, train=False)["params"]
    state = (params, tx.init(params))

    def step(state: Any, batch: Any, key: jax.Array) -> Any:
        params, opt = state

        def loss_fn(p: Any) -> jax.Array:
            out = model.apply({"params": p}, batch[0], train=True, rngs={"dropout": key})
            return jnp.mean((out - batch[1]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), loss

    f = pjit(
        step,
        in_axis_resources=(AUTO, (DATA, DATA), AUTO),
        out_axis_resources=(AUTO, P()),
        donate_argnums=0,
    )
    ref = jax.jit(step, donate_argnums=0)
    keys = jax.random.split(jax.random.key(1), LOOP_STEPS)
    ours, theirs, inner = state, jax.tree.map(jnp.copy, state), jax.tree.map(jnp.copy, state)
    ref_losses = []
    with jax.set_mesh(mesh_4x2), partitioner.recording() as events:
        for k in keys:
            ours, loss = f(ours, (x, y), k)
            theirs, ref_loss = ref(theirs, (x, y), k)
            assert_close(loss, ref_loss, rtol=LOSS_RTOL, atol=1e-6)
            ref_losses.append(ref_loss)
        report = f.lower(ours, (x, y), keys[0]).report()
    # The same loop with a jax.jit around the AUTO pjit: the choice is reused inside it.
    wrapped = jax.jit(lambda s, b, k: f(s, b, k), donate_argnums=0)
    with jax.set_mesh(mesh_4x2), partitioner.recording() as wrapped_events:
        for k, ref_loss in zip(keys, ref_losses, strict=True):
            inner, loss = wrapped(inner, (x, y), k)
            assert_close(loss, ref_loss, rtol=LOSS_RTOL, atol=1e-6)
    assert wrapped_events["auto_search"] == 0, dict(wrapped_events)
    assert_close(inner, ours, rtol=1e-5, atol=1e-6)
    choice = report.auto.choice
    # One search; its finalists' compiles, the winner's reused by the calls and by the
    # report (one compile per program across calls and Lowered.compile).
    assert events["auto_search"] == 1, dict(events)
    assert events["compile"] == choice.compiles, dict(events)
    # Adam divides by the root of the second moment: float rounding of a reduction
    # split over devices can move a near-zero gradient's normalized update by a few
    # percent of one step (lr = 1e-2); atol is a tenth of a step.
    assert_close(ours, theirs, rtol=1e-3, atol=1e-3)
    # Every parameter, moment and the step count were chosen for; the key stays whole.
    assert any("count" in p for p in choice.paths) and any("mu" in p for p in choice.paths)
    assert choice.paths[-1] == "args[2]"
    assert choice.chosen.specs[-1] == "P()"
    assert any(s != "P()" for s in choice.chosen.specs)  # something is split


class NnxMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.up = nnx.Linear(D_IN, D_HIDDEN, rngs=rngs)
        self.down = nnx.Linear(D_HIDDEN, D_IN, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.relu(self.up(x)))


def test_flax_nnx_split_state_trains_as_jax_jit(mesh_4x2: Mesh) -> None:
    graphdef, params = nnx.split(NnxMLP(nnx.Rngs(0)), nnx.Param)
    tx = optax.sgd(0.05, momentum=0.9)
    state = (params, tx.init(params))
    x, y = _batch()

    def step(state: Any, batch: Any) -> Any:
        params, opt = state

        def loss_fn(p: Any) -> jax.Array:
            return jnp.mean((nnx.merge(graphdef, p)(batch[0]) - batch[1]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), loss

    f = pjit(step, in_axis_resources=(AUTO, (DATA, DATA)), out_axis_resources=(AUTO, P()))
    ref = jax.jit(step)
    ours, theirs = state, state
    with jax.set_mesh(mesh_4x2):
        for _ in range(STEPS):
            ours, loss = f(ours, (x, y))
            theirs, ref_loss = ref(theirs, (x, y))
            assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    # The updated state comes back laid out as it went in: the next step reuses the program.
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ours), strict=True):
        assert a.shape == b.shape
    kernels = [leaf for leaf in jax.tree.leaves(ours[0]) if leaf.ndim == 2]
    assert any(np.prod(k.sharding.shard_shape(k.shape)) < k.size for k in kernels)
