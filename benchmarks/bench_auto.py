"""Figure 11: layouts partitioner chooses (``AUTO``) against a hand layout and against replication.

Why: an ``AUTO`` spec is only worth its search if the layout it finds is as good as
what a person would write, found quickly, and if the cost model's figures mean
something. For each train step (fwd + bwd + SGD) on the 4x2 ``("data", "model")``
mesh, the batch laid out ``P("data")`` and the parameters (and updated parameters)
``AUTO``, the figure measures:

- the search's wall time: the first ``.lower()`` of the AUTO step minus a
  ``.lower()`` of the same step with the hand layout, both cold (partitioner's
  caches and the resolved signatures cleared), under an absolute target;
- the chosen program against the hand (Megatron-style) layout and against fully
  replicated parameters: collective operand bytes per device and memory per device,
  each read from that program's report (XLA's figures, not the model's), and the
  measured step time (interleaved rounds, every result blocked on), also against
  ``jax.jit`` with the hand layout;
- the cost model's error on the chosen program: its estimated collective bytes and
  memory against XLA's;
- how the search scales (reported, no target): its time for 2 and 4 stacked
  transformer blocks, and the assignments it scored.

In this figure's table the ``partitioner`` column is the chosen (AUTO) program and
the ``jax.jit`` column the program it is compared with (named in the row).
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import models

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P

NAME = "auto"
RATIO = common.Target("<= 1.00x", hi=1.0)
BELOW = common.Target("< 1.00x", hi=0.999)
STEP = common.Target("<= 1.00x", hi=1.0)
SEARCH_LIMIT_S = {"mlp": 30.0, "block": 120.0}

PARAM_HEAVY = models.Dims(batch=8, seq=16, model=256, heads=4, ff=1024)


@dataclass(frozen=True)
class Program:
    """A train step whose parameters are AUTO; ``hand`` is the layout a person writes."""

    name: str
    kind: str  # "mlp" or "block": which search-time target applies
    step: Callable[..., Any]
    hand: Any  # the parameters' specs (a dict of P)
    args: Callable[[], tuple[Any, Any]]  # (params, batch)


def _mlp_loss(params: models.Params, batch: models.Batch) -> jax.Array:
    x, y = batch
    return jnp.mean((models.mlp(params, x) - y) ** 2)


def _mlp_args() -> tuple[models.Params, models.Batch]:
    params, x = models.mlp_args()
    y = jax.random.normal(jax.random.key(3), x.shape, x.dtype)
    return params, (x, y)


def _block_args(d: models.Dims) -> Callable[[], tuple[models.Params, models.Batch]]:
    return lambda: (models.block_params(d), models.block_batch(d))


PROGRAMS = (
    Program("mlp", "mlp", models.train_step(_mlp_loss), models.MLP_SPECS[0], _mlp_args),
    Program(
        "block-heavy",
        "block",
        models.train_step(models.loss),
        models.BLOCK_PARAM_SPECS,
        _block_args(PARAM_HEAVY),
    ),
    Program(
        "block",
        "block",
        models.train_step(models.loss),
        models.BLOCK_PARAM_SPECS,
        _block_args(models.DIMS),
    ),
)


#: Stacked transformer blocks whose search time is reported (not in --quick).
STACKS = (2, 4)


def _stack_program(n: int) -> Program:
    """``n`` transformer blocks in a row, every parameter AUTO; hand: Megatron per block."""

    def loss(params: list[models.Params], batch: models.Batch) -> jax.Array:
        x, y = batch
        for p in params:
            x = models.block(p, x)
        return jnp.mean((x - y) ** 2)

    def args() -> tuple[list[models.Params], models.Batch]:
        return [models.block_params() for _ in range(n)], models.block_batch()

    hand = [models.BLOCK_PARAM_SPECS] * n
    return Program(f"{n} stacked blocks", "block", models.train_step(loss), hand, args)


def _cold() -> None:
    jax.clear_caches()
    partitioner.clear_caches()  # traces, executables and the resolved AUTO signatures


def _pjit(prog: Program, params_spec: Any) -> Any:
    """The step with the parameters (in and out) laid out by ``params_spec``."""
    fresh = lambda *a: prog.step(*a)  # noqa: E731 - a new function object: no trace reused
    return partitioner.pjit(fresh, (params_spec, models.BATCH_SPECS), params_spec)


def _replicated(hand: Any) -> Any:
    return jax.tree.map(lambda _: P(), hand, is_leaf=lambda x: isinstance(x, P))


def search_time(prog: Program, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """(AUTO lower s, hand lower s, difference s) per cold round."""
    params, batch = prog.args()
    auto_s, hand_s = [], []
    for _ in range(rounds):
        for spec, out in ((AUTO, auto_s), (prog.hand, hand_s)):
            _cold()
            t0 = time.perf_counter()
            _pjit(prog, spec).lower(params, batch)
            out.append(time.perf_counter() - t0)
    return auto_s, hand_s, [a - h for a, h in zip(auto_s, hand_s, strict=True)]


def _program_figures(report: Any) -> dict[str, Any]:
    """XLA's per-device figures of one compiled program, from its report."""
    return {
        "collective_bytes": sum(c.bytes_per_device * c.count for c in report.collectives),
        "collectives": sum(c.count for c in report.collectives),
        "memory_bytes": None if report.memory is None else report.memory.total,
    }


