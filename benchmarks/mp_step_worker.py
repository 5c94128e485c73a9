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
import models  # noqa: E402
import numpy as np  # noqa: E402
from bench_step import Stepper  # noqa: E402

import partitioner  # noqa: E402


def main() -> None:
    out_path, rounds = sys.argv[1], int(sys.argv[2])
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    in_specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    out_specs = models.BLOCK_PARAM_SPECS
    # Every process holds the same full values; device_put keeps its own shards.
    params = jax.device_put(models.block_params(), models.to_jax(out_specs, mesh))
    batch = jax.device_put(models.block_batch(), models.to_jax(models.BATCH_SPECS, mesh))
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        ours = partitioner.pjit(models.train_step(), in_specs, out_specs)
        theirs = jax.jit(
            models.train_step(),
            in_shardings=models.to_jax(in_specs, mesh),
            out_shardings=models.to_jax(out_specs, mesh),
        )
        samplers = {
            "partitioner": Stepper(ours, params, batch, 1),
            "jax.jit": Stepper(theirs, params, batch, 1),
        }
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
