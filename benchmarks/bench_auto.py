"""Figure 11: layouts partitioner chooses (``AUTO``) against a hand layout and against replication.

Why: an ``AUTO`` spec is only worth its search if the layout it finds is as good as
what a person would write, found quickly, and if the cost model's figures mean
something. For each train step (fwd + bwd + SGD) on the 4x2 ``("data", "model")``
mesh, the batch laid out ``P("data")`` and the parameters (and updated parameters)
``AUTO``, the figure measures:

- the search's wall time: what AUTO adds to the first call, the first call of the
  AUTO step (trace, search, compile, run) minus the first call of the same step
  with the hand layout, both cold (partitioner's caches and the resolved
  signatures cleared), under an absolute target (the winner's compile is the
  call's own: its executable is the one the first call runs);
- the chosen program against the hand (Megatron-style) layout and against fully
  replicated parameters: collective operand bytes per device and memory per device,
  each read from that program's report (XLA's figures, not the model's), and the
  measured step time (interleaved rounds, every result blocked on), also against
  ``jax.jit`` with the hand layout;
- the cost model's error on the chosen program: its estimated collective bytes and
  memory against XLA's;
- how the search scales with depth: its time for 4, 8, 16 and 32 unrolled
  transformer blocks (targets: 8 and 32 blocks <= 20 s), the cost
  model's part of it per block (linear growth: 32 blocks against 4), the
  assignments scored and XLA's compiles;
- under a memory limit no layout meets (``remat_case.py``): AUTO's rematerialized plan
  against the hand plan "Megatron + ``jax.checkpoint`` on every block", on XLA's memory
  and recomputed flops (targets: both <= the hand plan's); and the same blocks
  unrolled, under 0.6x AUTO's layout-only memory (its layers recomputed);
- the layers beyond the MLP and the block (``layer_models.py``): a CNN, an embedding
  with a tied softmax, a mixture of experts, a transformer as a scan over stacked
  layers and unrolled; for each the chosen layout's XLA figures against the hand
  layout and replication, and whether one of them (or data parallelism) beats it on
  both (target: never);
- scanned stacks: 8 blocks as a ``lax.scan`` against the same blocks unrolled, each
  laid out by AUTO (XLA's figures within 10%), and against the unrolled twin's plan
  applied to the stack; the search's time for 8, 16 and 32 scanned blocks (32 within
  1.2x of 8).

In this figure's table the ``partitioner`` column is the chosen (AUTO) program and
the ``jax.jit`` column the program it is compared with (named in the row).
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import layer_models as lm
import models
import remat_case

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P

NAME = "auto"
RATIO = common.Target("<= 1.00x", hi=1.0)
BELOW = common.Target("< 1.00x", hi=0.999)
STEP = common.Target("<= 1.00x", hi=1.0)
SEARCH_LIMIT_S = {"mlp": 30.0, "block": 120.0, "layers": 60.0}

PARAM_HEAVY = models.Dims(batch=8, seq=16, model=256, heads=4, ff=1024)


@dataclass(frozen=True)
class Program:
    """A train step whose parameters are AUTO; ``hand`` is the layout a person writes."""

    name: str
    kind: str  # "mlp", "block" or "layers": which search-time target applies
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


#: Stacked transformer blocks whose search time is measured (not in --quick), and the
#: search-time targets (s) of the issue where it sets one.
STACKS = (4, 8, 16, 32)
STACK_LIMIT_S = {8: 20.0, 32: 20.0}
#: The cost model's search per block may grow by at most this from 4 to 32 blocks.
LINEAR = common.Target("<= 1.50x", hi=1.5)
#: Stacks whose chosen layout is also compared with the hand layout's XLA figures
#: (a compile of the hand program each: heavy beyond).
COMPARED_STACKS = (4, 8)

LAYER_PROGRAMS = (
    Program("cnn", "layers", models.train_step(lm.cnn_loss), lm.CNN_SPECS, lm.cnn_args),
    Program("embedding", "layers", models.train_step(lm.embed_loss), lm.EMBED_SPECS, lm.embed_args),
    Program("moe", "layers", models.train_step(lm.moe_loss), lm.MOE_SPECS, lm.moe_args),
    Program("scan", "layers", models.train_step(lm.scan_loss), lm.SCAN_SPECS, lm.scan_args),
    Program(
        "unrolled",
        "layers",
        models.train_step(lm.unrolled_loss),
        [lm.LAYER_SPECS] * lm.LAYERS,
        lm.unrolled_args,
    ),
)


def _block_of(norms: bool) -> tuple[models.Layer, dict[str, Any], str]:
    """The stacks' layer (``models.block``, or ``models.plain_block`` without its layer
    norms), its Megatron layout and what a row calls it."""
    if norms:
        return models.block, models.BLOCK_PARAM_SPECS, "blocks"
    return models.plain_block, models.PLAIN_BLOCK_PARAM_SPECS, "blocks without norms"


def _stack_program(n: int, dims: models.Dims = models.DIMS, norms: bool = True) -> Program:
    """``n`` transformer blocks in a row, every parameter AUTO; hand: Megatron per block."""
    layer, specs, blocks = _block_of(norms)

    def loss(params: list[models.Params], batch: models.Batch) -> jax.Array:
        x, y = batch
        for p in params:
            x = layer(p, x)
        return jnp.mean((x - y) ** 2)

    def args() -> tuple[list[models.Params], models.Batch]:
        params = [models.block_params(dims, norms=norms) for _ in range(n)]
        return params, models.block_batch(dims)

    return Program(f"{n} stacked {blocks}", "block", models.train_step(loss), [specs] * n, args)


def _scanned_program(n: int, dims: models.Dims = models.DIMS, norms: bool = True) -> Program:
    """The same ``n`` blocks as a ``lax.scan`` over stacked parameters (hand: Megatron
    per layer, the stack whole)."""
    layer, specs, blocks = _block_of(norms)

    def loss(params: models.Params, batch: models.Batch) -> jax.Array:
        x, y = batch
        x = models.plain_scan(layer)(params, x)
        return jnp.mean((x - y) ** 2)

    def args() -> tuple[models.Params, models.Batch]:
        return models.stack([models.block_params(dims, norms=norms)] * n), models.block_batch(dims)

    hand = {k: P(None, *s) for k, s in specs.items()}
    return Program(f"{n} scanned {blocks}", "block", models.train_step(loss), hand, args)


def _cold() -> None:
    jax.clear_caches()
    partitioner.clear_caches()  # traces, executables and the resolved AUTO signatures


def _pjit(prog: Program, params_spec: Any) -> Any:
    """The step with the parameters (in and out) laid out by ``params_spec``."""
    fresh = lambda *a: prog.step(*a)  # noqa: E731 - a new function object: no trace reused
    return partitioner.pjit(fresh, (params_spec, models.BATCH_SPECS), params_spec)


def _replicated(hand: Any) -> Any:
    return jax.tree.map(lambda _: P(), hand, is_leaf=lambda x: isinstance(x, P))


def first_call_s(prog: Program, spec: Any) -> float:
    """One cold first call of ``prog`` laid out by ``spec``: trace, (search,) compile, run."""
    params, batch = prog.args()
    _cold()
    f = _pjit(prog, spec)
    t0 = time.perf_counter()
    jax.block_until_ready(f(params, batch))
    return time.perf_counter() - t0


def search_time(prog: Program, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """(AUTO first call s, hand first call s, difference s) per cold round."""
    auto_s, hand_s = [], []
    for _ in range(rounds):
        auto_s.append(first_call_s(prog, AUTO))
        hand_s.append(first_call_s(prog, prog.hand))
    return auto_s, hand_s, [a - h for a, h in zip(auto_s, hand_s, strict=True)]


def _program_figures(report: Any) -> dict[str, Any]:
    """XLA's per-device figures of one compiled program, from its report."""
    return {
        "collective_bytes": report.collective_bytes,
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
            "auto_first_call_s": auto_s,
            "hand_first_call_s": hand_s,
            "n_samples": len(diff),
        },
    )
    return row, {"auto_first_call_s": auto_s, "hand_first_call_s": hand_s}


