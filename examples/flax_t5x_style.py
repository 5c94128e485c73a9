"""flax linen, t5x style: logical axis names -> mesh specs -> a pjit-ed TrainState.

Run with ``python examples/flax_t5x_style.py``. It needs no accelerator: XLA is
told to split the host CPU into 8 virtual devices before jax is imported.

What it shows:
  * a small token model written with *logical* axis names
    (``nn.with_logical_partitioning`` on every parameter,
    ``nn.with_logical_constraint`` on activations), mapped onto a 4x2
    ("data", "model") mesh by ``nn.logical_axis_rules``, as t5x does;
  * the spec tree of the whole ``TrainState`` (step, params, adamw's moments)
    from ``nn.get_partition_spec`` of the abstract state (``jax.eval_shape``)
    and ``nn.logical_to_mesh``;
  * init through ``pjit`` (the state is born sharded, by its out specs) and a
    train step with dropout on typed PRNG keys, donating the old state;
  * the same steps under ``jax.jit`` with the same NamedShardings give the same
    losses (the script exits non-zero if they do not);
  * where each parameter lives: its logical names, mesh spec and the shape of
    the shard each device holds.
"""

from __future__ import annotations

import os

# Must happen before jax is imported: jax reads XLA_FLAGS once, at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402

from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit  # noqa: E402

jax.config.update("jax_platforms", "cpu")

VOCAB, EMBED, MLP, LENGTH, BATCH = 64, 32, 64, 8, 32
STEPS, PRINT_EVERY = 30, 5

# Logical axis -> mesh axis (None: replicated), the table t5x keeps in its gin config.
RULES = (
    ("batch", "data"),
    ("length", None),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
)


# --- the model: written with logical names only, no mesh axes ---


