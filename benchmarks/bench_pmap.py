"""Figure 10: pmap: cached-call dispatch and cold compile, partitioner.pmap vs jax.pmap.

Why: ``partitioner.pmap`` is a second front door onto the dispatcher pjit uses,
so a cached call must cost what a pjit call costs (jaxlib's C++ fast path), and
its compile what jax.pmap's does. jax.pmap is the competitor (in jax 0.10.2 a
Python wrapper over ``shard_map`` and ``jax.jit``); ``jax.jit`` with the
equivalent ``NamedSharding`` is the floor both are held to.

Dispatch: an elementwise function of 1, 10 and 100 arguments, each (8, 16)
float32 mapped over 8 devices (already laid out one row per device, as a
previous map's outputs are); loops of calls blocked at the end, as in the
dispatch figure. Compile: a data-parallel train step of the transformer block
(``pmean`` of the gradients, parameters broadcast, batch mapped), cold
(``jax.clear_caches()`` and ``partitioner.clear_caches()`` before each sample, a
new function object each time), trace + lower + compile.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import functools
import operator
from collections.abc import Callable
from typing import Any

import jax
import models
import numpy as np
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P

NAME = "pmap"
VS_PMAP = common.Target("<= 1.00x jax.pmap", hi=1.0)
VS_JIT = common.Target("<= 1.05x jax.jit", hi=1.05)
COMPILE = common.Target("<= 1.00x jax.pmap", hi=1.0)
N = 8


def _elementwise(*xs: jax.Array) -> jax.Array:
    return functools.reduce(operator.add, xs) + 1.0


def _block(out: Any) -> None:
    jax.block_until_ready(out)


def dispatch_rows(n_args: int, rounds: int, quick: bool) -> list[common.Row]:
    mesh = Mesh(np.array(jax.devices()[:N]), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    args = [jax.device_put(np.full((N, 16), k, np.float32), sharding) for k in range(n_args)]
    calls: dict[str, Callable[[], Any]] = {
        "partitioner": functools.partial(partitioner.pmap(_elementwise, "i"), *args),
        "jax.pmap": functools.partial(jax.pmap(_elementwise, "i"), *args),
        "jax.jit": functools.partial(
            jax.jit(_elementwise, in_shardings=sharding, out_shardings=sharding), *args
        ),
    }
    want = np.full((N, 16), sum(range(n_args)) + 1.0, np.float32)
    for call in calls.values():
        np.testing.assert_array_equal(np.asarray(call()), want)
    n = max(common.calibrate(calls["jax.jit"], _block, 0.025), 20 if quick else 100)

    def sampler(call: Callable[[], Any]) -> Callable[[], common.Timing]:
        def run() -> common.Timing:
            _block(call())
            return common.time_loop(call, n, _block)

        return run

    samples = common.interleave({k: sampler(c) for k, c in calls.items()}, rounds)
    ours = samples["partitioner"]
    return [
        common.compare(
            f"dispatch_{n_args}arg vs jax.pmap",
            "us/call",
            ours,
            samples["jax.pmap"],
            VS_PMAP,
            1e6,
            calls_per_loop=n,
        ),
        common.compare(
            f"dispatch_{n_args}arg vs jax.jit",
            "us/call",
            ours,
            samples["jax.jit"],
            VS_JIT,
            1e6,
            calls_per_loop=n,
        ),
    ]


def _data_parallel_step(params: Any, batch: Any) -> Any:
    loss, grads = jax.value_and_grad(models.loss)(params, batch)
    grads = jax.lax.pmean(grads, "i")
    return models.sgd(params, grads), jax.lax.pmean(loss, "i")


def compile_row(rounds: int, warmup: int) -> common.Row:
    params = models.block_params()
    x, y = models.block_batch()
    # One example sequence per device: the batch is split over the 8 devices.
    batch = (np.asarray(x)[:N][:, None], np.asarray(y)[:N][:, None])

    def sampler(pmap: Callable[..., Any]) -> Callable[[], common.Timing]:
        def run() -> common.Timing:
            jax.clear_caches()
            partitioner.clear_caches()
            fresh = pmap(lambda p, b: _data_parallel_step(p, b), "i", in_axes=(None, 0))
            with common.stopwatch() as t:
                fresh.lower(params, batch).compile()
            return t[0]

        return run

    ours_step = partitioner.pmap(_data_parallel_step, "i", in_axes=(None, 0), out_axes=None)
    theirs_step = jax.pmap(_data_parallel_step, "i", in_axes=(None, 0), out_axes=None)
    (p1, l1), (p2, l2) = ours_step(params, batch), theirs_step(params, batch)
    np.testing.assert_allclose(float(l1), float(l2), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    samples = common.interleave(
        {"partitioner": sampler(partitioner.pmap), "jax.pmap": sampler(jax.pmap)}, rounds, warmup
    )
    return common.compare(
        "compile_dp_train_step vs jax.pmap",
        "ms",
        samples["partitioner"],
        samples["jax.pmap"],
        COMPILE,
        1e3,
    )


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rounds = 3 if args.quick else 60
    rows: list[common.Row] = []
    for n_args in (1, 10, 100):
        rows += dispatch_rows(n_args, rounds, args.quick)
    rows.append(compile_row(*((1, 0) if args.quick else (11, 1))))
    common.print_rows("pmap: cached-call dispatch and cold compile", rows)
    common.write_json(NAME, rows, args.quick)
    common.save_plot(
        NAME,
        lambda fig: common.bar_plot(
            fig,
            "pmap: dispatch (us/call) and compile (ms); lower is better",
            rows,
            "us per call / ms",
        ),
    )


if __name__ == "__main__":
    main()