def scaling_rows(stacks: tuple[int, ...]) -> list[common.Row]:
    """Per stack, one cold search: what it adds to the first call (against a target where
    the issue sets one), the cost model's part, XLA's compiles; then the growth."""
    rows = []
    model_s: dict[int, float] = {}
    for n in stacks:
        prog = _stack_program(n)
        auto_s, hand_s, diff, info = _recorded_search(prog)
        model_s[n] = info["search_s"] - info["confirm_s"]
        limit = STACK_LIMIT_S.get(n)
        ok = None if limit is None else diff[0] <= limit
        extra = {
            "auto_first_call_s": auto_s, "hand_first_call_s": hand_s,
            "model_s": model_s[n], "confirm_s": info["confirm_s"], "search_s": info["search_s"],
            "auto_leaves": info["leaves"], "evaluations": info["evaluations"],
            "compiles": info["compiles"], "collective_bytes": info["collective_bytes"],
            "memory_bytes": info["memory_bytes"],
        }  # fmt: skip
        if n in COMPARED_STACKS:
            params, batch = prog.args()
            hand = _program_figures(_pjit(prog, prog.hand).lower(params, batch).compile().report())
            extra["hand_collective_bytes"] = hand["collective_bytes"]
            extra["hand_memory_bytes"] = hand["memory_bytes"]
        status = "reported" if ok is None else ("ok" if ok else "MISSED")
        target = "reported" if limit is None else f"<= {limit:.0f} s"
        row = common.Row(f"{prog.name}: search", "s", diff[0], None, None, target, ok, status)
        rows.append(dataclasses.replace(row, extra=extra))
    if len(model_s) > 1:
        lo, hi = min(model_s), max(model_s)
        per_block = (model_s[hi] / hi) / (model_s[lo] / lo)
        met = LINEAR.met(per_block, 0.0)
        name = f"cost-model search per block: {hi} / {lo} blocks"
        row = common.Row(name, "ratio", per_block, None, per_block, LINEAR.text, met)
        rows.append(
            dataclasses.replace(row, status="ok" if met else "MISSED", extra={"model_s": model_s})
        )
    return rows


#: Scanned stacks whose search time is measured; the growth allowed from the first to
#: the last (a scan body is walked once, whatever the length).
SCANNED = (8, 16, 32)
SCAN_GROWTH = common.Target("<= 1.20x", hi=1.2)
#: The scanned and unrolled twins' chosen programs: XLA's figures within this.
TWINS = common.Target("<= 1.10x", hi=1.1)


def _figures_of(prog: Program, spec: Any) -> dict[str, Any]:
    params, batch = prog.args()
    return _program_figures(_pjit(prog, spec).lower(params, batch).compile().report())


def twin_rows(n: int, dims: models.Dims = models.DIMS, norms: bool = True) -> list[common.Row]:
    """``n`` blocks scanned against the same blocks unrolled, each laid out by AUTO:
    XLA's collective bytes and memory per device (scanned / unrolled). Beside them,
    the scanned program laid out as the unrolled twin's choice (stacked): what the
    scan's own choice is to be judged against where XLA's loop holds more than the
    unrolled program for any layout (its stacked residuals and gradients); and whether
    Megatron's attention with the MLP over both mesh axes (``MLP_OVER_BOTH_SPECS``)
    beats either twin's choice on both figures (issue 54). ``dims``: the blocks' sizes
    (the rows name a batch other than the default's); ``norms``: the block with its
    layer norms or without."""
    scanned, unrolled = _scanned_program(n, dims, norms), _stack_program(n, dims, norms)
    shape = "" if dims == models.DIMS else f" (batch {dims.batch} x {dims.seq})"
    shape += "" if norms else ", no norms"
    _cold()
    params, batch = unrolled.args()
    report = _pjit(unrolled, AUTO).lower(params, batch).compile().report()
    theirs = _program_figures(report)
    choice = report.auto.choice
    stacked = {
        path.rsplit("'", 2)[-2]: P(None, *(tuple(d) if d else None for d in layout))
        for path, layout in zip(choice.paths, choice.layouts, strict=True)
        if path.startswith("args[0][0][")
    }  # the first layer's choice, every layer of the stack alike
    ours = _figures_of(scanned, AUTO)
    transplanted = _figures_of(scanned, stacked)
    both = {k: s for k, s in models.MLP_OVER_BOTH_SPECS.items() if norms or k[:2] != "ln"}
    hand = {
        "unrolled": _figures_of(unrolled, [both] * n),
        "scanned": _figures_of(scanned, {k: P(None, *s) for k, s in both.items()}),
    }
    rows = []
    for key, what in (("collective_bytes", "coll."), ("memory_bytes", "mem")):
        for other, short in ((theirs, "unrolled"), (transplanted, "unrolled's plan, scanned")):
            rows.append(
                common.compare(
                    f"{n} scanned blocks{shape}: {what} / {short}",
                    "KiB/device",
                    [ours[key]],
                    [other[key]],
                    TWINS,
                    1 / 1024,
                )  # fmt: skip
            )
    beaten = [who for who, chosen in (("unrolled", theirs), ("scanned", ours))
              if _beats(hand[who], chosen)]  # fmt: skip
    rows.append(
        _none_beats(
            f"{n} blocks{shape}: twins' choices beaten on both by Megatron attention + MLP "
            "over both axes", "twins", beaten,
            {"beaten": beaten, "hand": hand, "scanned": ours, "unrolled": theirs},
        )
    )  # fmt: skip
    return rows


