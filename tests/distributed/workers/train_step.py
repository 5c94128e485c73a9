"""The model, data and step shared by the multi-process training test and its reference."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from partitioner import PartitionSpec as P

STEPS = 8
SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    return {
        "w1": (rng.randn(16, 32) / 4).astype(np.float32),
        "b1": np.zeros(32, np.float32),
        "w2": (rng.randn(32, 4) / 6).astype(np.float32),
    }


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    x = rng.randn(64, 16).astype(np.float32)
    return x, np.tanh(x[:, :4])


def train_step(params: Any, x: Any, y: Any) -> Any:
    def loss_fn(p: Any) -> Any:
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss
