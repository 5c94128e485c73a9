"""bench_plan.py's three-axis section (issue 54): AUTO against the hand plans a user tries first.

A 2x2x2 ("a", "b", "c") mesh, AdamW, the parameters and the optimizer state AUTO in and
out, the batch over one axis; every plan of ``hand_plans.catalogue`` written as explicit
specs (AdamW's moments follow their parameter's spec, its count replicated), its values
checked against jax.jit's plain step; AUTO's step written with ``pipeline(layer,
axis=AUTO)`` and, beside it, with the plain scan. The judgement is the issue's: no hand
plan at least as good on both XLA figures (collective bytes, memory per device) and
better by more than 2% on one, by ``Figures.dominates(by=0.02)``, the test AUTO's own
decisions and the tests use; and the search (the first ``lower().compile()``) within 30 s.
Then AUTO once more under ``auto_memory_limit`` = 1.05x the least memory a hand plan
holds: it must fit (XLA's memory within the limit), values checked as the others.

Why a worker process per setup, and a journal: a setup executes some 90 programs with
collectives on 8 virtual CPU devices over 2 shared cores, and XLA's CPU rendezvous has
been seen to hang in one of them (some devices' threads never arriving; 90 s later the
collective timeouts of ``common.py`` abort the process) where the same program alone
runs. So each setup runs in a process of its own (``python plan_three_axes.py INDEX
JOURNAL [--quick]``) that appends each plan's figures to a journal as it measures them;
if it aborts, a new one goes on from the first plan not journalled (XLA's figures of a
program do not depend on the process; the AUTO search is timed cold in whichever process
makes it), and the rows say how many restarts it took.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jax
import models
import numpy as np
import optax
from hand_plans import HandPlan, catalogue
from jax.sharding import Mesh

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._testing import Figures

AXES = ("a", "b", "c")
SIZES = dict.fromkeys(AXES, 2)
#: "At least as good on both XLA figures and better by more than 2% on one".
BY = 0.02
NOT_MATCHED = common.Target("0 hand plans", hi=0.0)
SEARCH_S = 30.0
#: AUTO under ``auto_memory_limit`` = this much of the least memory a hand plan holds.
LIMIT_SLACK = 1.05
LIMITED = "pipeline(layer, axis=AUTO) under the limit"
RESTARTS = 4
#: The quick run's stack depth and plans (one of each kind, so every path runs once).
QUICK_LAYERS = 2
QUICK_PLANS = (
    "replicated", "FSDP over ('a', 'b', 'c')", "FSDP over 'b' x Megatron over 'c'",
    "Megatron attention over 'b', MLP over ('b', 'c')",
    "gpipe over 'b', 8 microbatches + Megatron over 'c'",
    "circular over 'c', 4 microbatches + FSDP over 'a' (batch)",
)  # fmt: skip


@dataclass(frozen=True)
class Program:
    """A three-axis program (``models.py``'s): its layer (``layer(params, h, split=None)``),
    parameters (``{"blocks": the stack, ...}``, ``layers=`` deep) and batch from a key,
    its loss as a function of the stack callable, and what each weight is to a hand plan."""

    layer: Callable[..., Any]
    params: Callable[..., Any]
    batch: Callable[..., Any]
    loss: Callable[..., Any]
    roles: Mapping[str, str]


PROGRAMS = {
    "GPT": Program(models.gpt_block, models.gpt_params, models.gpt_batch, models.gpt_loss, models.GPT_ROLES),
    "SwiGLU + MQA": Program(models.glu_block, models.glu_stack_params, models.glu_batch, models.glu_loss, models.GLU_ROLES),
}  # fmt: skip
#: (program, the batch's axis): the GPT with its batch over the first axis and over the
#: last (the search must not care which), and a program of another family the search
#: was not built on.
SETUPS = (("GPT", "a"), ("GPT", "c"), ("SwiGLU + MQA", "b"))


def _title(index: int) -> str:
    program, batch_axis = SETUPS[index]
    return f"{program} (AdamW), 2x2x2, batch over {batch_axis!r}"


# --- checking values ---


def _unstaged(tree: Any) -> Any:
    """``tree`` with every ``StagedParams`` (a circular plan's) back in layer order."""
    staged = lambda leaf: hasattr(leaf, "unstage")  # noqa: E731
    return jax.tree.map(lambda x: x.unstage() if staged(x) else x, tree, is_leaf=staged)


def _check(got: Any, want: Any, what: str) -> None:
    """The step's loss, AdamW's moments and the parameters as jax.jit's plain step's
    (rtol 2e-3). A first AdamW step moves a weight by about ``lr * sign(g)``: where
    ``|g|`` is below a thousandth of its leaf's largest, float32 summation order may
    flip the sign, so the parameters are compared where it is not (the moments, which
    carry the gradients, everywhere)."""
    (p, (adam, *_), loss), (p0, (adam0, *_), loss0) = _unstaged(got), want
    np.testing.assert_allclose(float(loss), float(loss0), rtol=2e-3, err_msg=f"{what}: loss")
    for name, ours, theirs in (("mu", adam.mu, adam0.mu), ("nu", adam.nu, adam0.nu)):
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            b = np.asarray(b)
            atol = 1e-3 * float(np.abs(b).max())
            np.testing.assert_allclose(np.asarray(a), b, 2e-3, atol, err_msg=f"{what}: {name}")
    for a, b, g in zip(*(jax.tree.leaves(t) for t in (p, p0, adam0.mu)), strict=True):
        g = np.abs(np.asarray(g))
        clear = g >= 1e-3 * g.max()
        np.testing.assert_allclose(
            np.asarray(a)[clear], np.asarray(b)[clear], 2e-3, 1e-4, err_msg=f"{what}: params"
        )


# --- the steps (in the worker) ---


def _figures(report: Any) -> dict[str, float]:
    return {
        "collective_bytes": float(report.collective_bytes),
        "memory_bytes": float(report.memory.total),
    }


def _wrong(got: Any, want: Any, what: str) -> str:
    """``""`` where ``got``'s values are jax.jit's (``_check``), else what differs."""
    try:
        _check(got, want, what)
    except AssertionError as error:
        return " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return ""


def _hand(
    program: Program, plan: HandPlan, data: P, state: Any, batch: Any, want: Any
) -> tuple[Any, str]:
    """One hand plan's step, compiled and run: its report, and what its values get
    wrong (``""``: nothing)."""
    layer = program.layer
    if plan.tensor:
        layer = functools.partial(layer, split=models.TensorSplit(plan.heads, plan.hidden))
    params = state
    if plan.pipeline is None:
        stack = models.plain_scan(layer)
    else:
        line = plan.pipeline
        stack = partitioner.pipeline(
            layer, axis=line.axis, schedule=line.schedule, microbatches=line.microbatches
        )
        if line.schedule == "circular":  # staged once, as a training loop would
            params = jax.device_get({**state, "blocks": stack.stage(state["blocks"])})
    tx = models.adamw()
    opt_state = jax.device_get(tx.init(params))
    specs = plan.specs(params, program.roles, SIZES)
    opt_specs = optax.tree_map_params(
        tx, lambda _, spec: spec, opt_state, specs, transform_non_params=lambda _: P()
    )
    f = partitioner.jit(
        models.adamw_step(program.loss(stack)),
        in_shardings=(specs, opt_specs, data, data),
        out_shardings=(specs, opt_specs, P()),
    )
    report = f.lower(params, opt_state, *batch).compile().report()
    return report, _wrong(f(params, opt_state, *batch), want, plan.name)


def _auto(
    program: Program,
    stack: Any,
    data: P,
    state: Any,
    batch: Any,
    want: Any,
    limit: int | None = None,
) -> dict:
    """The step with AUTO parameters and optimizer state, cold (under ``limit``, an
    ``auto_memory_limit``, where given): its figures, choice and the search's wall and
    CPU seconds (the first ``lower().compile()``), values checked."""
    partitioner.clear_caches()
    opt_state = jax.device_get(models.adamw().init(state))
    f = partitioner.jit(
        models.adamw_step(program.loss(stack)),
        in_shardings=(AUTO, AUTO, data, data),
        out_shardings=(AUTO, AUTO, None),
        auto_memory_limit=limit,
    )
    with common.stopwatch() as took:
        compiled = f.lower(state, opt_state, *batch).compile()
    wrong = _wrong(f(state, opt_state, *batch), want, "AUTO")
    report = compiled.report()
    choice = report.auto.choice
    whole = [
        {
            "name": w.name,
            "note": w.note,
            "figures": None if w.candidate is None else asdict(w.candidate.figures),
        }
        for w in choice.whole_plans
    ]
    return {
        **_figures(report),
        "search_s": took[0].wall,
        "search_cpu_s": took[0].cpu,
        "plan": choice.whole_plan.name if choice.whole_plan else "no pipeline in the body",
        "whole_plans": whole,
        "compiles": choice.compiles,
        "wrong": wrong,
    }


def _append(journal: Path, record: dict[str, Any]) -> None:
    with journal.open("a") as out:
        out.write(json.dumps(record, default=str) + "\n")


def _read(journal: Path) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def measure(index: int, journal: Path, quick: bool) -> None:
    """The worker: setup ``index``'s hand plans, then AUTO (pipeline body, plain scan),
    each appended to ``journal`` once measured; those it holds already are skipped."""
    program_name, batch_axis = SETUPS[index]
    program = PROGRAMS[program_name]
    done = {(r["kind"], r["name"]) for r in _read(journal) if r["kind"] != "restart"}
    layers = {"layers": QUICK_LAYERS} if quick else {}
    state = jax.device_get(program.params(jax.random.key(0), **layers))
    batch = jax.device_get(program.batch(jax.random.key(1)))
    plain_step = models.adamw_step(program.loss(models.plain_scan(program.layer)))
    want = jax.jit(plain_step)(state, models.adamw().init(state), *batch)
    data = P(batch_axis)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), AXES)
    with jax.set_mesh(mesh):
        for plan in catalogue(AXES, batch_axis):
            if (quick and plan.name not in QUICK_PLANS) or ("hand", plan.name) in done:
                continue
            with common.stopwatch() as took:
                report, wrong = _hand(program, plan, data, state, batch, want)
            figures = _figures(report)
            partitioner.clear_caches()
            record = {"kind": "hand", "name": plan.name, **figures, "s": took[0].wall}
            _append(journal, {**record, "wrong": wrong})
            print(f"  {plan.name}: {_mb(figures['collective_bytes'])} MB moved, "
                  f"{_mb(figures['memory_bytes'])} MB held ({took[0].wall:.1f} s)"
                  + (f"; VALUES WRONG: {wrong}" if wrong else ""), flush=True)  # fmt: skip
        bodies = {
            "pipeline(layer, axis=AUTO)": partitioner.pipeline(program.layer, axis=AUTO),
            "plain scan": models.plain_scan(program.layer),
        }
        for body, stack in bodies.items():
            if ("auto", body) not in done:
                record = _auto(program, stack, data, state, batch, want)
                _append(journal, {"kind": "auto", "name": body, **record})
                print(f"  AUTO, {body}: {record['plan']} ({record['search_s']:.1f} s)"
                      + (f"; VALUES WRONG: {record['wrong']}" if record["wrong"] else ""), flush=True)  # fmt: skip
        if ("limited", LIMITED) not in done:
            hands = [r for r in _read(journal) if r["kind"] == "hand" and not r["wrong"]]
            limit = int(LIMIT_SLACK * min(r["memory_bytes"] for r in hands))
            stack = bodies["pipeline(layer, axis=AUTO)"]
            record = _auto(program, stack, data, state, batch, want, limit)
            _append(journal, {"kind": "limited", "name": LIMITED, "limit": limit, **record})
            print(f"  AUTO under {limit:,} bytes: {record['plan']}, "
                  f"{_mb(record['memory_bytes'])} MB ({record['search_s']:.1f} s)", flush=True)  # fmt: skip


