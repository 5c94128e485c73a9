"""Log the loss and gradient norms from inside a pjit-ed train step with ``id_tap``.

Run with ``python examples/tap_training.py``. It needs no accelerator: XLA is told
to split the host CPU into 8 virtual devices before jax is imported.

What it shows:
  * a flax linen MLP with dropout (a typed PRNG key in the training state) and an
    optax adamw optimizer, trained by a donated ``pjit`` step over a 4x2
    ("data", "model") mesh;
  * ``id_tap`` inside the step sends the step number, the loss and the global and
    per-layer gradient norms to a Python function on the host, once per step, in
    step order, while the step runs: the loop never waits for a value to log it;
  * ``id_tap(..., tap_with_device=True, per_shard=True)`` shows each device's shard of the batch
    loss (the data axis splits the batch four ways);
  * ``barrier_wait()`` waits for every tap; the logged losses are checked against
    the same steps under ``jax.jit`` without taps (the script exits non-zero if
    they differ).
"""

from __future__ import annotations

import os

# Must happen before jax is imported: jax reads XLA_FLAGS once, at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import sys  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402

from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit  # noqa: E402
from partitioner.host_callback import barrier_wait, id_tap  # noqa: E402

jax.config.update("jax_platforms", "cpu")

D_IN, HIDDEN, D_OUT, BATCH, STEPS = 16, 64, 4, 64, 12
TX = optax.adamw(3e-3, weight_decay=1e-4)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        x = nn.relu(nn.Dense(HIDDEN, name="hidden")(x))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(D_OUT, name="out")(x)


MODEL = MLP()


def init_state() -> dict[str, Any]:
    x = jnp.zeros((1, D_IN))
    params = MODEL.init(jax.random.key(0), x, train=False)["params"]
    return {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt": TX.init(params),
        "rng": jax.random.key(1),  # a typed PRNG key: dropout's
    }


# The host side: what the taps call. They run on the receiver's thread, in order.
LOG: list[dict[str, Any]] = []
SHARD_LOSSES: dict[int, list[tuple[int, float]]] = {}


def log_metrics(metrics: dict[str, np.ndarray], transforms: tuple[str, ...]) -> None:
    LOG.append({k: v.item() for k, v in metrics.items()})


def log_shard(shard_losses: np.ndarray, transforms: tuple[str, ...], device: Any) -> None:
    SHARD_LOSSES.setdefault(device.id, []).append((len(shard_losses), float(shard_losses.mean())))


def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array, *, tap: bool) -> Any:
    rng, dropout = jax.random.split(state["rng"])

    def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
        pred = MODEL.apply({"params": params}, x, train=True, rngs={"dropout": dropout})
        per_example = jnp.mean((pred - y) ** 2, axis=-1)
        return per_example.mean(), per_example

    (loss, per_example), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    if tap:
        norms = {f"{name}_norm": optax.tree.norm(g) for name, g in grads.items()}
        metrics = {"step": state["step"], "loss": loss, "grad_norm": optax.tree.norm(grads)}
        loss = id_tap(log_metrics, {**metrics, **norms}, result=loss)
        loss = id_tap(log_shard, per_example, result=loss, tap_with_device=True, per_shard=True)
    updates, opt = TX.update(grads, state["opt"], state["params"])
    new_state = {
        "step": state["step"] + 1,
        "params": optax.apply_updates(state["params"], updates),
        "opt": opt,
        "rng": rng,
    }
    return new_state, loss


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D_IN).astype(np.float32)
    return x, np.tanh(x @ rng.randn(D_IN, D_OUT).astype(np.float32))


def state_specs(state: dict[str, Any]) -> Any:
    """Hidden units over "model"; everything else replicated (None)."""
    params = {
        "hidden": {"kernel": P(None, "model"), "bias": P("model")},
        "out": {"kernel": P("model", None), "bias": None},
    }
    opt = optax.tree_map_params(
        TX, lambda _, s: s, state["opt"], params, transform_non_params=lambda _: None
    )
    return {"step": None, "params": params, "opt": opt, "rng": None}


def main() -> None:
    mesh = Mesh(
        np.array(jax.devices()).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )
    x, y = make_data()
    specs = state_specs(init_state())
    state, ref_state = init_state(), init_state()  # outside the mesh context: uncommitted
    with jax.set_mesh(mesh):
        step = pjit(
            lambda s, x, y: train_step(s, x, y, tap=True),
            (specs, P("data"), P("data")),
            (specs, None),
            donate_argnums=0,
        )
        for _ in range(STEPS):  # never blocks: the taps report as the steps run
            state, _ = step(state, x, y)
        barrier_wait()  # every tap of every launched step has run

        shardings = jax.tree.map(
            lambda s: NamedSharding(mesh, s or P()),
            specs,
            is_leaf=lambda s: s is None or isinstance(s, P),
        )
        data = NamedSharding(mesh, P("data"))
        reference = jax.jit(
            lambda s, x, y: train_step(s, x, y, tap=False),
            in_shardings=(shardings, data, data),
            out_shardings=(shardings, None),
        )
        ref_losses = []
        for _ in range(STEPS):
            ref_state, loss = reference(ref_state, x, y)
            ref_losses.append(float(loss))

    print("step    loss       grad_norm   hidden_norm   out_norm")
    for m in LOG:
        print(
            f"{m['step']:4d}   {m['loss']:.6f}   {m['grad_norm']:.6f}    "
            f"{m['hidden_norm']:.6f}      {m['out_norm']:.6f}"
        )
    print("\nlast step's loss on each device's shard of the batch (examples, mean);")
    print('the two devices of one "data" shard agree: "model" replicates the batch')
    for device_id, shards in sorted(SHARD_LOSSES.items()):
        print(f"  device {device_id}: {shards[-1][0]} examples, loss {shards[-1][1]:.6f}")

    logged = [m["loss"] for m in LOG]
    if [m["step"] for m in LOG] != list(range(STEPS)):
        sys.exit(f"taps out of order or missing: {[m['step'] for m in LOG]}")
    if not np.allclose(logged, ref_losses, rtol=1e-5, atol=1e-6):
        sys.exit(f"tapped losses differ from jax.jit's: {logged} vs {ref_losses}")
    if any(len(v) != STEPS for v in SHARD_LOSSES.values()) or len(SHARD_LOSSES) != 8:
        sys.exit(f"per-device taps missing: { {k: len(v) for k, v in SHARD_LOSSES.items()} }")
    print("\nthe tapped losses match jax.jit's; every tap arrived, in step order")


if __name__ == "__main__":
    main()
