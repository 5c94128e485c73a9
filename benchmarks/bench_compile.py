"""Figure 2: trace + lower + compile time from cold, partitioner vs jax.jit, on a 4x2 mesh.

Why: the first call of a pjit-ed function pays for our Python front end (specs,
tracing, our sharding annotations, our compile options) on top of XLA; this figure
shows that front end costs no more than jax.jit's. Every sample starts cold: both
libraries' caches are cleared and the function object is new, so nothing is reused.

The warm-cache row is a restarted training job: a *new process* compiles the train
step with jax's persistent compilation cache already holding it (each sample is one
``warm_compile_worker.py`` process), so it pays trace + lower + a cache lookup and
any first-use cost of the library, and no XLA compile.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import models

import partitioner

NAME = "compile"
TARGET = common.Target("<= 1.00x", hi=1.0)
JIT_TARGET = common.Target("<= 1.05x", hi=1.05)  # partitioner.jit's row (issue 25)


@dataclass(frozen=True)
class Program:
    name: str
    fun: Callable[..., Any]
    in_specs: Any
    out_specs: Any
    args: Callable[[], tuple[Any, ...]]


PROGRAMS = (
    Program("mlp", models.mlp, models.MLP_SPECS, models.MLP_OUT, models.mlp_args),
    Program(
        "transformer_block",
        models.block,
        (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS[0]),
        models.BLOCK_OUT,
        lambda: (models.block_params(), models.block_batch()[0]),
    ),
    Program(
        "train_step",
        models.train_step(),
        (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS),
        models.BLOCK_PARAM_SPECS,
        lambda: (models.block_params(), models.block_batch()),
    ),
)


def _fresh(fun: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object, so no trace cache keyed on the function can hit."""
    return lambda *args: fun(*args)


def _cold() -> None:
    jax.clear_caches()
    partitioner.clear_caches()


def samplers(
    prog: Program, breakdown: dict[str, list[tuple[float, float]]]
) -> dict[str, Callable[[], common.Timing]]:
    """Cold trace+lower+compile samplers; each also records its (lower, compile) split."""
    mesh = models.mesh_4x2()
    args = prog.args()
    jax_in = models.to_jax(prog.in_specs, mesh)
    jax_out = models.to_jax(prog.out_specs, mesh)

    def timed(make: Callable[[], Any], key: str) -> common.Timing:
        _cold()
        with common.stopwatch() as total:
            t0 = time.perf_counter()
            lowered = make().lower(*args)
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
        breakdown[key].append((t1 - t0, t2 - t1))
        return total[0]

    def ours() -> common.Timing:
        with partitioner.mesh(mesh.devices, mesh.axis_names):
            return timed(
                lambda: partitioner.pjit(_fresh(prog.fun), prog.in_specs, prog.out_specs),
                "partitioner",
            )

    def theirs() -> common.Timing:
        return timed(
            lambda: jax.jit(_fresh(prog.fun), in_shardings=jax_in, out_shardings=jax_out), "jax.jit"
        )

    def ours_jit() -> common.Timing:
        return timed(
            lambda: partitioner.jit(_fresh(prog.fun), in_shardings=jax_in, out_shardings=jax_out),
            "partitioner.jit",
        )

    run = {"partitioner": ours, "jax.jit": theirs}
    if prog.name == "train_step":  # partitioner.jit's row: the train step, as pjit's
        run["partitioner.jit"] = ours_jit
    return run


WORKER = Path(__file__).resolve().parent / "warm_compile_worker.py"


