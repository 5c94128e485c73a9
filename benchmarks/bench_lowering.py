"""Figure 5: trace + lower time of synthetic programs of 1k, 5k and 10k equations.

Why: our front end walks the jaxpr itself (tracing, our sharding annotations on
``main``), so its cost must grow linearly with program size and stay at or below
jax.jit's. The program is a chain of alternating ``lax.sin`` / ``lax.cos`` (exactly
one equation each, checked) on an array sharded over 8 devices. Every sample is
cold: caches cleared, a new function object.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import math
import statistics
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P

NAME = "lowering"
TARGET = common.Target("<= 1.00x", hi=1.0)
#: A log-log slope above this is not linear growth.
MAX_EXPONENT = 1.10


def chain(n: int) -> Callable[[jax.Array], jax.Array]:
    """A new function of ``n`` elementwise equations."""

    def f(x: jax.Array) -> jax.Array:
        for i in range(n):
            x = lax.sin(x) if i % 2 else lax.cos(x)
        return x

    return f


def _cold() -> None:
    jax.clear_caches()
    partitioner.clear_caches()


def samplers(n: int, mesh: Mesh, x: Any) -> dict[str, Callable[[], common.Timing]]:
    sharding = NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    def ours() -> common.Timing:
        _cold()
        f = partitioner.pjit(chain(n), P("x"), P("x"))
        with common.stopwatch() as t:
            f.lower(x)
        return t[0]

    def theirs() -> common.Timing:
        _cold()
        f = jax.jit(chain(n), in_shardings=sharding, out_shardings=sharding)
        with common.stopwatch() as t:
            f.lower(x)
        return t[0]

    return {"partitioner": ours, "jax.jit": theirs}


def loglog_slope(ns: list[int], ts: list[float]) -> float:
    """Least-squares slope of log t against log n (1.0 is linear growth)."""
    lx = [math.log(n) for n in ns]
    ly = [math.log(t) for t in ts]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def growth_row(rows: list[common.Row], ns: list[int]) -> common.Row:
    ours = loglog_slope(ns, [r.partitioner for r in rows])
    theirs = loglog_slope(ns, [r.jax_jit or math.nan for r in rows])
    ok = ours <= MAX_EXPONENT
    return common.Row(
        "growth exponent (log-log slope)",
        "exponent",
        ours,
        theirs,
        None,
        f"linear: <= {MAX_EXPONENT:.2f}",
        ok,
        "ok" if ok else "MISSED",
    )


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    ns, rounds = ([250, 500, 1000], 1) if args.quick else ([1000, 5000, 10000], 7)
    devices = np.array(jax.devices()[:8])
    mesh = Mesh(devices, ("x",))
    x = jax.ShapeDtypeStruct((64,), np.float32)
    assert len(jax.make_jaxpr(chain(100))(x).eqns) == 100  # one equation per op
    rows: list[common.Row] = []
    raw: dict[str, Any] = {}
    profiles: dict[str, list[str]] = {}
    with partitioner.mesh(devices, ("x",)):
        for s in samplers(100, mesh, x).values():  # first-use costs of both libraries
            s()
        for n in ns:
            run = samplers(n, mesh, x)
            samples = common.interleave(run, rounds, warmup=0)
            row = common.compare(
                f"chain_{n}", "ms", samples["partitioner"], samples["jax.jit"], TARGET, 1e3
            )
            row.extra["partitioner_us_per_eqn"] = 1e3 * row.partitioner / n
            row.extra["jax_jit_us_per_eqn"] = 1e3 * (row.jax_jit or 0.0) / n
            rows.append(row)
            raw[str(n)] = samples
            if common.should_profile(args, row):
                profiles[row.name] = common.profile_top(run["partitioner"], 25, "cumulative")
    rows.append(growth_row(rows, ns))
    common.print_rows("trace + lower (cold)", rows)
    for name, lines in profiles.items():
        print(f"\n-- cProfile, partitioner side, {name} --")
        print("\n".join(lines))
    common.write_json(NAME, rows, args.quick, samples_s=raw, profiles=profiles)
    common.save_plot(NAME, lambda fig: _draw(fig, rows[:-1], ns))


def _draw(fig: Any, rows: list[common.Row], ns: list[int]) -> None:
    """Total time against size (log-log) and time per equation against size."""
    left = fig.add_subplot(1, 2, 1)
    right = fig.add_subplot(1, 2, 2)
    for label, get, per in (
        ("partitioner", lambda r: r.partitioner, "partitioner_us_per_eqn"),
        ("jax.jit", lambda r: r.jax_jit, "jax_jit_us_per_eqn"),
    ):
        left.loglog(ns, [get(r) for r in rows], marker="o", label=label)
        right.plot(ns, [r.extra[per] for r in rows], marker="o", label=label)
    left.set_xlabel("equations")
    left.set_ylabel("ms (median, cold)")
    left.set_title("trace + lower time")
    right.set_xlabel("equations")
    right.set_ylabel("us per equation")
    right.set_ylim(bottom=0)
    right.set_title("flat = linear growth")
    left.legend(fontsize=8)
    fig.suptitle("synthetic elementwise chain, 8 devices")


if __name__ == "__main__":
    main()
