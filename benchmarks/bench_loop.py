"""Figure 6: the train step as real loops run it: donated state, a loss blocked on.

Why: real loops donate their state (``state, loss = step(state, batch)`` with
``donate_argnums=0``) and block on the loss every step. Donating executables, and
on CPU those with collectives, need a little Python around each C++ call
(NOTE [guarded C++ calls] in ``partitioner/_src/dispatch/fastpath.py``); this figure
holds that to the target. Four programs: 10 and 200 parameter leaves, with
collectives (parameters replicated, the gradient all-reduced over the sharded
batch) and without (parameters sharded like the batch, no communication). Each
round times a burst of steps per contender, the contenders rotating; each carries
its own state, and the final parameters must agree.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner
from partitioner._testing import call_is_guarded

NAME = "loop"
TARGET = common.Target("<= 1.05", hi=1.05)


@dataclass(frozen=True)
class Case:
    name: str
    leaves: int
    collectives: bool


CASES = (
    Case("10 leaves, no collectives", 10, False),
    Case("200 leaves, no collectives", 200, False),
    Case("10 leaves, with collectives", 10, True),
    Case("200 leaves, with collectives", 200, True),
)


def program(case: Case) -> tuple[Callable[..., Any], Any, Any, P, P, P]:
    """``(step, params, batch, param spec, batch spec, loss spec)`` for a case."""
    if case.collectives:

        def step(params: Any, batch: Any) -> Any:
            g = jnp.mean(batch, axis=0)  # over the sharded batch: an all-reduce
            return jax.tree.map(lambda w: w * 0.99 - 0.01 * g, params), jnp.sum(g)

        params = {f"w{i}": np.full((16,), 0.01 * i, np.float32) for i in range(case.leaves)}
        return step, params, np.ones((64, 16), np.float32), P(), P("data"), P()

    def local_step(params: Any, batch: Any) -> Any:
        return jax.tree.map(lambda w: w * 0.99 + batch, params), batch[:, 0]

    params = {f"w{i}": np.ones((64, 16), np.float32) for i in range(case.leaves)}
    return local_step, params, np.ones((64, 16), np.float32), P("data"), P("data"), P("data")


class Loop:
    """A sampler: ``steps`` donated steps, each blocked on its loss, carrying the state."""

    def __init__(self, step: Callable[..., Any], state: Any, batch: Any, steps: int) -> None:
        self.step, self.state, self.batch, self.steps = step, state, batch, steps

    def __call__(self) -> common.Timing:
        state, step, batch = self.state, self.step, self.batch
        with common.stopwatch() as t:
            for _ in range(self.steps):
                state, loss = step(state, batch)
                loss.block_until_ready()
        self.state = state
        return t[0] / self.steps


def measure(case: Case, mesh: Mesh, rounds: int, steps: int) -> tuple[common.Row, Any]:
    step, params, batch, pspec, bspec, lspec = program(case)
    pshard, bshard = NamedSharding(mesh, pspec), NamedSharding(mesh, bspec)
    ours = partitioner.pjit(step, (pspec, bspec), (pspec, lspec), donate_argnums=0)
    theirs = jax.jit(
        step,
        in_shardings=(pshard, bshard),
        out_shardings=(pshard, NamedSharding(mesh, lspec)),
        donate_argnums=0,
    )
    batch = jax.device_put(batch, bshard)
    samplers = {
        "partitioner": Loop(ours, jax.device_put(params, pshard), batch, steps),
        "jax.jit": Loop(theirs, jax.device_put(params, pshard), batch, steps),
    }
    samples = common.interleave(samplers, rounds, warmup=2)
    final = {k: s.state for k, s in samplers.items()}
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(
            jax.tree.leaves(final["partitioner"]), jax.tree.leaves(final["jax.jit"]), strict=True
        )
    )
    guarded = call_is_guarded(ours)  # the thin Python guard around the C++ call
    row = common.compare(
        case.name,
        "us/step",
        samples["partitioner"],
        samples["jax.jit"],
        TARGET,
        1e6,
        steps_per_sample=steps,
        final_params_max_abs_diff=diff,
        cpp_guard=guarded,
    )
    return row, samples


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rounds, steps = (4, 5) if args.quick else (120, 25)
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rows, all_samples = [], {}
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        for case in CASES:
            row, samples = measure(case, mesh, rounds, steps)
            rows.append(row)
            all_samples[case.name] = samples
            if row.extra["final_params_max_abs_diff"] > 1e-5:
                raise SystemExit(f"{case.name}: parameters differ from jax.jit's")
    common.print_rows("train loop: donated state, loss blocked on each step", rows)
    common.write_json(NAME, rows, args.quick, samples_s=all_samples)
    common.save_plot(NAME, lambda fig: _draw(fig, rows))


def _draw(fig: Any, rows: list[common.Row]) -> None:
    common.bar_plot(
        fig, "donated train step, blocked on the loss (lower is better)", rows, "us/step"
    )


if __name__ == "__main__":
    main()