def _timed_step(call: Callable[[], Any]) -> Callable[[], common.Timing]:
    def sample() -> common.Timing:
        with common.stopwatch() as t:
            jax.block_until_ready(call())
        return t[0]

    return sample


def compare_layouts(prog: Program, rounds: int) -> tuple[list[common.Row], dict[str, Any]]:
    """Chosen vs hand vs replicated: XLA's bytes and memory, then the measured step time."""
    mesh = models.mesh_4x2()
    params, batch = prog.args()
    _cold()
    compiled = {
        who: _pjit(prog, spec).lower(params, batch).compile()
        for who, spec in (
            ("chosen", AUTO),
            ("hand", prog.hand),
            ("replicated", _replicated(prog.hand)),
        )
    }
    reports = {who: c.report() for who, c in compiled.items()}
    figures = {who: _program_figures(r) for who, r in reports.items()}
    auto = reports["chosen"].auto
    assert auto is not None, "the AUTO program's report has no auto table"
    choice = auto.choice
    chosen_specs = dict(zip(choice.paths, choice.chosen.specs, strict=True))

    placed = {
        who: jax.device_put((params, batch), c.input_shardings[0]) for who, c in compiled.items()
    }
    jax_step = jax.jit(
        prog.step,
        in_shardings=models.to_jax((prog.hand, models.BATCH_SPECS), mesh),
        out_shardings=models.to_jax(prog.hand, mesh),
    )
    jax_args = jax.device_put((params, batch), models.to_jax((prog.hand, models.BATCH_SPECS), mesh))
    samplers = {who: _timed_step(lambda c=c, a=placed[who]: c(*a)) for who, c in compiled.items()}
    samplers["jax.jit hand"] = _timed_step(lambda: jax_step(*jax_args))
    samples = common.interleave(samplers, rounds)

    kib = 1 / 1024
    name = prog.name
    rows = []
    for other, short in (("hand", "hand"), ("replicated", "repl.")):
        ours, theirs = figures["chosen"], figures[other]
        rows.append(
            common.compare(
                f"{name}: coll. / {short}",
                "KiB/device",
                [ours["collective_bytes"]],
                [theirs["collective_bytes"]] if theirs["collective_bytes"] else None,
                RATIO if other == "hand" and theirs["collective_bytes"] else None,
                kib,
                **{f"{other}_collective_bytes": theirs["collective_bytes"]},
            )
        )
        rows.append(
            common.compare(
                f"{name}: mem / {short}",
                "KiB/device",
                [ours["memory_bytes"]],
                [theirs["memory_bytes"]],
                RATIO if other == "hand" else BELOW,
                kib,
            )
        )
    rows.append(
        common.compare(
            f"{name}: step / jax.jit hand",
            "ms",
            samples["chosen"],
            samples["jax.jit hand"],
            STEP,
            1e3,
            **{
                f"{who}_ms": 1e3 * statistics.median(t.wall for t in samples[who])
                for who in ("hand", "replicated")
            },
        )
    )
    rows.append(
        common.compare(
            f"{name}: step / hand",
            "ms",
            samples["chosen"],
            samples["hand"],
            None,
            1e3,
        )
    )
    est = choice.chosen.estimate
    for what, estimated, measured in (
        ("coll.", est.collective_bytes, auto.collective_bytes),
        ("mem", est.memory_bytes, auto.memory_bytes),
    ):
        error = abs(estimated - measured) / measured if measured else None
        rows.append(
            common.Row(
                f"{name}: est. err {what}",
                "relative",
                error if error is not None else abs(estimated - (measured or 0)),
                None,
                None,
                "reported",
                None,
                extra={"estimated": estimated, "xla": measured},
            )
        )
    details = {
        "chosen_specs": chosen_specs,
        "out_specs": dict(zip(choice.out_paths, choice.out_specs, strict=True)),
        "figures": figures,
        "evaluations": choice.evaluations,
        "compiles": choice.compiles,
        "search_s": choice.search_s,
        "report": str(reports["chosen"]),
        "step_s": {who: [t.wall for t in s] for who, s in samples.items()},
    }
    return rows, details


