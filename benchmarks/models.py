"""The programs the compile, step and memory figures share: an MLP and a transformer block.

Why one module: the three figures must measure the same program, laid out the same
way (specs over a 4x2 ``("data", "model")`` mesh, Megatron-style: column-parallel
in, row-parallel out), for partitioner and for ``jax.jit`` alike. Dimensions are
small so a full ``nox -s bench`` fits in minutes on two cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

# jax's own spec type: partitioner.PartitionSpec builds these very objects, and a
# jax.jit-only process (bench_startup.py) can then use this module without
# importing partitioner.
from jax.sharding import PartitionSpec as P

Params = dict[str, jax.Array]
Batch = tuple[jax.Array, jax.Array]


@dataclass(frozen=True)
class Dims:
    batch: int = 16
    seq: int = 32
    model: int = 128
    heads: int = 4
    ff: int = 512


DIMS = Dims()


def mesh_4x2() -> Mesh:
    """The 4x2 ``("data", "model")`` mesh over the 8 virtual CPU devices."""
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def to_jax(spec_tree: Any, mesh: Mesh) -> Any:
    """Our spec tree as ``NamedSharding``s, for ``jax.jit``'s in/out_shardings."""
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        spec_tree,
        is_leaf=lambda x: isinstance(x, P),
    )


# --- MLP ---

MLP_SPECS = ({"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}, P("data", None))
MLP_OUT = P("data", None)


def mlp_args(d: Dims = DIMS) -> tuple[Params, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (d.model, d.ff), jnp.float32) / math.sqrt(d.model),
        "b1": jnp.zeros((d.ff,), jnp.float32),
        "w2": jax.random.normal(k2, (d.ff, d.model), jnp.float32) / math.sqrt(d.ff),
    }
    x = jax.random.normal(k3, (d.batch * d.seq, d.model), jnp.float32)
    return params, x


def mlp(params: Params, x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ params["w1"] + params["b1"]) @ params["w2"]


# --- transformer block ---

BLOCK_PARAM_SPECS = {
    "ln1": P(),
    "wq": P(None, "model"),
    "wk": P(None, "model"),
    "wv": P(None, "model"),
    "wo": P("model", None),
    "ln2": P(),
    "w1": P(None, "model"),
    "w2": P("model", None),
}
BATCH_SPECS = (P("data"), P("data"))
BLOCK_OUT = P("data")


def block_params(d: Dims = DIMS) -> Params:
    keys = jax.random.split(jax.random.key(1), 6)

    def dense(k: jax.Array, n_in: int, n_out: int) -> jax.Array:
        return jax.random.normal(k, (n_in, n_out), jnp.float32) / math.sqrt(n_in)

    return {
        "ln1": jnp.ones((d.model,), jnp.float32),
        "wq": dense(keys[0], d.model, d.model),
        "wk": dense(keys[1], d.model, d.model),
        "wv": dense(keys[2], d.model, d.model),
        "wo": dense(keys[3], d.model, d.model),
        "ln2": jnp.ones((d.model,), jnp.float32),
        "w1": dense(keys[4], d.model, d.ff),
        "w2": dense(keys[5], d.ff, d.model),
    }


def block_batch(d: Dims = DIMS) -> Batch:
    kx, ky = jax.random.split(jax.random.key(2))
    shape = (d.batch, d.seq, d.model)
    return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(ky, shape, jnp.float32)


def _layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def block(params: Params, x: jax.Array, heads: int = DIMS.heads) -> jax.Array:
    """Pre-norm causal self-attention + GELU MLP, each with a residual connection."""
    b, s, m = x.shape
    dh = m // heads
    h = _layer_norm(x, params["ln1"])
    q, k, v = ((h @ params[w]).reshape(b, s, heads, dh) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, m)
    x = x + attn @ params["wo"]
    h = _layer_norm(x, params["ln2"])
    return x + jax.nn.gelu(h @ params["w1"]) @ params["w2"]


def loss(params: Params, batch: Batch) -> jax.Array:
    x, y = batch
    return jnp.mean((block(params, x) - y) ** 2)


def sgd(params: Params, grads: Params, lr: float = 1e-2) -> Params:
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def train_step(
    loss_fn: Callable[[Params, Batch], jax.Array] = loss,
) -> Callable[[Params, Batch], Params]:
    """fwd + bwd + SGD update as one function (the body both contenders compile)."""

    def step(params: Params, batch: Batch) -> Params:
        return sgd(params, jax.grad(loss_fn)(params, batch))

    return step