# --- the rows (in bench_plan.py's process) ---


def _mb(x: float) -> str:
    return f"{x / 1e6:7.3f}"


def _fig(record: Mapping[str, Any]) -> Figures:
    return Figures(record["collective_bytes"], record["memory_bytes"], 0.0, measured=True)


def _beaten_by(hands: Mapping[str, Figures], fig: Figures) -> dict[str, dict[str, float]]:
    """The hand plans that dominate ``fig`` by more than 2%, and their ratios to it."""
    return {
        name: {
            "bytes_ratio": hand.collective_bytes / fig.collective_bytes,
            "memory_ratio": hand.memory_bytes / fig.memory_bytes,
        }
        for name, hand in hands.items()
        if hand.dominates(fig, by=BY)
    }


def _print(
    title: str, hands: Mapping[str, Figures], autos: Mapping[str, dict], wrong: Mapping[str, Any]
) -> None:
    """Every plan's figures, and which dominate AUTO's choice; those whose values are not
    jax.jit's are shown, marked, and judged by nothing."""
    auto = _fig(autos["pipeline(layer, axis=AUTO)"])
    for body, record in autos.items():
        print(f"  AUTO, {body}: {record['plan']} ({record['search_s']:.1f} s, "
              f"{record['search_cpu_s']:.1f} s CPU); whole plans:")  # fmt: skip
        for whole in record["whole_plans"]:
            print(f"    {whole['name']}: {whole['figures']}; {whole['note'] or 'chosen'}")
    print(f"\n== plan, three axes: {title}: every plan (MB per device; / AUTO's) ==")
    print(f"{'plan':62} {'bytes':>7} {'memory':>7} {'bytes/A':>7} {'mem/A':>7}  dominates AUTO")
    rows = [*((f"AUTO, {b}", _fig(r)) for b, r in autos.items()), *hands.items()]
    rows += [(name, _fig(record)) for name, record in wrong.items()]
    for name, fig in rows:
        mark = "by > 2%" if name in hands and fig.dominates(auto, by=BY) else ""
        mark = "values wrong: not judged" if name in wrong else mark
        print(
            f"{name:62} {_mb(fig.collective_bytes)} {_mb(fig.memory_bytes)} "
            f"{fig.collective_bytes / auto.collective_bytes:7.3f} "
            f"{fig.memory_bytes / auto.memory_bytes:7.3f}  {mark}"
        )


