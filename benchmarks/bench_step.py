"""Figure 3: steady-state train step (fwd + bwd + SGD) of the transformer block on 4x2.

Why: once compiled, a partitioned training loop must run as fast as jax.jit's; the
program is the same, so any gap is dispatch. The step has collectives, so on CPU
every result is blocked on (README, "block on results"): more than ~32 un-blocked
launches would hang XLA's rendezvous. Each contender carries its own parameters
from step to step; both start equal and take the same number of steps, so their
final parameters must agree (checked and stored).
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
from collections.abc import Callable
from typing import Any

import jax
import models
import numpy as np

import partitioner

NAME = "step"
TARGET = common.Target("1.00x +- noise", noise=True)


class Stepper:
    """A sampler that takes ``steps`` blocked train steps, carrying its own parameters."""

    def __init__(self, step: Callable[..., Any], params: Any, batch: Any, steps: int) -> None:
        self.step, self.params, self.batch, self.steps = step, params, batch, steps

    def __call__(self) -> common.Timing:
        p = self.params
        with common.stopwatch() as t:
            for _ in range(self.steps):
                p = jax.block_until_ready(self.step(p, self.batch))
        self.params = p
        return t[0] / self.steps


def contenders(mesh: jax.sharding.Mesh, steps: int) -> dict[str, Stepper]:
    """partitioner's and jax.jit's train step of the transformer block over ``mesh``.

    Same program, same layouts (``models``' specs), same starting parameters and
    batch. The figures that time it (this one, the multi-process one and its
    worker) call the samplers with the mesh in context, as pjit reads it per call.
    """
    in_specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    out_specs = models.BLOCK_PARAM_SPECS
    # In a job of several processes every process holds the same full values;
    # device_put keeps its own shards.
    params = jax.device_put(models.block_params(), models.to_jax(out_specs, mesh))
    batch = jax.device_put(models.block_batch(), models.to_jax(models.BATCH_SPECS, mesh))
    ours = partitioner.pjit(models.train_step(), in_specs, out_specs)
    theirs = jax.jit(
        models.train_step(),
        in_shardings=models.to_jax(in_specs, mesh),
        out_shardings=models.to_jax(out_specs, mesh),
    )
    return {
        "partitioner": Stepper(ours, params, batch, steps),
        "jax.jit": Stepper(theirs, params, batch, steps),
    }


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    # One step per sample and many rounds: load phases of a shared machine (seconds
    # long) then hit both contenders alike, which 20-step samples did not.
    rounds, steps = (5, 1) if args.quick else (300, 1)
    mesh = models.mesh_4x2()
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        samplers = contenders(mesh, steps)
        samples = common.interleave(samplers, rounds)
        final = {k: s.params for k, s in samplers.items()}
        diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(
                jax.tree.leaves(final["partitioner"]),
                jax.tree.leaves(final["jax.jit"]),
                strict=True,
            )
        )
        row = common.compare(
            "transformer_train_step",
            "ms/step",
            samples["partitioner"],
            samples["jax.jit"],
            TARGET,
            1e3,
            steps_per_sample=steps,
            final_params_max_abs_diff=diff,
            dims=vars(models.DIMS),
        )
        profiles: dict[str, list[str]] = {}
        if common.should_profile(args, row):
            run = samplers["partitioner"]
            profiles[row.name] = common.profile_top(lambda: [run() for _ in range(20)])

    rows = [row]
    common.print_rows("train step (steady state)", rows)
    print(f"final parameters, max |partitioner - jax.jit| = {diff:.3g}")
    for name, lines in profiles.items():
        print(f"\n-- cProfile, partitioner side, {name} --")
        print("\n".join(lines))
    common.write_json(NAME, rows, args.quick, samples_s=samples, profiles=profiles)
    common.save_plot(NAME, lambda fig: _draw(fig, samples, row))


def _draw(fig: Any, samples: dict[str, list[common.Timing]], row: common.Row) -> None:
    """Per-round step times (interleaved) and their distributions."""
    left = fig.add_subplot(1, 2, 1)
    for name, xs in samples.items():
        left.plot([1e3 * x.wall for x in xs], marker=".", label=name)
    left.set_xlabel("round")
    left.set_ylabel("ms per step")
    left.set_title("interleaved rounds")
    left.legend(fontsize=8)
    right = fig.add_subplot(1, 2, 2)
    right.boxplot([[1e3 * x.wall for x in xs] for xs in samples.values()])
    right.set_xticks(range(1, len(samples) + 1))
    right.set_xticklabels(list(samples))
    right.set_title(f"median ratio {row.ratio:.3f}x")
    fig.suptitle("transformer block train step on a 4x2 mesh (lower is better)")


if __name__ == "__main__":
    main()
