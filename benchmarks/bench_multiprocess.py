"""Figure 8: the transformer train step on 2 processes x 4 devices, and the process boundary.

Why: a job spanning processes must cost no more under partitioner than under
jax.jit, and users need to know what the process boundary itself costs. A job of
2 local processes (``python -m partitioner.launch -n 2 --devices-per-process 4``,
gloo collectives over localhost) runs the step of bench_step.py on a 4x2 mesh
spanning both, partitioner and jax.jit interleaved in the same processes, every
step blocked on (mp_step_worker.py). This process then runs the same comparison
on 1 process x 8 devices. Rows: ours / jax.jit on 2x4 (target 1.00x +- noise), the
same on 1x8, and the boundary's cost: partitioner's 2-process step over its
1-process step.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import models
from bench_step import contenders

import partitioner

NAME = "multiprocess"
TARGET = common.Target("1.00x +- noise", noise=True)
HERE = Path(__file__).resolve().parent


def run_job(rounds: int) -> dict[str, Any]:
    """The 2-process job's samples (see mp_step_worker.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
        subprocess.run(
            [
                "timeout",
                "-k",
                "5",
                "600",
                sys.executable,
                "-m",
                "partitioner.launch",
                "-n",
                "2",
                "--devices-per-process",
                "4",
                "--",
                sys.executable,
                str(HERE / "mp_step_worker.py"),
                str(out),
                str(rounds),
            ],
            check=True,
            cwd=HERE,
            env=env,
        )
        data = json.loads(out.read_text())
    data["samples"] = {k: [common.Timing(*t) for t in v] for k, v in data["samples"].items()}
    return data


def one_process(rounds: int) -> dict[str, list[common.Timing]]:
    mesh = models.mesh_4x2()
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        return common.interleave(contenders(mesh, 1), rounds)


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rounds = 5 if args.quick else 200
    job = run_job(rounds)
    two = job["samples"]
    one = one_process(rounds)
    rows = [
        common.compare(
            "transformer_step_2proc_x4dev",
            "ms/step",
            two["partitioner"],
            two["jax.jit"],
            TARGET,
            1e3,
            final_params_max_abs_diff=job["final_params_max_abs_diff"],
        ),
        common.compare(
            "transformer_step_1proc_x8dev",
            "ms/step",
            one["partitioner"],
            one["jax.jit"],
            TARGET,
            1e3,
        ),
    ]
    boundary = common.compare(
        "process_boundary (partitioner: 2x4 vs 1x8)", "ms/step", two["partitioner"], None, None, 1e3
    )
    one_ms = 1e3 * statistics.median(t.wall for t in one["partitioner"])
    boundary.extra.update(
        one_process_ms=one_ms,
        ratio_2proc_over_1proc=boundary.partitioner / one_ms,
        jax_jit_ratio_2proc_over_1proc=rows[0].jax_jit / rows[1].jax_jit
        if rows[1].jax_jit
        else None,
    )
    rows.append(boundary)
    common.print_rows("train step across processes", rows)
    print(
        f"process boundary: {boundary.partitioner:.2f} ms/step on 2 processes vs {one_ms:.2f} on one "
        f"({boundary.extra['ratio_2proc_over_1proc']:.2f}x; jax.jit "
        f"{boundary.extra['jax_jit_ratio_2proc_over_1proc']:.2f}x)"
    )
    common.write_json(NAME, rows, args.quick, samples_s={"2proc": two, "1proc": one})
    common.save_plot(
        NAME,
        lambda fig: common.bar_plot(
            fig, "train step (ms, lower is better)", rows[:2], "ms per step"
        ),
    )


if __name__ == "__main__":
    main()