def search_row(prog: Program, rounds: int) -> tuple[common.Row, dict[str, Any]]:
    auto_s, hand_s, diff = search_time(prog, rounds)
    limit = SEARCH_LIMIT_S[prog.kind]
    search = statistics.median(diff)
    ok = search <= limit
    row = common.Row(
        f"{prog.name}: search",
        "s",
        search,
        None,
        None,
        f"<= {limit:.0f} s",
        ok,
        "ok" if ok else "MISSED",
        extra={
            "auto_lower_s": auto_s,
            "hand_lower_s": hand_s,
            "n_samples": len(diff),
        },
    )
    return row, {"auto_lower_s": auto_s, "hand_lower_s": hand_s}


def scaling_row(n: int) -> common.Row:
    """One cold search of ``n`` stacked blocks: its time and the assignments it scored."""
    prog = _stack_program(n)
    auto_s, hand_s, diff = search_time(prog, 1)
    params, batch = prog.args()
    choice = _pjit(prog, AUTO).lower(params, batch).report().auto.choice
    return common.Row(
        f"{prog.name}: search",
        "s",
        diff[0],
        None,
        None,
        "reported",
        None,
        extra={
            "auto_lower_s": auto_s,
            "hand_lower_s": hand_s,
            "auto_leaves": len(choice.paths),
            "evaluations": choice.evaluations,
            "compiles": choice.compiles,
        },
    )


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    # Quick: the MLP alone, one search and a few steps (a smoke run, not a measurement).
    programs = PROGRAMS[:1] if args.quick else PROGRAMS
    search_rounds, step_rounds = (1, 3) if args.quick else (3, 21)
    rows: list[common.Row] = []
    details: dict[str, Any] = {}
    mesh = models.mesh_4x2()
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        for prog in programs:
            row, timing = search_row(prog, search_rounds)
            rows.append(row)
            layout_rows, info = compare_layouts(prog, step_rounds)
            rows += layout_rows
            details[prog.name] = {**info, "search": timing}
        if not args.quick:
            for n in STACKS:
                rows.append(scaling_row(n))
    common.print_rows("AUTO layouts: chosen vs hand vs replicated, 4x2 mesh", rows)
    for name, info in details.items():
        print(f"\n{name}: chosen {info['chosen_specs']}")
    for row in rows:
        if "evaluations" in row.extra:
            print(
                f"{row.name}: {row.extra['auto_leaves']} AUTO leaves, "
                f"{row.extra['evaluations']} assignments scored, {row.extra['compiles']} compiled"
            )
    common.write_json(NAME, rows, args.quick, details=details)
    common.save_plot(NAME, lambda fig: _draw(fig, details))


def _draw(fig: Any, details: dict[str, Any]) -> None:
    """Per program: collective KiB and memory KiB of the chosen, hand and replicated layouts."""
    whos = ("chosen", "hand", "replicated")
    for k, (key, label) in enumerate(
        (("collective_bytes", "collective KiB/device"), ("memory_bytes", "memory KiB/device"))
    ):
        ax = fig.add_subplot(1, 2, k + 1)
        names = list(details)
        width = 0.8 / len(whos)
        for i, who in enumerate(whos):
            xs = [x + (i - 1) * width for x in range(len(names))]
            vals = [(details[n]["figures"][who][key] or 0) / 1024 for n in names]
            ax.bar(xs, vals, width, label=who)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("AUTO layouts on a 4x2 mesh, XLA's figures (lower is better)")


if __name__ == "__main__":
    main()