def _partitioned(init: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    return nn.with_logical_partitioning(init, names)


def _dense(features: int, names: tuple[str, str], use_bias: bool = True) -> nn.Dense:
    """A Dense layer whose kernel has logical ``names`` (its bias, the output one)."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        kernel_init=_partitioned(nn.initializers.lecun_normal(), names),
        bias_init=_partitioned(nn.initializers.zeros_init(), names[1:]),
    )


class MlpBlock(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        h = nn.gelu(_dense(MLP, ("embed", "mlp"))(x))
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = nn.Dropout(0.1, deterministic=not train)(h)
        return _dense(EMBED, ("mlp", "embed"))(h)


class TokenModel(nn.Module):
    """Embed -> pre-norm residual MLP block -> logits over the vocabulary."""

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool) -> jax.Array:
        embedding_init = _partitioned(nn.initializers.normal(1.0), ("vocab", "embed"))
        x = nn.Embed(VOCAB, EMBED, embedding_init=embedding_init)(tokens)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        norm = nn.LayerNorm(
            scale_init=_partitioned(nn.initializers.ones_init(), ("embed",)),
            bias_init=_partitioned(nn.initializers.zeros_init(), ("embed",)),
        )
        x = x + MlpBlock()(norm(x), train)
        logits = _dense(VOCAB, ("embed", "vocab"), use_bias=False)(x)
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


MODEL = TokenModel()
TX = optax.adamw(5e-3, weight_decay=1e-4)


def init_state(key: jax.Array, tokens: jax.Array) -> TrainState:
    params = MODEL.init(key, tokens, train=False)["params"]
    return TrainState.create(apply_fn=MODEL.apply, params=params, tx=TX)


def train_step(
    state: TrainState, tokens: jax.Array, targets: jax.Array, dropout_key: jax.Array
) -> tuple[TrainState, jax.Array]:
    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn(
            {"params": params}, tokens, train=True, rngs={"dropout": dropout_key}
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """Learn a fixed permutation of the vocabulary, token by token."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    return tokens, rng.permutation(VOCAB).astype(np.int32)[tokens]


def train(
    init: Callable[..., Any], step: Callable[..., Any], tokens: np.ndarray, targets: np.ndarray
) -> tuple[TrainState, list[float]]:
    """Init, then STEPS updates. Blocks on every step (see README "Known pitfall")."""
    state = init(jax.random.key(0), tokens)
    dropout_keys = jax.random.split(jax.random.key(1), STEPS)  # typed keys
    losses = []
    for i in range(STEPS):
        state, loss = step(state, tokens, targets, dropout_keys[i])
        losses.append(float(loss))
    return state, losses


def misplaced(state: TrainState, specs: Any, mesh: Mesh) -> list[str]:
    """Paths of the state's arrays not laid out as ``NamedSharding(mesh, spec)`` says."""
    bad = []

    def check(path: Any, spec: P, subtree: Any) -> None:
        for leaf in jax.tree.leaves(subtree):  # a LogicallyPartitioned box holds one array
            if not leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim):
                bad.append(jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(check, specs, state, is_leaf=lambda s: isinstance(s, P))
    return bad


def main() -> None:
    start = time.perf_counter()
    tokens, targets = make_data()
    mesh = Mesh(
        np.array(jax.devices()).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )
    print(f"{len(jax.devices())} devices, mesh 4x2 ('data', 'model'); rules {dict(RULES)}")

    # The whole TrainState's specs, from shapes only: nothing is allocated here.
    abstract = jax.eval_shape(init_state, jax.random.key(0), tokens)
    with nn.logical_axis_rules(RULES):
        logical_specs = nn.get_partition_spec(abstract)
        state_specs = nn.logical_to_mesh(logical_specs)
    batch_spec = P("data")

    init = pjit(init_state, (None, batch_spec), state_specs)
    step = pjit(
        train_step,
        (state_specs, batch_spec, batch_spec, None),
        (state_specs, None),
        donate_argnums=0,
    )

    # The reference: jax.jit given the same layouts as NamedShardings.
    shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, s), state_specs, is_leaf=lambda s: isinstance(s, P)
    )
    data = NamedSharding(mesh, batch_spec)
    jit_init = jax.jit(init_state, in_shardings=(None, data), out_shardings=shardings)
    jit_step = jax.jit(
        train_step,
        in_shardings=(shardings, data, data, None),
        out_shardings=(shardings, None),
        donate_argnums=0,
    )

    # jax.set_mesh: pjit reads the mesh from it, and flax's logical constraints
    # become real sharding constraints (without a mesh they are no-ops).
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        state, losses = train(init, step, tokens, targets)
        _, ref_losses = train(jit_init, jit_step, tokens, targets)

    print("\nstep   loss (pjit)   loss (jax.jit)")
    for i in [*range(0, STEPS, PRINT_EVERY), STEPS - 1]:
        print(f"{i + 1:4d}   {losses[i]:11.6f}   {ref_losses[i]:14.6f}")

    print("\nwhere the parameters live (logical names -> mesh spec; each device's shard):")
    names = jax.tree.leaves(logical_specs.params, is_leaf=lambda x: isinstance(x, P))
    flat = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(state.params))[0]
    for (path, p), logical in zip(flat, names, strict=True):
        where = "/".join(str(k.key) for k in path)
        shard = p.addressable_shards[0].data.shape
        print(
            f"  {where:26s} {str(tuple(logical)):18s} -> {str(p.sharding.spec):20s} "
            f"{str(p.shape):9s} -> {shard} on each device"
        )
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    if not np.allclose(losses, ref_losses, rtol=1e-5, atol=1e-5):
        sys.exit(f"pjit and jax.jit disagree: {losses} vs {ref_losses}")
    if misplaced(state, state_specs, mesh):
        sys.exit(f"not laid out as their specs say: {misplaced(state, state_specs, mesh)}")
    if not losses[-1] < 0.5 * losses[0]:
        sys.exit(f"training did not reduce the loss: {losses}")
    print(f"pjit and jax.jit agree (rtol/atol 1e-5) on all {STEPS} losses;")
    print("every array of the TrainState (params, adamw's mu and nu) is laid out as its spec says")


if __name__ == "__main__":
    main()
