"""A flax linen + optax training loop written for ``jax.jit``, switched to ``partitioner.jit``.

The code is what FSDP-style helpers write for jax.jit: a tree of NamedShardings for the
parameters (split over "data"), ``None`` where they have no opinion (the optimizer state
and the batch follow their arguments; the loss is wherever XLA puts it), the state
donated each step. Only the name of the function changes; every step's loss, the final
parameters, their shardings and the donation must match jax.jit's.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(4)(x)


def _fsdp(mesh: Any, tree: Any) -> Any:
    """A parameter's sharding: its first dimension over "data" when it divides, else replicated."""

    def one(x: Any) -> NamedSharding:
        split = x.ndim and x.shape[0] % mesh.shape["data"] == 0
        return NamedSharding(mesh, P("data") if split else P())

    return jax.tree.map(one, tree)


def _run(jit: Any, mesh: Mesh, steps: int = 4) -> tuple[list[float], Any, list[bool]]:
    model, tx = _MLP(), optax.adamw(1e-2)
    x = np.linspace(-1, 1, 64 * 8, dtype=np.float32).reshape(64, 8)
    y = np.cos(x[:, :4])
    params = model.init(jax.random.key(0), x[:1])
    shardings = _fsdp(mesh, params)
    params = jax.device_put(params, shardings)

    def loss_fn(p: Any, xb: Any, yb: Any) -> Any:
        return jnp.mean((model.apply(p, xb) - yb) ** 2)

    @jit
    def init_state(p: Any) -> Any:
        return tx.init(p)

    def step(p: Any, s: Any, xb: Any, yb: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    train = jit(
        step,
        in_shardings=(shardings, None, None, None),
        out_shardings=(shardings, None, None),
        donate_argnums=(0, 1),
    )
    opt_state = init_state(params)
    losses: list[float] = []
    consumed: list[tuple[bool, ...]] = []
    for _ in range(steps):
        old = jax.tree.leaves(params)
        params, opt_state, loss = train(params, opt_state, x, y)
        losses.append(float(loss))  # block each step (README: CPU pitfall)
        consumed.append(tuple(leaf.is_deleted() for leaf in old))
    return losses, params, consumed


@pytest.mark.filterwarnings("ignore:.*donated buffers were not usable")
def test_flax_optax_loop_switches_from_jax_jit_by_one_name(mesh_4x2: Mesh) -> None:
    want_losses, want_params, want_consumed = _run(jax.jit, mesh_4x2)
    losses, params, consumed = _run(partitioner.jit, mesh_4x2)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for ours, theirs in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)
        assert ours.sharding == theirs.sharding, (ours.sharding, theirs.sharding)
    # The donated parameters (laid out as their outputs) are consumed every step, as
    # under jax.jit.
    assert consumed == want_consumed and all(all(c) for c in consumed)
