"""Worker: train a sharded state on a 2x4 mesh over 2 processes and save it with orbax.

``checkpoint_save.py CHECKPOINT_DIR SAVED_NPZ``: every process joins the job, builds
the state with a pjit-ed init and ``STEPS`` donated pjit-ed train steps, and saves
it with orbax's ``StandardCheckpointer`` into ``CHECKPOINT_DIR``. Process 0 also
writes the full saved values to ``SAVED_NPZ`` (keyed by ``jax.tree_util.keystr``
paths): the restores must match them bit for bit. Each process prints
``holds NAME ADDRESSABLE TOTAL`` per leaf and ``saved`` at the end.

The model and layout (``init_state``, ``train_step``, ``make_data``,
``state_specs``) are ``examples/checkpoint_reshard.py``'s; the test imports them from
here, so the example, the worker and the test's reference cannot drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from tests.distributed.workers.collective import say

# The model, its train step and its layout are the checkpoint example's.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from checkpoint_reshard import (  # noqa: E402
    STEPS,
    init_state,
    make_data,
    state_specs,
    train_sharded,
    train_step,
)

__all__ = ["STEPS", "init_state", "main", "make_data", "state_specs", "train_step"]


def main(checkpoint_dir: str, saved_npz: str) -> None:
    state = train_sharded()
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
    say("saved")  # one write: C++ log lines on the same pipe cannot split it


if __name__ == "__main__":
    main(*sys.argv[1:])