def scan_scaling_rows(stacks: tuple[int, ...]) -> list[common.Row]:
    """Per scanned stack, one cold search (what it adds to the first call, the cost
    model's part, XLA's compiles); then the growth from the shortest to the longest."""
    rows = []
    added: dict[int, float] = {}
    for n in stacks:
        auto_s, hand_s, diff, info = _recorded_search(_scanned_program(n))
        added[n] = diff[0]
        extra = {
            "auto_first_call_s": auto_s, "hand_first_call_s": hand_s,
            "model_s": info["search_s"] - info["confirm_s"], "confirm_s": info["confirm_s"],
            "search_s": info["search_s"], "auto_leaves": info["leaves"],
            "evaluations": info["evaluations"], "compiles": info["compiles"],
        }  # fmt: skip
        row = common.Row(f"{n} scanned blocks: search", "s", diff[0], None, None, "reported", None)
        rows.append(dataclasses.replace(row, extra=extra))
    lo, hi = min(added), max(added)
    growth = added[hi] / added[lo]
    met = SCAN_GROWTH.met(growth, 0.0)
    name = f"scanned search: {hi} / {lo} blocks"
    row = common.Row(name, "ratio", growth, None, growth, SCAN_GROWTH.text, met)
    rows.append(dataclasses.replace(row, status="ok" if met else "MISSED", extra={"s": added}))
    return rows


def _recorded_search(prog: Program) -> tuple[list[float], list[float], list[float], dict]:
    """One cold round of :func:`search_time`, with the search's ``auto_search`` event."""
    searches: list[dict[str, Any]] = []

    def listen(event: str, info: dict[str, Any]) -> None:
        if event == "auto_search":
            searches.append(info)

    remove = partitioner.add_listener(listen)
    try:
        auto_s, hand_s, diff = search_time(prog, 1)
    finally:
        remove()
    return auto_s, hand_s, diff, searches[-1]


