"""Worker: train a sharded state on a 2x4 mesh over 2 processes and save it with orbax.

``checkpoint_save.py CHECKPOINT_DIR SAVED_NPZ``: every process joins the job, builds
the state with a pjit-ed init and ``STEPS`` donated pjit-ed train steps, and saves
it with orbax's ``StandardCheckpointer`` into ``CHECKPOINT_DIR``. Process 0 also
writes the full saved values to ``SAVED_NPZ`` (keyed by ``jax.tree_util.keystr``
paths): the restores must match them bit for bit. Each process prints
``holds NAME ADDRESSABLE TOTAL`` per leaf and ``saved`` at the end.

The test imports the model and layout from here (``init_state``, ``train_step``,
``make_data``, ``state_specs``), so the worker and its reference cannot drift apart.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh

import partitioner.distributed as pd
from partitioner import PartitionSpec as P
from partitioner import pjit

D_IN, HIDDEN, D_OUT, BATCH, STEPS = 8, 32, 8, 16, 3
TX = optax.adamw(1e-2, weight_decay=1e-4)

# The "data" axis spans the two processes: each holds half of what it splits.
PARAM_SPECS = {"w1": P("data", "model"), "b1": P("model"), "w2": P("model", "data"), "b2": None}


def init_state(key: jax.Array) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (D_IN, HIDDEN), jnp.float32) / np.sqrt(D_IN),
        "b1": jnp.zeros((HIDDEN,), jnp.float32),
        "w2": jax.random.normal(k2, (HIDDEN, D_OUT), jnp.float32) / np.sqrt(HIDDEN),
        "b2": jnp.zeros((D_OUT,), jnp.float32),
    }
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt": TX.init(params)}


def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array) -> dict[str, Any]:
    def loss_fn(params: dict[str, jax.Array]) -> jax.Array:
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)

    grads = jax.grad(loss_fn)(state["params"])
    updates, opt = TX.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"step": state["step"] + 1, "params": params, "opt": opt}


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D_IN).astype(np.float32)
    return x, np.tanh(x @ rng.randn(D_IN, D_OUT).astype(np.float32))


def state_specs() -> Any:
    """Adam's moments laid out as their parameters; the counters replicated (None)."""
    shapes = jax.eval_shape(init_state, jax.random.key(0))
    opt = optax.tree_map_params(
        TX, lambda _, s: s, shapes["opt"], PARAM_SPECS, transform_non_params=lambda _: None
    )
    return {"step": None, "params": PARAM_SPECS, "opt": opt}


def main(checkpoint_dir: str, saved_npz: str) -> None:
    pd.initialize()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
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
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = jax.tree_util.keystr(path)
        print(f"holds {name} {len(leaf.addressable_shards)} {leaf.sharding.num_devices}")

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(checkpoint_dir, state)
    checkpointer.wait_until_finished()
    checkpointer.close()

    saved = multihost_utils.process_allgather(state, tiled=True)  # every process takes part
    if jax.process_index() == 0:
        flat = jax.tree_util.tree_flatten_with_path(saved)[0]
        np.savez(saved_npz, **{jax.tree_util.keystr(path): leaf for path, leaf in flat})
    print("saved")


if __name__ == "__main__":
    main(*sys.argv[1:])
