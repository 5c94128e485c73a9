"""Quick start: train a small MLP with pjit over a 4x2 ("data", "model") mesh.

Run with ``python examples/quickstart.py``. It needs no accelerator: XLA is told
to split the host CPU into 8 virtual devices before jax is imported.

What it shows:
  * weights split over "model" (Megatron style: W1 by columns, W2 by rows),
    the batch split over "data";
  * a whole SGD step (forward, ``jax.grad``, update) inside one pjit-ed function;
  * the same steps under ``jax.jit`` give the same loss;
  * where the results live (their specs and which slice each device holds);
  * the sharding annotations partitioner writes into the StableHLO it lowers to.
"""

from __future__ import annotations

import os

# Must happen before jax is imported: jax reads XLA_FLAGS once, at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import re  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import partitioner  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit  # noqa: E402

jax.config.update("jax_platforms", "cpu")

D_IN, D_HIDDEN, D_OUT, BATCH = 16, 64, 8, 32
LEARNING_RATE = 0.1
STEPS = 10


# --- the model: plain jax, nothing partitioner-specific ---


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (D_IN, D_HIDDEN), jnp.float32) / np.sqrt(D_IN),
        "b1": jnp.zeros((D_HIDDEN,), jnp.float32),
        "w2": jax.random.normal(k2, (D_HIDDEN, D_OUT), jnp.float32) / np.sqrt(D_HIDDEN),
        "b2": jnp.zeros((D_OUT,), jnp.float32),
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    pred = h @ params["w2"] + params["b2"]
    return jnp.mean((pred - y) ** 2)


def train_step(
    params: dict[str, jax.Array], x: jax.Array, y: jax.Array
) -> tuple[dict[str, jax.Array], jax.Array]:
    # jax.grad of plain jax code, *inside* the partitioned body: XLA partitions
    # the forward and the backward pass together.
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new_params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return new_params, loss


# --- how each value is laid out over the mesh ---

PARAM_SPECS = {
    "w1": P(None, "model"),  # columns split over "model"
    "b1": P("model"),
    "w2": P("model", None),  # rows split over "model": XLA inserts the all-reduce
    "b2": None,  # None: fully replicated
}
BATCH_SPEC = P("data")  # examples split over "data"


def make_data(key: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (BATCH, D_IN), jnp.float32)
    true_w = jax.random.normal(kw, (D_IN, D_OUT), jnp.float32)
    y = jnp.tanh(x @ true_w)
    return np.asarray(x), np.asarray(y)


def train(
    step: Callable[..., Any], params: dict[str, jax.Array], x: np.ndarray, y: np.ndarray
) -> tuple[dict[str, jax.Array], list[float]]:
    """Run STEPS updates. Blocks on every step (see README "Known pitfall")."""
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, x, y)
        losses.append(float(jax.block_until_ready(loss)))
    return params, losses


# A value's type and the sharding among its attributes (``jax.arg_info`` names it too).
_ANNOTATED = re.compile(
    r'(tensor<[^>]*>) \{[^{}]*?((?:mhlo|sdy)\.sharding = (?:"[^"]*"|#sdy\.sharding<[^>]*>))'
)


def sharding_excerpt(text: str, arg_names: list[str], out_names: list[str]) -> str:
    """The mesh op and ``main``'s per-argument / per-result sharding annotations."""
    lines = text.splitlines()
    shown = [line.strip() for line in lines if line.strip().startswith("sdy.mesh")]
    signature = next(line for line in lines if "func.func public @main" in line)
    params, _, results = signature.partition(" -> ")
    for label, part, names in (("in ", params, arg_names), ("out", results, out_names)):
        for name, (tensor, attr) in zip(names, _ANNOTATED.findall(part), strict=True):
            shown.append(f"{label} {name:16s} {tensor:18s} {attr}")
    return "\n".join("    " + line for line in shown)


def leaf_names(tree: object) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def main() -> None:
    start = time.perf_counter()
    params0 = init_params(jax.random.key(0))
    x, y = make_data(jax.random.key(1))

    devices = np.array(jax.devices()).reshape(4, 2)
    print(f"{len(jax.devices())} devices, mesh 4x2 ('data', 'model')")

    step = pjit(
        train_step,
        in_axis_resources=(PARAM_SPECS, BATCH_SPEC, BATCH_SPEC),
        out_axis_resources=(PARAM_SPECS, None),
    )

    with partitioner.mesh(devices, ("data", "model")) as mesh:
        params, losses = train(step, params0, x, y)

        # Ahead of time: lower (the mesh is read here too), inspect, compile, call.
        with partitioner.spmd_partitioner("shardy"):
            lowered = step.lower(params0, x, y)
        with partitioner.spmd_partitioner("gspmd"):
            lowered_gspmd = step.lower(params0, x, y)
        compiled = lowered.compile()
        _, first_loss = compiled(params0, x, y)
        np.testing.assert_allclose(float(jax.block_until_ready(first_loss)), losses[0], rtol=1e-6)

    # The reference: the same steps under jax.jit on one device.
    ref_params, ref_losses = train(jax.jit(train_step), params0, x, y)

    print(f"\nloss  pjit: {losses[0]:.6f} -> {losses[-1]:.6f}")
    print(f"loss  jit : {ref_losses[0]:.6f} -> {ref_losses[-1]:.6f}")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    for name in params:
        np.testing.assert_allclose(params[name], ref_params[name], rtol=1e-5, atol=1e-5)
    assert losses[-1] < losses[0], "training did not reduce the loss"
    print("pjit and jax.jit agree (rtol/atol 1e-5) on every loss and parameter")
    print(f"step.lower(...).compile() gives the same first loss: {float(first_loss):.6f}")

    print("\nwhere the trained parameters live (trailing unpartitioned dims are dropped):")
    for name, p in params.items():
        print(f"  {name:3s} {str(p.shape):9s} spec={p.sharding.spec}")
        # Laid out exactly as NamedSharding(mesh, spec) lays it out.
        wanted = NamedSharding(mesh, (PARAM_SPECS[name] or P()))
        assert p.sharding.is_equivalent_to(wanted, p.ndim), (name, p.sharding)

    w1 = params["w1"]
    print(f"\nw1 {w1.shape}: device -> slice it holds (replica)")
    for shard in sorted(w1.addressable_shards, key=lambda s: s.device.id):
        rows, cols = shard.index
        print(
            f"  {shard.device}: [{rows.start or 0}:{rows.stop or w1.shape[0]}, "
            f"{cols.start}:{cols.stop}]  (replica {shard.replica_id})"
        )

    print("\nlowered StableHLO, Shardy annotations (step.lower(...).as_text()):")
    param_names = [f"params{name}" for name in leaf_names(params0)]
    arg_names, out_names = [*param_names, "x", "y"], [*param_names, "loss"]
    print(sharding_excerpt(lowered.as_text(), arg_names, out_names))
    print("\nthe same step lowered for GSPMD (inside partitioner.spmd_partitioner('gspmd')):")
    print(sharding_excerpt(lowered_gspmd.as_text(), arg_names, out_names))

    elapsed = time.perf_counter() - start
    print(f"\ndone in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
