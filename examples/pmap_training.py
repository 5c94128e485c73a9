"""Data-parallel training with partitioner.pmap: a flax linen MLP, optax adam, 8 devices.

Run with ``python examples/pmap_training.py`` (8 virtual CPU devices). Each device
takes one slice of the batch; the step averages the gradients over devices
(``pmean``), so every device applies the same update to the same (broadcast)
parameters, which leave the map unmapped (``out_axes=None``). The same steps
under ``jax.pmap`` give the same losses; the batch's layout is a pmap
``ShardingSpec`` (one row per device) and the updated state feeds the next step
where it already is.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import partitioner  # noqa: E402

DEVICES, PER_DEVICE, FEATURES, STEPS = 8, 16, 12, 5


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.tanh(nn.Dense(32)(x))
        return nn.Dense(1)(x)


model, optimizer = MLP(), optax.adam(1e-2)


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """A (devices, per-device batch, features) regression problem."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((DEVICES, PER_DEVICE, FEATURES)).astype(np.float32)
    y = np.sin(x.sum(-1, keepdims=True)).astype(np.float32)
    return x, y


def init_state() -> tuple[Any, Any]:
    params = model.init(jax.random.key(0), jnp.ones((1, FEATURES)))
    return params, optimizer.init(params)


def train_step(state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
    """One step on this device's slice; gradients and loss averaged over "batch"."""
    params, opt_state = state

    def loss_fn(p: Any) -> jax.Array:
        return jnp.mean((model.apply(p, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads = jax.lax.pmean(grads, "batch")
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), jax.lax.pmean(loss, "batch")


def train(pmap: Any) -> list[float]:
    """STEPS steps with ``pmap`` (partitioner's or jax's); the losses."""
    step = pmap(train_step, "batch", in_axes=(None, 0, 0), out_axes=None)
    x, y = make_data()
    state, losses = init_state(), []
    for _ in range(STEPS):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    return losses


def main() -> None:
    ours, theirs = train(partitioner.pmap), train(jax.pmap)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        print(f"step {i}: loss {a:.6f} (jax.pmap {b:.6f})")
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0], "the loss went down"
    x, _ = make_data()
    mapped = partitioner.pmap(lambda v: v * 2, "batch")(x)
    print("a mapped output's layout:", partitioner.sharding_spec_of(mapped))


if __name__ == "__main__":
    main()
