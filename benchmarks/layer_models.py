"""The programs AUTO is measured on beyond the MLP and the transformer block.

Why a module of its own: the AUTO figure (``bench_auto.py``) asks whether the
search holds up on the other layers models are made of, each with the layout a
person would write for it: a small CNN (two convolutions, max pools, a dense
head), an embedding whose softmax is tied to it (a gather and its scatter-add
gradient), a mixture-of-experts layer (experts as a leading dimension, top-1
routing by a one-hot dispatch), and a stack of transformer layers (``models.py``'s
RMS block, which the AUTO tests stack too) written as a ``lax.scan`` over stacked
parameters and unrolled. Sizes are small, so each program compiles in seconds on two
cores.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import models

from partitioner import PartitionSpec as P

Params = dict[str, jax.Array]
Batch = tuple[jax.Array, jax.Array]


def _normal(key: int, shape: tuple[int, ...], scale: float) -> jax.Array:
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


# --- a CNN ---

CNN_SPECS = {  # output features over "model", as a person splits a convnet's channels
    "conv1": P(None, None, None, "model"),
    "conv2": P(None, None, None, "model"),
    "dense": P(None, "model"),
}


def cnn_args() -> tuple[Params, Batch]:
    params = {
        "conv1": _normal(1, (3, 3, 8, 64), 0.2),
        "conv2": _normal(2, (3, 3, 64, 128), 0.04),
        "dense": _normal(3, (128 * 8 * 8, 32), 0.01),
    }
    return params, (_normal(4, (32, 32, 32, 8), 1.0), jax.nn.one_hot(jnp.arange(32) % 32, 32))


def _conv_relu(x: jax.Array, k: jax.Array) -> jax.Array:
    dn = ("NHWC", "HWIO", "NHWC")
    return jax.nn.relu(jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn))


def _max_pool(x: jax.Array) -> jax.Array:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def cnn_loss(p: Params, batch: Batch) -> jax.Array:
    x, y = batch
    h = _max_pool(_conv_relu(_max_pool(_conv_relu(x, p["conv1"])), p["conv2"]))
    logits = h.reshape(h.shape[0], -1) @ p["dense"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))


# --- an embedding with a tied softmax ---

VOCAB, WIDTH = 8192, 128
EMBED_SPECS = {"embed": P("model"), "w": P()}  # a vocabulary-parallel table


def embed_args() -> tuple[Params, Batch]:
    params = {"embed": _normal(5, (VOCAB, WIDTH), 0.1), "w": _normal(6, (WIDTH, WIDTH), 0.1)}
    ids = jax.random.randint(jax.random.key(7), (32, 16), 0, VOCAB)
    return params, (ids, (ids * 7 + 3) % VOCAB)


def embed_loss(p: Params, batch: Batch) -> jax.Array:
    ids, labels = batch
    h = jnp.tanh(p["embed"][ids] @ p["w"])
    logits = h @ p["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))


# --- a mixture-of-experts layer ---

EXPERTS, D_MODEL, D_FF = 8, 128, 512
MOE_SPECS = {"router": P(), "w_in": P(("data", "model")), "w_out": P(("data", "model"))}


def moe_args() -> tuple[Params, Batch]:
    params = {
        "router": _normal(8, (D_MODEL, EXPERTS), 0.1),
        "w_in": _normal(9, (EXPERTS, D_MODEL, D_FF), 1 / math.sqrt(D_MODEL)),
        "w_out": _normal(10, (EXPERTS, D_FF, D_MODEL), 1 / math.sqrt(D_FF)),
    }
    return params, (_normal(11, (512, D_MODEL), 1.0), _normal(12, (512, D_MODEL), 1.0))


def moe_loss(p: Params, batch: Batch) -> jax.Array:
    x, y = batch
    gates = jax.nn.softmax(x @ p["router"])
    dispatch = jax.nn.one_hot(jnp.argmax(gates, -1), EXPERTS) * gates
    h = jax.nn.gelu(jnp.einsum("te,td,edf->etf", dispatch, x, p["w_in"]))
    return jnp.mean((jnp.einsum("etf,efd->td", h, p["w_out"]) - y) ** 2)


# --- transformer layers, scanned and unrolled ---

LAYERS, MODEL, FF = 4, 128, 512  # 4 heads
LAYER_SPECS = {
    "ln": P(),
    "wqkv": P(None, "model"),
    "wo": P("model"),
    "w1": P(None, "model"),
    "w2": P("model"),
}
SCAN_SPECS = {k: P(None, *s) for k, s in LAYER_SPECS.items()}


def _layers_batch() -> Batch:
    return _normal(40, (16, 32, MODEL), 1.0), _normal(41, (16, 32, MODEL), 1.0)


def unrolled_args() -> tuple[list[Params], Batch]:
    layers = [models.rms_block_params(20 + 5 * i, MODEL, FF) for i in range(LAYERS)]
    return layers, _layers_batch()


def scan_args() -> tuple[Params, Batch]:
    layers, batch = unrolled_args()
    return models.stack(layers), batch


def scan_loss(p: Params, batch: Batch) -> jax.Array:
    x, y = batch
    return jnp.mean((models.plain_scan(models.rms_block)(p, x) - y) ** 2)


def unrolled_loss(ps: list[Params], batch: Batch) -> jax.Array:
    x, y = batch
    for p in ps:
        x = models.rms_block(p, x)
    return jnp.mean((x - y) ** 2)


def replicated(specs: Any) -> Any:
    return jax.tree.map(lambda _: P(), specs, is_leaf=lambda x: isinstance(x, P))
