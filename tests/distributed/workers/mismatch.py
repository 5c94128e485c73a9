"""Process 1 calls the pjit-ed function with another shape than process 0."""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
import jax  # noqa: E402
import numpy as np  # noqa: E402

import partitioner  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402

MESH = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
rows = 8 if jax.process_index() == 0 else 16
with partitioner.mesh(MESH.devices, MESH.axis_names):
    f = partitioner.pjit(lambda x: (x @ x.T).sum(), P("a"), None)
    print("RESULT", float(f(np.ones((rows, 8), np.float32))), flush=True)