def layer_rows(prog: Program, rounds: int) -> tuple[list[common.Row], dict[str, Any]]:
    """The search's time, then the chosen layout's XLA figures against the hand layout and
    replication, and whether a baseline or the hand layout beats it on both."""
    row, timing = search_row(prog, rounds)
    params, batch = prog.args()
    _cold()
    layouts = (("chosen", AUTO), ("hand", prog.hand), ("replicated", _replicated(prog.hand)))
    reports = {
        who: _pjit(prog, spec).lower(params, batch).compile().report() for who, spec in layouts
    }
    figures = {who: _program_figures(r) for who, r in reports.items()}
    choice = reports["chosen"].auto.choice
    ours = figures["chosen"]
    rows = [row]
    for other, short in (("hand", "hand"), ("replicated", "repl.")):
        theirs = figures[other]
        for key, what in (("collective_bytes", "coll."), ("memory_bytes", "mem")):
            name = f"{prog.name}: {what} / {short}"
            theirs_ = [theirs[key]] if theirs[key] else None
            rows.append(common.compare(name, "KiB/device", [ours[key]], theirs_, None, 1 / 1024))
    others = {"hand": figures["hand"], "replicated": figures["replicated"]}
    for b in choice.baselines:
        if b.candidate.measured_memory_bytes is None:
            continue  # a large program's baseline the model ruled out (NOTE [auto floor])
        others[b.name] = {
            "collective_bytes": b.candidate.measured_collective_bytes,
            "memory_bytes": b.candidate.measured_memory_bytes,
        }
    beaten = [name for name, f in others.items() if _beats(f, ours)]
    rows.append(
        _none_beats(
            f"{prog.name}: beaten on both by", "layouts", beaten,
            {"beaten_by": beaten, "figures": others | {"chosen": ours}},
        )
    )  # fmt: skip
    details = {
        "chosen_specs": dict(zip(choice.paths, choice.chosen.specs, strict=True)),
        "figures": figures,
        "evaluations": choice.evaluations,
        "compiles": choice.compiles,
        "search": timing,
    }
    return rows, details


def _none_beats(name: str, unit: str, beaten: list[str], extra: dict[str, Any]) -> common.Row:
    """A row counting the layouts that beat AUTO's on both figures; its target: none."""
    return common.Row(
        name, unit, float(len(beaten)), None, None, "none", not beaten,
        "ok" if not beaten else "MISSED", extra=extra,
    )  # fmt: skip


def _beats(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    a = (theirs["collective_bytes"], theirs["memory_bytes"])
    b = (ours["collective_bytes"], ours["memory_bytes"])
    return a[0] <= b[0] and a[1] <= b[1] and a != b


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
        for prog in LAYER_PROGRAMS[:1] if args.quick else LAYER_PROGRAMS:
            layer_rows_, info = layer_rows(prog, 1)
            rows += layer_rows_
            details[prog.name] = info
        if not args.quick:
            rows += scaling_rows(STACKS)
            rows += remat_case.remat_rows() + remat_case.unrolled_rows()
            rows += twin_rows(8)
            rows += twin_rows(8, models.Dims(batch=8, seq=16))
            rows += twin_rows(8, models.Dims(batch=8, seq=16), norms=False)
            rows += scan_scaling_rows(SCANNED)
    common.print_rows("AUTO layouts: chosen vs hand vs replicated, 4x2 mesh", rows)
    for name, info in details.items():
        print(f"\n{name}: chosen {info['chosen_specs']}")
    for row in rows:
        if "evaluations" in row.extra:
            print(
                f"{row.name}: {row.extra['auto_leaves']} AUTO leaves, "
                f"{row.extra['evaluations']} assignments scored, {row.extra['compiles']} compiled; "
                f"cost model {row.extra['model_s']:.1f} s, XLA {row.extra['confirm_s']:.1f} s"
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
        ax.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("AUTO layouts on a 4x2 mesh, XLA's figures (lower is better)")


if __name__ == "__main__":
    main()
