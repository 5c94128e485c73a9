"""Figure 13: pipeline stages: memory per device, bytes moved, step time, bubble.

Why: ``partitioner.pipeline`` spreads a stack of layers over a mesh axis so that
each device holds its stage's parameters and optimizer state, and only
neighbouring stages exchange activations. The train step here (a residual MLP
stack, a hand-written Adam: parameters and two moments per leaf) runs three ways
on the ("stage", "data") 4x2 mesh, all with XLA's figures:

- pipelined: the stack laid out ``P("stage")`` on its layer dimension, gpipe and
  circular, 4 microbatches;
- replicated: the plain scan with the stack on every device, the batch over all 8
  (data parallel), under jax.jit;
- FSDP: the plain scan with the stack split over "stage" on its layer dimension
  (each layer gathered where it is used), the batch over all 8, under jax.jit.

What CPU devices show: per-device memory (parameters + optimizer state, and XLA's
whole figure), collective bytes, values. What they cannot: speed. The 8 devices
share two cores, so a pipeline's stages do not run at the same time and its step
is not faster here; its time is given beside the plain scan's to show the cost of
the schedule's extra work (bubble slots compute too), not a speedup. The bubble
fraction per schedule and microbatch count is the schedule's arithmetic.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner._src.pipeline.schedule import Schedule

NAME = "pipeline"
LAYERS, BATCH, WIDTH, HIDDEN = 8, 64, 256, 1024
STAGES, MICRO = 4, 4
LESS = common.Target("< 1.00x", hi=1.0)


def _layer(p: dict[str, jax.Array], h: jax.Array) -> jax.Array:
    return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def _plain(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda h, p: (_layer(p, h), None), x, params)[0]


def _train_step(forward: Any) -> Any:
    def step(state: Any, x: jax.Array, y: jax.Array) -> Any:
        params, m, v = state
        loss, g = jax.value_and_grad(lambda p: jnp.mean((forward(p, x) - y) ** 2))(params)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        params = jax.tree.map(lambda p, a, b: p - 1e-3 * a / (jnp.sqrt(b) + 1e-8), params, m, v)
        return (params, m, v), loss

    return step


@functools.cache
def _inputs() -> tuple[Any, jax.Array, jax.Array]:
    """Host arrays (uncommitted: each program lays them out as it asks)."""
    k1, k2, kx, ky = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k1, (LAYERS, WIDTH, HIDDEN)) / math.sqrt(WIDTH),
        "w2": jax.random.normal(k2, (LAYERS, HIDDEN, WIDTH)) / math.sqrt(HIDDEN) / 4,
    }
    zeros = jax.tree.map(jnp.zeros_like, params)
    x, y = (jax.random.normal(k, (BATCH, WIDTH)) for k in (kx, ky))
    return jax.device_get(((params, zeros, zeros), x, y))


def _state_bytes(compiled: Any, state: Any) -> int:
    """Per-device bytes of the parameters and optimizer state, from the input shardings."""
    shardings = jax.tree.leaves(compiled.input_shardings[0][0])
    leaves = jax.tree.leaves(state)
    return sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for s, a in zip(shardings, leaves, strict=True)
    )


def _collective_bytes(report: Any) -> int:
    return sum(c.bytes_per_device * c.count for c in report.collectives)


def _programs(mesh: Mesh) -> dict[str, Any]:
    """Each way of running the step: (callable, compiled, report)."""
    stack = {"w1": P("stage"), "w2": P("stage")}
    out: dict[str, Any] = {}
    state, x, y = _inputs()
    for schedule in ("gpipe", "circular"):
        run = partitioner.pipeline(_layer, axis="stage", microbatches=MICRO, schedule=schedule)
        f = partitioner.pjit(
            _train_step(run),
            in_axis_resources=((stack, stack, stack), P("data"), P("data")),
            out_axis_resources=((stack, stack, stack), P()),
            donate_argnums=0,
        )
        compiled = f.lower(state, x, y).compile()
        out[f"pipelined {schedule}"] = (f, compiled, compiled.report())
    everywhere = P(("stage", "data"))
    for name, spec in (("replicated", P()), ("FSDP", P("stage"))):
        s = NamedSharding(mesh, spec)
        b = NamedSharding(mesh, everywhere)
        g = jax.jit(
            _train_step(_plain),
            in_shardings=((s, s, s), b, b),
            out_shardings=((s, s, s), NamedSharding(mesh, P())),
            donate_argnums=0,
        )
        compiled = g.lower(state, x, y).compile()
        ours = partitioner.jit(  # the same program through partitioner, for XLA's report
            _train_step(_plain),
            in_shardings=((s, s, s), b, b),
            out_shardings=((s, s, s), NamedSharding(mesh, P())),
        )
        out[name] = (g, compiled, ours.lower(state, x, y).compile().report())
    return out


def _check_values(programs: dict[str, Any]) -> None:
    state, x, y = _inputs()
    want = jax.jit(_train_step(_plain))(state, x, y)
    for f, _, _ in programs.values():
        got = f(state, x, y)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-5)


def memory_rows(programs: dict[str, Any]) -> list[common.Row]:
    state = _inputs()[0]
    rows = []
    figures = {
        k: (_state_bytes(c, state), r.memory.total, _collective_bytes(r))
        for k, (_, c, r) in programs.items()
    }
    for ours in ("pipelined gpipe", "pipelined circular"):
        for theirs in ("replicated", "FSDP"):
            for i, (what, unit, scale) in enumerate(
                [
                    ("parameters + Adam state", "KiB/device", 1 / 1024),
                    ("XLA memory (args + outputs + temps)", "KiB/device", 1 / 1024),
                    ("collective bytes", "KiB/device", 1 / 1024),
                ]
            ):
                rows.append(
                    common.compare(
                        f"{ours} / {theirs}: {what}",
                        unit,
                        [figures[ours][i]],
                        [figures[theirs][i]],
                        LESS if i == 0 else None,
                        scale,
                    )
                )
    return rows


def time_rows(programs: dict[str, Any], rounds: int) -> list[common.Row]:
    state, x, y = _inputs()

    def sampler(f: Any) -> Any:
        current = [state]

        def run() -> common.Timing:
            with common.stopwatch() as t:
                current[0], loss = f(current[0], x, y)
                jax.block_until_ready(loss)  # block: see docs/cpu.md (CPU rendezvous)
            return t[0]

        return run

    samples = common.interleave({k: sampler(f) for k, (f, _, _) in programs.items()}, rounds)
    return [
        common.compare(
            f"step: {ours} / replicated plain scan (jax.jit)",
            "ms",
            samples[ours],
            samples["replicated"],
            None,
            1e3,
        )
        for ours in ("pipelined gpipe", "pipelined circular", "FSDP")
    ]


def bubble_rows() -> list[common.Row]:
    rows = []
    for kind in ("gpipe", "circular"):
        for m in (1, 2, 4, 8, 16):
            s = Schedule(kind, LAYERS, STAGES, m)
            rows.append(
                common.compare(
                    f"bubble fraction: {kind}, {m} microbatches ({s.steps} steps)",
                    "share",
                    [s.bubble_fraction],
                    None,
                    None,
                )
            )
    return rows


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(STAGES, 2), ("stage", "data"))
    with jax.set_mesh(mesh):
        programs = _programs(mesh)
        _check_values(programs)
        rows = memory_rows(programs)
        rows += time_rows(programs, 3 if args.quick else 20)
    rows += bubble_rows()
    common.print_rows("pipeline: memory, bytes moved, step time, bubble (4x2 mesh)", rows)
    common.write_json(NAME, rows, args.quick)


if __name__ == "__main__":
    main()
