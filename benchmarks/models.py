"""The programs the figures and the tests share: MLPs, transformer blocks, their stacks.

Why one module: a figure and a test about the same program must run the very same
program (the same equations in the same order, the same parameters), or a test no
longer checks what a README row reports. The compile, step and memory figures lay the
MLP and the block out on a 4x2 ``("data", "model")`` mesh, Megatron-style (column-
parallel in, row-parallel out), for partitioner and for ``jax.jit`` alike;
``bench_auto``, ``bench_pipeline`` and ``bench_plan`` search layouts of these layers
and of their stacks, and ``tests/auto`` and ``tests/pipeline`` check the same searches
on them. Dimensions are small so a full ``nox -s bench`` fits in minutes on two cores.

Why here, and how each side imports it: the benchmarks run as scripts from this folder
and import it as ``models``; the tests import it as ``benchmarks.models`` (pytest puts
the repository root on their path, where ``benchmarks/`` is a namespace package), so
there is one file and no path set by hand. For the same file to work under both names
it imports jax and numpy only: no sibling module (``common`` sets ``XLA_FLAGS`` when
imported) and not partitioner (``startup_worker.py`` imports it into a jax.jit-only
process). It is not in the wheel (pyproject packages ``partitioner*`` and
``_partitioner_pytest*`` only): the suite's models are no user's API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding

# jax's own spec type: partitioner.PartitionSpec builds these very objects, and a
# jax.jit-only process (bench_startup.py) can then use this module without
# importing partitioner.
from jax.sharding import PartitionSpec as P

Params = dict[str, jax.Array]
Batch = tuple[jax.Array, jax.Array]
#: One layer of a stack: ``layer(params, activations) -> activations``.
Layer = Callable[[Params, jax.Array], jax.Array]


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


def batch(shape: tuple[int, ...], key: jax.Array) -> Batch:
    """Inputs and regression targets of one shape, each normal, from ``key`` split in two."""
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(ky, shape, jnp.float32)


# --- stacks of layers ---


def stack(layers: Sequence[Params]) -> Params:
    """Per-layer parameters as one tree, each leaf stacked on a new leading dimension."""
    return jax.tree.map(lambda *a: jnp.stack(a), *layers)


def plain_scan(layer: Layer) -> Callable[[Params, jax.Array], jax.Array]:
    """``layer`` applied once per slice of stacked parameters, by ``lax.scan`` carrying
    the activations: what ``partitioner.pipeline(layer)`` computes, written as users
    write it, so the reference every pipeline is checked and measured against."""
    return lambda params, x: jax.lax.scan(lambda h, p: (layer(p, h), None), x, params)[0]


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
    """A GELU MLP, with the bias ``b1`` where the parameters have one."""
    h = x @ params["w1"]
    if "b1" in params:
        h = h + params["b1"]
    return jax.nn.gelu(h) @ params["w2"]


def residual_mlp(params: Params, x: jax.Array) -> jax.Array:
    """The MLP with a residual connection: the layer of the MLP stacks (in width = out)."""
    return x + mlp(params, x)


# --- layer norms ---

# NOTE [three spellings of layer norm]: the blocks below normalise alike but spell it
# three ways (centred once or twice, eps 1e-5 or 1e-6, with a scale or without). Each
# block keeps the spelling its tests and recorded figures were measured with: another
# spelling is another jaxpr, whose equations AUTO's cost model walks in order (its peak
# memory estimate follows them), so choices and README rows could move. One spelling
# when those figures are measured again (tests/auto/test_auto.py's block has a fourth).


def _layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def _centred_layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x = x - x.mean(-1, keepdims=True)
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def _unscaled_layer_norm(x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


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
#: The block without its layer norms (``block(..., norm=None)``): Megatron's layout.
PLAIN_BLOCK_PARAM_SPECS = {k: s for k, s in BLOCK_PARAM_SPECS.items() if not k.startswith("ln")}
#: Megatron's attention with the MLP's weights over both mesh axes: the layout XLA
#: measures below Megatron's on both figures for 8 such blocks at a batch of 8 x 16
#: (issue 54), with the norms' scales replicated where the block has them.
MLP_OVER_BOTH_SPECS = {
    **BLOCK_PARAM_SPECS,
    "w1": P(None, ("data", "model")),
    "w2": P(("data", "model"), None),
}
BATCH_SPECS = (P("data"), P("data"))
BLOCK_OUT = P("data")


def block_params(
    d: Dims = DIMS, key: jax.Array | None = None, layers: int | None = None, *, norms: bool = True
) -> Params:
    """The block's parameters from ``key`` (``jax.random.key(1)`` when None); with
    ``layers``, a stack of that many (one draw of each stacked weight); without
    ``norms``, no layer norm scales (the parameters of ``block(..., norm=None)``)."""
    keys = jax.random.split(jax.random.key(1) if key is None else key, 6)
    lead = () if layers is None else (layers,)

    def dense(k: jax.Array, n_in: int, n_out: int) -> jax.Array:
        return jax.random.normal(k, (*lead, n_in, n_out), jnp.float32) / math.sqrt(n_in)

    params = {
        "ln1": jnp.ones((*lead, d.model), jnp.float32),
        "wq": dense(keys[0], d.model, d.model),
        "wk": dense(keys[1], d.model, d.model),
        "wv": dense(keys[2], d.model, d.model),
        "wo": dense(keys[3], d.model, d.model),
        "ln2": jnp.ones((*lead, d.model), jnp.float32),
        "w1": dense(keys[4], d.model, d.ff),
        "w2": dense(keys[5], d.ff, d.model),
    }
    return params if norms else {k: v for k, v in params.items() if not k.startswith("ln")}


def block_batch(d: Dims = DIMS, key: jax.Array | None = None) -> Batch:
    """A ``(batch, seq, model)`` batch from ``key`` (``jax.random.key(2)`` when None)."""
    return batch((d.batch, d.seq, d.model), jax.random.key(2) if key is None else key)


@dataclass(frozen=True)
class TensorSplit:
    """Where a layer's tensor parallelism (Megatron) puts its attention heads and its
    MLP's hidden units: the mesh axes its constraints name (None: that part unsplit).

    Why constraints, and not only the weights' specs: inside ``partitioner.pipeline`` a
    mesh axis the layer's constraints put on no dimension but the leading one is a
    batch axis, each shard given its own gathered copy of the stage's weights (NOTE
    [pipeline gradients] in ``partitioner/_src/pipeline/shards.py``); an axis a
    constraint puts on the heads or the hidden units stays the layer's.
    """

    heads: str | tuple[str, ...] | None = None
    hidden: str | tuple[str, ...] | None = None


def _split(x: jax.Array, dim: int, axes: str | tuple[str, ...] | None) -> jax.Array:
    """``x`` with dimension ``dim`` over ``axes`` and every other dimension left to XLA."""
    if axes is None:
        return x
    spec: list[Any] = [P.UNCONSTRAINED] * x.ndim
    spec[dim] = axes
    return jax.lax.with_sharding_constraint(x, P(*spec))


def block(
    params: Params,
    x: jax.Array,
    heads: int = DIMS.heads,
    *,
    causal: bool = True,
    norm: Callable[[jax.Array, jax.Array], jax.Array] | None = _layer_norm,
    split: TensorSplit | None = None,
) -> jax.Array:
    """Pre-norm self-attention (separate q/k/v/o projections; causal unless ``causal``
    is False) + GELU MLP, each with a residual connection; ``norm=None``: no norms; with
    ``split``, the heads and the hidden units constrained as it says (the values
    unchanged)."""
    b, s, m = x.shape
    dh = m // heads
    split = split or TensorSplit()
    h = x if norm is None else norm(x, params["ln1"])
    q, k, v = (
        _split((h @ params[w]).reshape(b, s, heads, dh), 2, split.heads) for w in ("wq", "wk", "wv")
    )
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
    if causal:
        mask = jnp.tril(jnp.ones((s, s), bool))
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, m)
    x = x + attn @ params["wo"]
    h = x if norm is None else norm(x, params["ln2"])
    return x + jax.nn.gelu(_split(h @ params["w1"], 2, split.hidden)) @ params["w2"]


def plain_block(params: Params, x: jax.Array) -> jax.Array:
    """The block without its layer norms (issue 54's twins: attention + MLP only)."""
    return block(params, x, norm=None)


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


# --- the stacks bench_pipeline and bench_plan train, and tests/pipeline checks ---

STACK_LAYERS = 8
STACK_DIMS = Dims(batch=32, seq=16)


def stack_block(params: Params, h: jax.Array) -> jax.Array:
    """The stacks' transformer block: bidirectional attention, the centred layer norm."""
    return block(params, h, causal=False, norm=_centred_layer_norm)


def stack_block_params(key: jax.Array) -> Params:
    return block_params(STACK_DIMS, key, STACK_LAYERS)


def stack_block_batch(key: jax.Array) -> Batch:
    return block_batch(STACK_DIMS, key)


def mlp_stack_params(key: jax.Array) -> Params:
    """8 ``residual_mlp`` layers, 256 wide, 1024 hidden, no bias; ``w2`` a further 4x
    smaller than fan-in scaling, which keeps the sum of 8 residual branches small."""
    k1, k2 = jax.random.split(key)
    width, hidden = 256, 1024
    return {
        "w1": jax.random.normal(k1, (STACK_LAYERS, width, hidden)) / math.sqrt(width),
        "w2": jax.random.normal(k2, (STACK_LAYERS, hidden, width)) / math.sqrt(hidden) / 4,
    }


def mlp_stack_batch(key: jax.Array) -> Batch:
    return batch((64, 256), key)


# --- an RMS-norm block with a fused q/k/v projection (bench_auto's and the AUTO tests'
# scanned and unrolled stacks) ---


def rms_block_params(seed: int, d: int, ff: int) -> Params:
    """One layer's parameters, its four weights from ``jax.random.key(seed)`` to
    ``key(seed + 3)``: a stack draws each layer's from seeds of its own."""

    def normal(k: int, shape: tuple[int, ...], scale: float) -> jax.Array:
        return jax.random.normal(jax.random.key(seed + k), shape, jnp.float32) * scale

    return {
        "ln": jnp.ones((d,), jnp.float32),
        "wqkv": normal(0, (d, 3 * d), 1 / math.sqrt(d)),
        "wo": normal(1, (d, d), 1 / math.sqrt(d)),
        "w1": normal(2, (d, ff), 1 / math.sqrt(d)),
        "w2": normal(3, (ff, d), 1 / math.sqrt(ff)),
    }


def rms_block(p: Params, x: jax.Array, heads: int = 4) -> jax.Array:
    """Pre-norm (RMS) attention + GELU MLP, residual connections."""
    b, s, m = x.shape
    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * p["ln"]
    q, k, v = jnp.split((h @ p["wqkv"]).reshape(b, s, heads, 3 * m // heads), 3, -1)
    scores = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(m // heads))
    x = x + jnp.einsum("bhqk,bkhd->bqhd", scores, v).reshape(b, s, m) @ p["wo"]
    return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]


# --- the rematerialization case's block (bench_auto's remat rows, tests/auto/test_remat*) ---


def remat_params(layers: int, width: int, hidden: int) -> Params:
    """A stack of ``remat_block`` weights, each 4x smaller than fan-in scaling."""
    ks = jax.random.split(jax.random.key(1), 4)

    def dense(k: jax.Array, a: int, b: int) -> jax.Array:
        return jax.random.normal(k, (layers, a, b)) / math.sqrt(a) / 4

    return {
        "wqkv": dense(ks[0], width, 3 * width),
        "wo": dense(ks[1], width, width),
        "w1": dense(ks[2], width, hidden),
        "w2": dense(ks[3], hidden, width),
    }


def remat_block(
    x: jax.Array, p: Params, heads: int = 4, name: str | None = None
) -> tuple[jax.Array, None]:
    """An activation-heavy pre-norm block as a ``lax.scan`` body (carry first); ``name``
    tags the MLP's hidden activations with ``checkpoint_name`` for a policy to save."""
    b, s, m = x.shape
    q, k, v = jnp.split(_unscaled_layer_norm(x) @ p["wqkv"], 3, -1)
    q, k, v = (t.reshape(b, s, heads, m // heads) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(m // heads)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(b, s, m)
    x = x + attn @ p["wo"]
    hidden = jax.nn.gelu(_unscaled_layer_norm(x) @ p["w1"])
    hidden = hidden if name is None else checkpoint_name(hidden, name)
    return x + hidden @ p["w2"], None


# --- the three-axis programs (bench_plan's 2x2x2 section): trained with AdamW ---

#: What each weight is to a hand plan (``benchmarks/hand_plans.py``): ``attn_in`` /
#: ``mlp_in`` are projections into the attention's heads / the MLP's hidden units
#: (Megatron splits their output dimension), ``attn_out`` / ``mlp_out`` the projections
#: out of them (their input dimension), ``kv`` a multi-query attention's one key/value
#: head (whole under Megatron), ``vocab`` an embedding (its vocabulary dimension), ``norm``
#: a norm's scale. Keyed by the leaf's own name.
Roles = dict[str, str]

GPT_VOCAB, GPT_LAYERS = 1024, 8
GPT_DIMS = Dims(batch=16, seq=32, model=128, heads=4, ff=512)
GPT_ROLES: Roles = {
    "embed": "vocab", "ln_f": "norm", "ln1": "norm", "ln2": "norm",
    "wq": "attn_in", "wk": "attn_in", "wv": "attn_in", "wo": "attn_out",
    "w1": "mlp_in", "w2": "mlp_out",
}  # fmt: skip


def gpt_block(params: Params, x: jax.Array, split: TensorSplit | None = None) -> jax.Array:
    """The small GPT's block: pre-LN, causal 4-head attention, a 512 GELU MLP."""
    return block(params, x, GPT_DIMS.heads, split=split)


def gpt_params(key: jax.Array, layers: int = GPT_LAYERS) -> Params:
    """``{"embed": [vocab, d] (tied with the head), "blocks": the stack, "ln_f": [d]}``."""
    k_embed, k_blocks = jax.random.split(key)
    d = GPT_DIMS.model
    return {
        "embed": jax.random.normal(k_embed, (GPT_VOCAB, d), jnp.float32) / math.sqrt(d),
        "blocks": block_params(GPT_DIMS, k_blocks, layers),
        "ln_f": jnp.ones((d,), jnp.float32),
    }


def gpt_batch(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tokens ``[batch, seq]`` and their next tokens (int32), from one random sequence."""
    d = GPT_DIMS
    seq = jax.random.randint(key, (d.batch, d.seq + 1), 0, GPT_VOCAB, jnp.int32)
    return seq[:, :-1], seq[:, 1:]


def gpt_loss(stack: Callable[[Params, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    """``loss(params, tokens, targets)``: mean next-token cross-entropy, the blocks run by
    ``stack(blocks, h)`` (``plain_scan(gpt_block)``, or a ``partitioner.pipeline`` of it),
    the head the embedding transposed."""

    def loss(params: Params, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        h = jnp.take(params["embed"], tokens, axis=0)
        h = _layer_norm(stack(params["blocks"], h), params["ln_f"])
        logp = jax.nn.log_softmax(h @ params["embed"].T)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    return loss


# A program of another family, for the search's check on a program it was not built on:
# multi-query attention (one key/value head), RMS norms, a SwiGLU MLP, no embedding, a
# regression loss. Also bench_plan's two-axis unseen program (its stack alone, Adam).

GLU_D, GLU_FF, GLU_HEADS, GLU_LAYERS = 128, 384, 4, 8
GLU_ROLES: Roles = {
    "norm1": "norm", "norm2": "norm", "wq": "attn_in", "wk": "kv", "wv": "kv",
    "wo": "attn_out", "gate": "mlp_in", "up": "mlp_in", "down": "mlp_out",
}  # fmt: skip


def glu_block(p: Params, h: jax.Array, split: TensorSplit | None = None) -> jax.Array:
    """A block with multi-query attention (one key/value head) and a SwiGLU MLP."""
    batch, tokens, _ = h.shape
    head = GLU_D // GLU_HEADS
    split = split or TensorSplit()

    def rms(x: jax.Array, scale: jax.Array) -> jax.Array:
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale

    x = rms(h, p["norm1"])
    q = _split((x @ p["wq"]).reshape(batch, tokens, GLU_HEADS, head), 2, split.heads)
    k, v = (x @ p["wk"]), (x @ p["wv"])  # one head, shared
    scores = jnp.einsum("bqhd,bkd->bhqk", q, k) / math.sqrt(head)
    attended = jnp.einsum("bhqk,bkd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    h = h + attended.reshape(batch, tokens, GLU_D) @ p["wo"]
    x = rms(h, p["norm2"])
    gated = _split(jax.nn.silu(x @ p["gate"]) * (x @ p["up"]), 2, split.hidden)
    return h + gated @ p["down"]


def glu_params(key: jax.Array, layers: int = GLU_LAYERS) -> Params:
    """The stack of ``glu_block`` weights (every leaf ``[layers, ...]``)."""
    head = GLU_D // GLU_HEADS
    shapes = {
        "wq": (GLU_D, GLU_D), "wk": (GLU_D, head), "wv": (GLU_D, head), "wo": (GLU_D, GLU_D),
        "gate": (GLU_D, GLU_FF), "up": (GLU_D, GLU_FF), "down": (GLU_FF, GLU_D),
    }  # fmt: skip
    keys = jax.random.split(key, len(shapes))
    params = {
        name: jax.random.normal(k, (layers, *shape)) / math.sqrt(shape[0]) / 2
        for k, (name, shape) in zip(keys, shapes.items(), strict=True)
    }
    params.update(norm1=jnp.ones((layers, GLU_D)), norm2=jnp.ones((layers, GLU_D)))
    return params


def glu_batch(key: jax.Array) -> Batch:
    return batch((32, 16, GLU_D), key)


def glu_stack_params(key: jax.Array, layers: int = GLU_LAYERS) -> Params:
    """``{"blocks": glu_params(...)}``: the three-axis program's parameters."""
    return {"blocks": glu_params(key, layers)}


def glu_loss(stack: Callable[[Params, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    """``loss(params, x, y)``: mean squared error of ``stack(params["blocks"], x)``."""

    def loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((stack(params["blocks"], x) - y) ** 2)

    return loss


# --- AdamW (optax, imported when a step is built: this module stays jax/numpy-only) ---

ADAMW_LR, ADAMW_DECAY = 1e-3, 1e-2


def adamw() -> Any:
    """The optimizer of the three-axis programs: ``optax.adamw(1e-3, weight_decay=1e-2)``."""
    import optax

    return optax.adamw(ADAMW_LR, weight_decay=ADAMW_DECAY)


def adamw_step(loss_fn: Callable[..., jax.Array]) -> Callable[..., Any]:
    """``step(params, opt_state, *batch) -> (params, opt_state, loss)``: one AdamW step."""
    import optax

    tx = adamw()

    def step(params: Any, opt_state: Any, *batch: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step
