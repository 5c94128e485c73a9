"""One process of bench_multiprocess.py's job: the transformer train step, ours vs jax.jit.

Run by ``python -m partitioner.launch -n 2 --devices-per-process 4`` (never alone).
Both contenders run in the same processes on the same global arrays, interleaved
(``common.interleave``), each step blocked on; process 0 writes the samples to the
JSON path it is given.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS (without a device count: the launcher's) before jax

# isort: split
import json
import sys

import partitioner.distributed as pd

pd.initialize()

# isort: split
import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_step import contenders  # noqa: E402

import partitioner  # noqa: E402


def main() -> None:
    out_path, rounds = sys.argv[1], int(sys.argv[2])
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        samplers = contenders(mesh, 1)
        samples = common.interleave(samplers, rounds)
        diff = max(
            float(
                np.max(
                    np.abs(np.asarray(a.addressable_data(0)) - np.asarray(b.addressable_data(0)))
                )
            )
            for a, b in zip(
                jax.tree.leaves(samplers["partitioner"].params),
                jax.tree.leaves(samplers["jax.jit"].params),
                strict=True,
            )
        )
    if jax.process_index() == 0:
        payload = {
            "samples": {k: [list(t) for t in v] for k, v in samples.items()},  # (wall, cpu)
            "final_params_max_abs_diff": diff,
            "processes": jax.process_count(),
            "devices": jax.device_count(),
        }
        with open(out_path, "w") as f:
            json.dump(payload, f)


if __name__ == "__main__":
    main()
