"""Figure 9: colocated_python: call latency, and Python work hidden behind device work.

Why: ``partitioner.colocated_python`` runs the function on a worker beside the
arguments' devices and returns promised outputs at once. The competitor is jax's
``jax.experimental.colocated_python`` on the same machine, which without Pathways
runs the function in the caller, synchronously.

Latency: a trivial function (it returns its argument) on a (1024,) float32 array
sharded over 8 devices; a sample is ``calls`` calls, each blocked on its output
(the round trip of one call), and ``calls`` calls blocked once at the end (a
pipelined loop). jax's fallback is a plain Python call: these rows show what the
hand-off to the calling thread's lane costs per call (a function this short is
waited for, not promised: NOTE [colocated execution]). Asynchrony: the time a
call of a function that sleeps 2 ms takes to *return* (its outputs promised; the
sample blocks on them after the clock stops); jax's fallback returns after the
function.

Overlap: the per-host loader loop of ``examples/colocated_loader.py`` on one
process: 16 calls of a loader that sleeps 20 ms (standing for reading a file)
and returns a batch, each batch consumed by a pjit-ed train step whose loss the
loop reads (blocks on) every step, the next batch asked for before the step runs.
The step is sized to take about as long as the sleep. jax's fallback pays sleep +
step per iteration; ours pays the longer of the two, since the loader runs while
the step does. Calls run in call order (one at a time), so ours can at best hide
the shorter of the two, and never the first load: with S the loads' and L the
steps' total time, the ratio's floor is about max(S, L) / (S + L), 0.5 only when
they are equal. The row stores the exact floor (``floor_ratio``, from jax's loop
time) beside the ratio.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import colocated_python as jax_colocated
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P

NAME = "colocated"
OVERLAP = common.Target("<= 0.50x (hides the sleeps)", hi=0.5)
SLEEP_S = 0.020
CALLS = 16


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


# --- latency ---


class Calls:
    """A sampler: ``n`` calls of ``f(x)``, each blocked, or all blocked once at the end."""

    def __init__(self, f: Callable[[Any], Any], x: Any, n: int, pipelined: bool) -> None:
        self.f, self.x, self.n, self.pipelined = f, x, n, pipelined

    def __call__(self) -> common.Timing:
        f, x = self.f, self.x
        with common.stopwatch() as t:
            if self.pipelined:
                outs = [f(x) for _ in range(self.n)]
                jax.block_until_ready(outs)
            else:
                for _ in range(self.n):
                    f(x).block_until_ready()
        return t[0] / self.n


class Returns:
    """A sampler: how long ``n`` calls of ``f(x)`` take to return (blocked after the clock)."""

    def __init__(self, f: Callable[[Any], Any], x: Any, n: int) -> None:
        self.f, self.x, self.n = f, x, n

    def __call__(self) -> common.Timing:
        f, x = self.f, self.x
        with common.stopwatch() as t:
            outs = [f(x) for _ in range(self.n)]
        jax.block_until_ready(outs)
        return t[0] / self.n


def return_row(calls: int, rounds: int) -> common.Row:
    x = jax.device_put(jnp.arange(1024.0), NamedSharding(_mesh(), P("data")))

    def sleepy(a: jax.Array) -> jax.Array:
        time.sleep(0.002)
        return a

    ours = partitioner.colocated_python(sleepy)
    theirs = jax_colocated.colocated_python(sleepy)
    for f in (ours, theirs):  # the discovery call
        np.testing.assert_array_equal(np.asarray(f(x)), np.arange(1024.0))
    samples = common.interleave(
        {"partitioner": Returns(ours, x, calls), "jax": Returns(theirs, x, calls)}, rounds
    )
    return common.compare(
        "return_2ms_function_8dev",
        "us/call",
        samples["partitioner"],
        samples["jax"],
        None,
        1e6,
        calls_per_sample=calls,
        competitor="jax.experimental.colocated_python (in-process fallback, synchronous)",
    )


def latency_rows(calls: int, rounds: int) -> list[common.Row]:
    x = jax.device_put(jnp.arange(1024.0), NamedSharding(_mesh(), P("data")))

    def identity(a: jax.Array) -> jax.Array:
        return a

    ours = partitioner.colocated_python(identity)
    theirs = jax_colocated.colocated_python(identity)
    for f in (ours, theirs):  # the discovery call
        np.testing.assert_array_equal(np.asarray(f(x)), np.arange(1024.0))
    rows = []
    for name, pipelined in (("latency_blocked_8dev", False), ("latency_pipelined_8dev", True)):
        samples = common.interleave(
            {
                "partitioner": Calls(ours, x, calls, pipelined),
                "jax": Calls(theirs, x, calls, pipelined),
            },
            rounds,
        )
        rows.append(
            common.compare(
                name,
                "us/call",
                samples["partitioner"],
                samples["jax"],
                None,
                1e6,
                calls_per_sample=calls,
                competitor="jax.experimental.colocated_python (in-process fallback)",
            )
        )
    return rows


# --- overlap ---


def _step_of(depth: int) -> Callable[..., Any]:
    """A train step doing ``depth`` tanh-matmul layers: the knob that sets its length."""

    def loss_fn(w: Any, batch: Any) -> Any:
        h = batch
        for _ in range(depth):
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    def step(w: Any, batch: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(w, batch)
        return w - 0.1 * g, loss

    return partitioner.pjit(step, (P(None, "model"), P("data")), (P(None, "model"), None))


def _loader(mesh: Mesh) -> Callable[[Any], Any]:
    rows = NamedSharding(mesh, P("data"))
    base = np.sin(np.arange(256 * 256, dtype=np.float32).reshape(256, 256))

    def load(k: jax.Array) -> jax.Array:
        time.sleep(SLEEP_S)  # stands for reading a file
        return jax.device_put(base + np.float32(k), rows)

    return load


class Loop:
    """A sampler: the loader loop, ``CALLS`` loads and steps, the loss read every step."""

    def __init__(self, load: Callable[[Any], Any], step: Any, w: Any, keys: list[Any]) -> None:
        self.load, self.step, self.w, self.keys = load, step, w, keys

    def __call__(self) -> common.Timing:
        load, step, w, keys = self.load, self.step, self.w, self.keys
        with common.stopwatch() as t:
            batch = load(keys[0])
            for i in range(CALLS):
                upcoming = load(keys[i + 1]) if i + 1 < CALLS else None
                w, loss = step(w, batch)
                float(loss)  # a training loop that reads its loss
                batch = upcoming
        return t[0]


def _calibrated_depth(mesh: Mesh, w: Any, batch: Any) -> tuple[int, float]:
    """The layer count whose step, run as the loop runs it, takes about ``SLEEP_S``."""
    depth, seconds = 1, 0.0
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        while depth <= 256:
            step = _step_of(depth)
            v, loss = step(w, batch)
            float(loss)
            start = time.perf_counter()
            for _ in range(8):
                v, loss = step(v, batch)
                float(loss)
            seconds = (time.perf_counter() - start) / 8
            if seconds >= SLEEP_S * 0.97:
                break
            depth = max(depth + 1, round(depth * SLEEP_S / max(seconds, 1e-4)))
    return depth, seconds


def overlap_row(rounds: int) -> common.Row:
    mesh = _mesh()
    w = jax.device_put(jnp.eye(256) * 0.5, NamedSharding(mesh, P(None, "model")))
    keys = [jax.device_put(jnp.float32(k), NamedSharding(mesh, P())) for k in range(CALLS)]
    depth, step_s = _calibrated_depth(mesh, w, _loader(mesh)(keys[0]))
    step = _step_of(depth)
    rows = NamedSharding(mesh, P("data"))
    ours = partitioner.colocated_python(_loader(mesh)).specialize(
        out_specs_fn=lambda k: jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=rows)
    )
    theirs = jax_colocated.colocated_python(_loader(mesh))
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        want = [float(step(w, _loader(mesh)(k))[1]) for k in keys[:2]]
        for f in (ours, theirs):  # same losses, and jax's discovery call out of the way
            got = [float(step(w, f(k))[1]) for k in keys[:2]]
            np.testing.assert_allclose(got, want, rtol=1e-6)
        samples = common.interleave(
            {"partitioner": Loop(ours, step, w, keys), "jax": Loop(theirs, step, w, keys)},
            rounds,
        )
    return common.compare(
        "overlap_16x20ms_loader",
        "ms/loop",
        samples["partitioner"],
        samples["jax"],
        OVERLAP,
        1e3,
        calls=CALLS,
        sleep_ms=SLEEP_S * 1e3,
        step_ms=step_s * 1e3,
        step_depth=depth,
        sleeps_only_ms=CALLS * SLEEP_S * 1e3,
        floor_ratio=_floor(samples["jax"]),  # what hiding the loads completely gives
        competitor="jax.experimental.colocated_python (in-process fallback, synchronous)",
    )


def _floor(theirs: list[common.Timing]) -> float:
    """The best ratio calls run in call order allow, from jax's (serial) loop time.

    jax's loop is ``CALLS`` loads and steps in series, so its steps took
    ``T = (jax - CALLS * S) / CALLS`` each. Ours waits for the first load, then
    each iteration takes the longer of a load and a step: at least
    ``max(S + CALLS * T, CALLS * S + T)``.
    """
    jax_loop = statistics.median(t.wall for t in theirs)
    step = (jax_loop - CALLS * SLEEP_S) / CALLS
    return max(SLEEP_S + CALLS * step, CALLS * SLEEP_S + step) / jax_loop


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    calls, rounds, overlap_rounds = (20, 3, 2) if args.quick else (200, 15, 12)
    rows = latency_rows(calls, rounds)
    rows.append(overlap_row(overlap_rounds))
    rows.append(return_row(10 if args.quick else 20, rounds))
    common.print_rows("colocated_python: latency, and overlap with device work", rows)
    o = rows[2].extra
    print(
        f"overlap: step {o['step_ms']:.1f} ms (depth {o['step_depth']}), sleep {o['sleep_ms']:.0f} "
        f"ms; ratio {rows[2].ratio:.3f}, floor for in-order calls {o['floor_ratio']:.3f}"
    )
    common.write_json(NAME, rows, args.quick)
    common.save_plot(NAME, lambda fig: _draw(fig, rows))


def _draw(fig: Any, rows: list[common.Row]) -> None:
    """Latency (log scale) and the loader loop's wall time, ours beside jax's."""
    left = fig.add_subplot(1, 2, 1)
    lat = rows[:2]
    xs = range(len(lat))
    for i, (label, values) in enumerate(
        (("partitioner", [r.partitioner for r in lat]), ("jax", [r.jax_jit or 0.0 for r in lat]))
    ):
        left.bar([x + (i - 0.5) * 0.4 for x in xs], values, 0.4, label=label)
    left.set_yscale("log")
    left.set_xticks(list(xs))
    left.set_xticklabels([r.name for r in lat], fontsize=8)
    left.set_ylabel("us per call (lower is better)")
    left.set_title("call latency, trivial function")
    left.legend(fontsize=8)
    right = fig.add_subplot(1, 2, 2)
    o = rows[2]
    right.bar(["partitioner", "jax fallback"], [o.partitioner, o.jax_jit or 0.0])
    right.axhline(o.extra["sleeps_only_ms"], color="gray", linestyle="--", label="16 sleeps")
    if o.ratio is not None:
        right.annotate(f"{o.ratio:.2f}x", (0, o.partitioner), ha="center", va="bottom")
    right.set_ylabel("ms per loop of 16 loads + steps")
    right.set_title("loader hidden behind the step (lower is better)")
    right.legend(fontsize=8)


if __name__ == "__main__":
    main()