def _rows(title: str, records: list[dict[str, Any]]) -> list[common.Row]:
    """A setup's rows: AUTO matched by no hand plan; its memory and bytes against the
    hand plans' least; its search time; the plain scan's AUTO beside it (reported)."""
    hands = {r["name"]: _fig(r) for r in records if r["kind"] == "hand" and not r["wrong"]}
    wrong = {r["name"]: r for r in records if r["kind"] == "hand" and r["wrong"]}
    autos = {r["name"]: r for r in records if r["kind"] == "auto"}
    restarts = [r for r in records if r["kind"] == "restart"]
    _print(title, hands, autos, wrong)
    auto, plain = autos["pipeline(layer, axis=AUTO)"], autos["plain scan"]
    fig = _fig(auto)
    beaten = _beaten_by(hands, fig)
    met = not beaten and not auto["wrong"]
    extra = {
        **auto, "beaten_by": beaten, "restarts": restarts,
        "hand": {r["name"]: r for r in records if r["kind"] == "hand"},
    }  # fmt: skip
    rows = [
        common.Row(
            f"{title}: AUTO ({auto['plan']}{', VALUES WRONG' if auto['wrong'] else ''}): "
            "hand plans as good on both figures, > 2% better on one",
            "plans", float(len(beaten)), None, None, NOT_MATCHED.text,
            met, "ok" if met else "MISSED", extra=extra,
        ),
        common.Row(
            f"{title}: hand plans whose values are not jax.jit's (not judged)", "plans",
            float(len(wrong)), None, None, "-", None,
            extra={name: record["wrong"] for name, record in wrong.items()},
        ),
    ]  # fmt: skip
    least = min(hands, key=lambda h: hands[h].memory_bytes)
    fewest = min(hands, key=lambda h: hands[h].collective_bytes)
    rows.append(
        common.compare(f"{title}: AUTO / least-memory hand plan ({least}): XLA memory",
                       "KiB/device", [fig.memory_bytes], [hands[least].memory_bytes], None, 1 / 1024)
    )  # fmt: skip
    rows.append(
        common.compare(f"{title}: AUTO / fewest-bytes hand plan ({fewest}): collective bytes",
                       "KiB/device", [fig.collective_bytes], [hands[fewest].collective_bytes], None, 1 / 1024)
    )  # fmt: skip
    met = auto["search_s"] <= SEARCH_S
    rows.append(
        common.Row(
            f"{title}: AUTO search (the first lower + compile)", "s", auto["search_s"], None,
            None, f"<= {SEARCH_S:.0f} s", met, "ok" if met else "MISSED",
            extra={"cpu_s": auto["search_cpu_s"], "compiles": auto["compiles"]},
        )
    )  # fmt: skip
    limited = next(r for r in records if r["kind"] == "limited")
    ratio = limited["memory_bytes"] / limited["limit"]
    met = ratio <= 1.0 and not limited["wrong"]
    rows.append(
        common.Row(
            f"{title}: AUTO under auto_memory_limit = {LIMIT_SLACK}x the least hand memory "
            f"({limited['plan']}{', VALUES WRONG' if limited['wrong'] else ''}) / the limit: "
            "XLA memory", "x", ratio, None, None, "<= 1.00x", met, "ok" if met else "MISSED",
            extra=limited,
        )
    )  # fmt: skip
    flat = {h: f for h, f in hands.items() if "microbatches" not in h}
    plain_beaten = _beaten_by(flat, _fig(plain))
    rows.append(
        common.Row(
            f"{title}: AUTO, plain scan in the body: unpipelined hand plans as good on both, "
            "> 2% better on one", "plans", float(len(plain_beaten)), None, None, "-", None,
            extra={**plain, "beaten_by": plain_beaten},
        )
    )  # fmt: skip
    rows.append(
        common.Row(
            f"{title}: AUTO, plain scan in the body: search", "s", plain["search_s"], None,
            None, "-", None, extra={"cpu_s": plain["search_cpu_s"]},
        )
    )  # fmt: skip
    return rows


