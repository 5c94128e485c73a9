"""The training loop of test_train_matches_one_process: a pjit step over a 2x4 global mesh.

Prints ``LOSS <step> <value>`` (process 0) for every step; the batch is fed as
each process's host-local rows (``host_local_slice`` + ``host_local_to_global``).
"""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
import jax  # noqa: E402
import numpy as np  # noqa: E402
from train_step import SPECS, STEPS, batch, init_params, train_step  # noqa: E402

import partitioner  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402

MESH = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
with partitioner.mesh(MESH.devices, MESH.axis_names):
    step = partitioner.pjit(
        train_step, (SPECS, P("data"), P("data")), (SPECS, None), donate_argnums=0
    )
    params = init_params()
    x, y = batch()
    mine = pd.host_local_slice(x.shape, MESH, P("data"))
    xs, ys = pd.host_local_to_global((x[mine], y[mine]), MESH, P("data"))
    for i in range(STEPS):
        params, loss = step(params, xs, ys)
        loss = float(loss)  # blocks each step (README, "Known pitfall")
        if jax.process_index() == 0:
            print(f"LOSS {i} {loss!r}", flush=True)
print("DONE", flush=True)