def _worker(who: str, cache_dir: str, *flags: str) -> dict[str, Any]:
    """One new process compiling the train step against ``cache_dir`` (bounded in time)."""
    done = subprocess.run(
        [sys.executable, str(WORKER), who, cache_dir, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=WORKER.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(f"warm_compile_worker.py {who} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warm_row(rounds: int, profile: bool) -> tuple[common.Row, dict[str, Any], list[str]]:
    """The train step compiled by a new process with a populated persistent cache."""
    contenders = ("partitioner", "jax.jit")
    with tempfile.TemporaryDirectory(prefix="partitioner-bench-cache-") as cache_dir:
        # The populating run of each is a cold compile in a new process (for scale).
        cold = {who: _worker(who, cache_dir) for who in contenders}

        def sampler(who: str) -> Callable[[], common.Timing]:
            def sample() -> common.Timing:
                out = _worker(who, cache_dir)
                if out["hits"] < 1:
                    raise RuntimeError(f"{who}: the persistent cache served nothing: {out}")
                return common.Timing(out["wall"], out["cpu"])

            return sample

        samples = common.interleave({w: sampler(w) for w in contenders}, rounds, warmup=0)
        lines = _worker("partitioner", cache_dir, "--profile")["profile"] if profile else []
    row = common.compare(
        "train_step, warm persistent cache, new process",
        "ms",
        samples["partitioner"],
        samples["jax.jit"],
        TARGET,
        1e3,
        **{f"{who}_cold_new_process_ms": 1e3 * cold[who]["wall"] for who in contenders},
    )
    return row, {"total_s": samples, "cold_new_process_s": cold}, lines


def _repeat(sampler: Callable[[], common.Timing], n: int) -> Callable[[], None]:
    def work() -> None:
        for _ in range(n):
            sampler()

    return work


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    # Quick: one sample each and no warm-up round (a smoke run, not a measurement).
    rounds, warmup = (1, 0) if args.quick else (11, 1)
    rows: list[common.Row] = []
    raw: dict[str, Any] = {}
    profiles: dict[str, list[str]] = {}
    # Quick: the train step is left out (the step figure compiles it anyway).
    for prog in PROGRAMS[:2] if args.quick else PROGRAMS:
        breakdown: dict[str, list[tuple[float, float]]] = {
            "partitioner": [],
            "jax.jit": [],
            "partitioner.jit": [],
        }
        run = samplers(prog, breakdown)
        samples = common.interleave(run, rounds, warmup)
        for k in breakdown:  # drop the warm-up samples
            breakdown[k] = breakdown[k][warmup:]
        split = {
            f"{k}_{part}_ms": 1e3 * statistics.median(b[i] for b in v)
            for k, v in breakdown.items()
            if v and k != "partitioner.jit"
            for i, part in enumerate(("trace_lower", "compile"))
        }
        row = common.compare(
            prog.name, "ms", samples["partitioner"], samples["jax.jit"], TARGET, 1e3, **split
        )
        rows.append(row)
        if "partitioner.jit" in samples:
            rows.append(
                common.compare(
                    f"{prog.name} jit",
                    "ms",
                    samples["partitioner.jit"],
                    samples["jax.jit"],
                    JIT_TARGET,
                    1e3,
                )
            )
        raw[prog.name] = {"total_s": samples, "trace_lower_compile_s": breakdown}
        if common.should_profile(args, row):
            profiles[prog.name] = common.profile_top(
                _repeat(run["partitioner"], 3), 25, "cumulative"
            )
    warm, raw["train_step_warm_cache"], warm_profile = warm_row(
        1 if args.quick else 7, args.profile
    )
    rows.append(warm)
    if warm_profile or common.should_profile(args, warm):
        profiles["train_step_warm_cache"] = warm_profile or warm_row(1, True)[2]
    common.print_rows("trace + lower + compile (cold; last row: warm persistent cache)", rows)
    for name, lines in profiles.items():
        print(f"\n-- cProfile, partitioner side, {name} --")
        print("\n".join(lines))
    common.write_json(NAME, rows, args.quick, samples=raw, profiles=profiles)
    common.save_plot(NAME, lambda fig: _draw(fig, rows))


def _parts_ms(row: common.Row, who: str) -> tuple[float, float]:
    """(trace+lower, compile) of a cold row; the warm row is drawn as one total."""
    if f"{who}_trace_lower_ms" in row.extra:
        return row.extra[f"{who}_trace_lower_ms"], row.extra[f"{who}_compile_ms"]
    total = row.partitioner if who == "partitioner" else row.jax_jit
    return total or 0.0, 0.0


def _draw(fig: Any, rows: list[common.Row]) -> None:
    """Stacked bars: trace+lower below, compile on top, per contender and program."""
    ax = fig.add_subplot(1, 1, 1)
    width = 0.38
    for i, (who, label) in enumerate((("partitioner", "partitioner"), ("jax.jit", "jax.jit"))):
        xs = [x + (i - 0.5) * width for x in range(len(rows))]
        lower = [_parts_ms(r, who)[0] for r in rows]
        comp = [_parts_ms(r, who)[1] for r in rows]
        ax.bar(xs, lower, width, label=f"{label}: trace+lower", color=f"C{2 * i}")
        ax.bar(xs, comp, width, bottom=lower, label=f"{label}: compile", color=f"C{2 * i + 1}")
    common.annotate_ratios(ax, rows)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.name for r in rows])
    ax.set_ylabel("milliseconds (median; cold, last bar warm cache)")
    ax.set_title("trace + lower + compile on a 4x2 mesh (lower is better)")
    ax.legend(fontsize=8)


if __name__ == "__main__":
    main()