def rows(quick: bool) -> list[common.Row]:
    """Every setup's rows (the quick run: the first setup, shallow, a few plans), each
    measured by a worker process, restarted where one aborts (the module's docstring)."""
    out: list[common.Row] = []
    for index in range(1 if quick else len(SETUPS)):
        journal = Path(tempfile.mkdtemp(prefix="bench_plan3_")) / "journal.jsonl"
        print(f"\n##### plan, three axes: {_title(index)} #####", flush=True)
        for _ in range(RESTARTS + 1):
            worker = [sys.executable, __file__, str(index), str(journal)]
            rc = subprocess.call(worker + (["--quick"] if quick else []), cwd=Path(__file__).parent)
            if rc == 0:
                break
            if rc > 0:  # an error (a value off, a failed compile): not a hang
                raise RuntimeError(f"{_title(index)}: the worker failed ({rc}); see above")
            last = ([r["name"] for r in _read(journal) if r["kind"] != "restart"] or [""])[-1]
            _append(journal, {"kind": "restart", "name": "", "signal": -rc, "after": last})
            print(f"  worker killed by signal {-rc}: restarting after {last!r}", flush=True)
        else:
            raise RuntimeError(f"{_title(index)}: {RESTARTS + 1} workers aborted ({journal})")
        out += _rows(_title(index), _read(journal))
    return out


if __name__ == "__main__":
    measure(int(sys.argv[1]), Path(sys.argv[2]), "--quick" in sys.argv[3:])
