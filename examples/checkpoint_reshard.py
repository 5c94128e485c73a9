"""Save a sharded train state from a 2-process 2x4 run with orbax; restore it as 1x8 and 4x2.

Run with ``python examples/checkpoint_reshard.py``. It needs no accelerator: the
save runs as two processes of 4 virtual CPU devices each (``partitioner.launch``),
the restore as one process of 8.

What it shows:
  * two processes of one ``jax.distributed`` job build a train state (MLP
    parameters, an optax adamw state, a step counter) with a pjit-ed init and a
    few donated pjit-ed train steps over a 2x4 ("data", "model") mesh whose
    "data" axis spans the processes: each process holds only its half of the
    arrays split over "data", and feeds only its half of the batch
    (``host_local_slice`` / ``host_local_to_global``);
  * orbax's ``StandardCheckpointer`` saves that state from both processes, each
    writing the shards it holds;
  * one process restores the checkpoint into a 1x8 and into a 4x2 mesh by giving
    orbax abstract targets (``jax.ShapeDtypeStruct(..., sharding=NamedSharding(new
    mesh, spec))``): every leaf arrives laid out over the new mesh;
  * the values are identical: the restores have the saved state's fingerprint
    (an exact digest of every bit), and they match the same steps run again here
    under ``jax.jit`` (the script exits non-zero otherwise).

The two halves run alone too::

    python -m partitioner.launch -n 2 --devices-per-process 4 -- \\
        python examples/checkpoint_reshard.py save DIR
    python examples/checkpoint_reshard.py restore DIR
"""

from __future__ import annotations

import os
import sys

SAVING = sys.argv[1:2] == ["save"]
if __name__ == "__main__" and not SAVING:
    # Must happen before jax is imported: jax reads XLA_FLAGS once, at start-up. The
    # save processes get their 4 devices each from the launcher instead; a module
    # importing this one (the checkpoint test's worker) keeps its own settings.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

import partitioner.distributed as pd  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit  # noqa: E402

jax.config.update("jax_platforms", "cpu")

D_IN, HIDDEN, D_OUT, BATCH, STEPS = 16, 64, 8, 32, 3
TX = optax.adamw(1e-2, weight_decay=1e-4)

# Both kernels are split over both axes, so each process of the 2x4 run holds only
# half of them (the "data" axis spans the processes) and writes only that half.
PARAM_SPECS = {
    "w1": P("data", "model"),
    "b1": P("model"),
    "w2": P("model", "data"),
    "b2": None,  # None: replicated
}


# --- the train state: plain jax and optax, nothing partitioner-specific ---


def init_state(key: jax.Array) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (D_IN, HIDDEN), jnp.float32) / np.sqrt(D_IN),
        "b1": jnp.zeros((HIDDEN,), jnp.float32),
        "w2": jax.random.normal(k2, (HIDDEN, D_OUT), jnp.float32) / np.sqrt(HIDDEN),
        "b2": jnp.zeros((D_OUT,), jnp.float32),
    }
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt": TX.init(params)}


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array) -> dict[str, Any]:
    grads = jax.grad(loss_fn)(state["params"], x, y)
    updates, opt = TX.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"step": state["step"] + 1, "params": params, "opt": opt}


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """The whole batch: every process computes it and keeps its own rows."""
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D_IN).astype(np.float32)
    return x, np.tanh(x @ rng.randn(D_IN, D_OUT).astype(np.float32))


def state_specs() -> Any:
    """Adam's moments laid out as the parameters they follow; the counters replicated."""
    shapes = jax.eval_shape(init_state, jax.random.key(0))
    opt = optax.tree_map_params(
        TX, lambda _, s: s, shapes["opt"], PARAM_SPECS, transform_non_params=lambda _: None
    )
    return {"step": None, "params": PARAM_SPECS, "opt": opt}


def make_mesh(shape: tuple[int, int]) -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(shape), ("data", "model"))


def shardings_over(mesh: Mesh) -> Any:
    """The state's specs as shardings over ``mesh`` (None: replicated)."""
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s or P()),
        state_specs(),
        is_leaf=lambda s: s is None or isinstance(s, P),
    )


@jax.jit
def fingerprint(tree: Any) -> jax.Array:
    """A uint32 digest of every bit of every leaf (32-bit leaves), in tree and element order.

    Integer sums wrap and do not depend on the order they are added in, so the
    digest is the same however the leaves are laid out, over one process or
    several. Each element gets an odd weight: changing any one element changes it.
    """
    digest = jnp.uint32(0)
    for leaf in jax.tree.leaves(tree):
        bits = jax.lax.bitcast_convert_type(leaf, jnp.uint32).ravel()
        weights = 2 * jnp.arange(bits.size, dtype=jnp.uint32) + 1
        digest = digest * jnp.uint32(1_000_003) + jnp.sum(bits * weights, dtype=jnp.uint32)
    return digest


