"""flax nnx: an eagerly sharded model, its split state and an optax optimizer under pjit.

Run with ``python examples/flax_nnx.py``. It needs no accelerator: XLA is told
to split the host CPU into 8 virtual devices before jax is imported.

What it shows:
  * a small token model whose parameters are annotated with mesh axes
    (``nnx.with_partitioning``) and built under ``jax.set_mesh``, so they are
    created sharded over a 4x2 ("data", "model") mesh;
  * ``nnx.split`` into the parameters and the rest (dropout's RNG key and
    counter), and ``nnx.get_partition_spec`` of each used as pjit's spec trees;
  * optax's adamw state laid out like the parameters: its specs come from the
    parameter specs through ``optax.tree_map_params``;
  * a donated train step through ``pjit``; the same steps under ``jax.jit``
    with the same NamedShardings give the same losses (the script exits
    non-zero if they do not);
  * where each parameter lives: its spec and the shape of each device's shard.
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

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402

from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit  # noqa: E402

jax.config.update("jax_platforms", "cpu")

VOCAB, EMBED, MLP, LENGTH, BATCH = 64, 32, 64, 8, 32
STEPS, PRINT_EVERY = 30, 5


# --- the model: mesh axis names on the parameters, nothing else partitioner-specific ---


def _sharded(init: Callable[..., Any], axes: tuple[str | None, ...]) -> Callable[..., Any]:
    return nnx.with_partitioning(init, axes)


class TokenModel(nnx.Module):
    """Embed -> pre-norm residual MLP (hidden units over "model") -> logits (vocab over "model")."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        kernel, zeros, ones = (
            nnx.initializers.lecun_normal(),
            nnx.initializers.zeros,
            nnx.initializers.ones,
        )
        self.embed = nnx.Embed(
            VOCAB,
            EMBED,
            embedding_init=_sharded(nnx.initializers.normal(1.0), ("model", None)),
            rngs=rngs,
        )
        self.norm = nnx.LayerNorm(
            EMBED, scale_init=_sharded(ones, (None,)), bias_init=_sharded(zeros, (None,)), rngs=rngs
        )
        self.up = nnx.Linear(
            EMBED,
            MLP,
            kernel_init=_sharded(kernel, (None, "model")),
            bias_init=_sharded(zeros, ("model",)),
            rngs=rngs,
        )
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.down = nnx.Linear(
            MLP,
            EMBED,
            kernel_init=_sharded(kernel, ("model", None)),
            bias_init=_sharded(zeros, (None,)),
            rngs=rngs,
        )
        self.logits = nnx.Linear(
            EMBED, VOCAB, use_bias=False, kernel_init=_sharded(kernel, (None, "model")), rngs=rngs
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        x = x + self.down(self.drop(nnx.gelu(self.up(self.norm(x)))))
        return self.logits(x)


TX = optax.adamw(5e-3, weight_decay=1e-4)


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """Learn a fixed permutation of the vocabulary, token by token."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    return tokens, rng.permutation(VOCAB).astype(np.int32)[tokens]


def new_state() -> tuple[nnx.GraphDef, nnx.State, nnx.State, optax.OptState]:
    """A fresh model (same seeds every time) split into graph, params and the rest, plus adamw's state."""
    graphdef, params, rest = nnx.split(TokenModel(nnx.Rngs(0, dropout=1)), nnx.Param, ...)
    return graphdef, params, rest, TX.init(params)


def make_train_step(graphdef: nnx.GraphDef) -> Callable[..., Any]:
    def train_step(params: Any, rest: Any, opt_state: Any, tokens: Any, targets: Any) -> Any:
        model = nnx.merge(graphdef, params, rest)

        def loss_fn(model: TokenModel) -> jax.Array:
            logits = model(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        _, params, rest = nnx.split(model, nnx.Param, ...)  # dropout advanced its RNG counter
        updates, opt_state = TX.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), rest, opt_state, loss

    return train_step


def train(step: Callable[..., Any], state: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[float]]:
    """STEPS updates. Blocks on every step (see README "Known pitfall")."""
    tokens, targets = make_data()
    losses = []
    for _ in range(STEPS):
        *state, loss = step(*state, tokens, targets)
        losses.append(float(loss))
    return tuple(state), losses


def main() -> None:
    start = time.perf_counter()
    mesh = Mesh(
        np.array(jax.devices()).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )
    print(f"{len(jax.devices())} devices, mesh 4x2 ('data', 'model')")
    batch_spec = P("data")

    # jax.set_mesh: nnx creates the parameters sharded, and pjit reads the mesh from it.
    with jax.set_mesh(mesh):
        graphdef, params, rest, opt_state = new_state()
        param_specs = nnx.get_partition_spec(params)  # a State of PartitionSpecs
        rest_specs = nnx.get_partition_spec(rest)
        # adamw's mu and nu are copies of the parameter tree: give them its specs.
        opt_specs = optax.tree_map_params(
            TX, lambda _, spec: spec, opt_state, param_specs, transform_non_params=lambda _: None
        )
        specs = (param_specs, rest_specs, opt_specs)

        train_step = make_train_step(graphdef)
        step = pjit(
            train_step, (*specs, batch_spec, batch_spec), (*specs, None), donate_argnums=(0, 1, 2)
        )
        (params, rest, opt_state), losses = train(step, (params, rest, opt_state))

        # The reference: jax.jit given the same layouts as NamedShardings.
        shardings = tuple(
            jax.tree.map(lambda s: NamedSharding(mesh, s or P()), t, is_leaf=_is_spec)
            for t in specs
        )
        data = NamedSharding(mesh, batch_spec)
        jit_step = jax.jit(
            train_step,
            in_shardings=(*shardings, data, data),
            out_shardings=(*shardings, None),
            donate_argnums=(0, 1, 2),
        )
        _, *ref_state = new_state()
        _, ref_losses = train(jit_step, tuple(ref_state))

    print("\nstep   loss (pjit)   loss (jax.jit)")
    for i in [*range(0, STEPS, PRINT_EVERY), STEPS - 1]:
        print(f"{i + 1:4d}   {losses[i]:11.6f}   {ref_losses[i]:14.6f}")

    print("\nwhere the parameters live (spec; each device's shard):")
    for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
        where = "/".join(str(k.key) for k in path if hasattr(k, "key"))
        shard = p.addressable_shards[0].data.shape
        print(
            f"  {where:16s} {str(p.sharding.spec):18s} {str(p.shape):9s} -> {shard} on each device"
        )

    bad = [
        where
        for tree, spec_tree in zip((params, rest, opt_state), specs, strict=True)
        for where in misplaced(tree, spec_tree, mesh)
    ]
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    if not np.allclose(losses, ref_losses, rtol=1e-5, atol=1e-5):
        sys.exit(f"pjit and jax.jit disagree: {losses} vs {ref_losses}")
    if bad:
        sys.exit(f"not laid out as their specs say: {bad}")
    if not losses[-1] < 0.5 * losses[0]:
        sys.exit(f"training did not reduce the loss: {losses}")
    print(f"pjit and jax.jit agree (rtol/atol 1e-5) on all {STEPS} losses;")
    print("params, dropout's RNG state and adamw's mu and nu are laid out as their specs say")


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, P)


def misplaced(tree: Any, specs: Any, mesh: Mesh) -> list[str]:
    """Paths of ``tree``'s arrays not laid out as ``NamedSharding(mesh, spec)`` says."""
    bad = []

    def check(path: Any, spec: P | None, leaf: jax.Array) -> None:
        if not leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec or P()), leaf.ndim):
            bad.append(jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(check, specs, tree, is_leaf=_is_spec)
    return bad


if __name__ == "__main__":
    main()