# --- save: two processes, a 2x4 mesh ---


def train_sharded() -> dict[str, Any]:
    """Join the 2-process job and train the state on its 2x4 mesh; each process feeds its rows."""
    pd.initialize()  # before anything touches a jax device
    mesh = make_mesh((2, 4))
    specs = state_specs()
    x, y = make_data()
    rows = pd.host_local_slice(x.shape, mesh, P("data"))
    batch = pd.host_local_to_global((x[rows], y[rows]), mesh, P("data"))
    with jax.set_mesh(mesh):
        init = pjit(lambda: init_state(jax.random.key(0)), (), specs)
        step = pjit(train_step, (specs, P("data"), P("data")), specs, donate_argnums=0)
        state = init()
        for _ in range(STEPS):
            state = step(state, *batch)
    return state


def save(directory: Path) -> None:
    state = train_sharded()
    w1 = state["params"]["w1"]
    print(
        f"process {jax.process_index()}: step {int(state['step'])}, holds "
        f"{len(w1.addressable_shards)} of w1's {w1.sharding.num_devices} shards, "
        f"state fingerprint {int(fingerprint(state)):#010x}"
    )
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, state)
    checkpointer.wait_until_finished()  # orbax writes in the background
    checkpointer.close()


# --- restore: one process, 1x8 and 4x2 meshes ---


def reference_state() -> dict[str, Any]:
    """The same init and steps under ``jax.jit``, on one device."""
    x, y = make_data()
    state = jax.jit(init_state)(jax.random.key(0))
    step = jax.jit(train_step)
    for _ in range(STEPS):
        state = step(state, x, y)
    return jax.device_get(state)


def restore(directory: Path) -> list[int]:
    """Restore into 1x8 and 4x2; exit non-zero unless both match the reference.

    Returns:
        The two restores' fingerprints.
    """
    expected = jax.tree.leaves(reference_state())
    shapes = jax.eval_shape(init_state, jax.random.key(0))
    checkpointer = ocp.StandardCheckpointer()
    fingerprints, problems = [], []
    for shape in ((1, 8), (4, 2)):
        shardings = shardings_over(make_mesh(shape))
        target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings
        )
        state = checkpointer.restore(directory, target)
        fingerprints.append(int(fingerprint(state)))
        print(f"\nrestored into a {shape[0]}x{shape[1]} ('data', 'model') mesh:")
        print(f"  {'leaf':27s} {'shape':9s} {'spec':24s} one device holds   vs jax.jit")
        flat, _ = jax.tree_util.tree_flatten_with_path(state)
        for (path, leaf), want, sharding in zip(
            flat, expected, jax.tree.leaves(shardings), strict=True
        ):
            name = jax.tree_util.keystr(path)
            # The 2x4 run summed over its devices in another order than one device
            # does: float32 rounding differs in the last bits, no more.
            close = np.allclose(leaf, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
            print(
                f"  {name:27s} {str(leaf.shape):9s} {str(leaf.sharding.spec):24s} "
                f"{str(leaf.addressable_shards[0].data.shape):17s} {'ok' if close else 'DIFFERS'}"
            )
            if not close or leaf.sharding != sharding:
                problems.append(f"{shape}: {name}: close={close}, sharding {leaf.sharding}")
        print(f"  state fingerprint {fingerprints[-1]:#010x}")
    checkpointer.close()
    if problems:
        sys.exit("restored leaves differ from the reference:\n  " + "\n  ".join(problems))
    if fingerprints[0] != fingerprints[1]:
        sys.exit(f"the two restores differ: fingerprints {fingerprints}")
    return fingerprints


def main() -> None:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "state"
        command = [sys.executable, "-m", "partitioner.launch", "-n", "2"]
        command += ["--devices-per-process", "4", "--"]
        command += [sys.executable, __file__, "save", str(directory)]
        print("saving from 2 processes x 4 devices, a 2x4 mesh:")
        saved = subprocess.run(command, capture_output=True, text=True, timeout=120)
        print("\n".join(line for line in saved.stdout.splitlines() if "fingerprint" in line))
        if saved.returncode:
            sys.exit(f"the save failed ({saved.returncode}):\n{saved.stderr}")
        restored = restore(directory)
    saved_prints = {int(f, 16) for f in re.findall(r"fingerprint (0x[0-9a-f]+)", saved.stdout)}
    if saved_prints != {restored[0]}:
        sys.exit(f"saved fingerprints {saved_prints} differ from the restored {restored}")
    print("\nboth restores hold the saved values bit for bit (same fingerprint as the save)")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("save", "restore"):
        (save if SAVING else restore)(Path(sys.argv[2]).absolute())
    elif len(sys.argv) == 1:
        main()
    else:
        sys.exit(f"usage: {sys.argv[0]} [save DIR | restore DIR]")
