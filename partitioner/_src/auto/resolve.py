"""Resolve a call's AUTO leaves into specs: once per signature, cached, thread-safe.

Why a stage of its own: the front door has traced the body and knows every
other spec; the search needs that jaxpr and the stages below to confirm its
finalists (compiled through dispatch's executable cache, so the winner's
executable is the one the first call runs; read by the report), and what it
returns is ordinary specs, so everything after it (rules, lowering, dispatch)
never sees AUTO.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from jax.tree_util import KeyPath, keystr

from .. import options
from ..events import emit
from ..primitives.auto_choice import AutoChoice, Baseline, Candidate, axis_choices
from ..primitives.call_plan import CallPlan
from ..sharding.auto import AUTO
from . import searched
from .remat.fit import Rematerialized, rematerialize, trimmed
from .search.confirm import Measured, NoLayoutFits, Outcome, solve
from .search.descent import Scored
from .search.measure import candidate_of, compiles_alone, measure, specs_of
from .search.problem import Problem, problem_of, spec_text, tie_outputs
from .search.progress import Progress, reporting
from .search.stderr_capture import write_out


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What AUTO resolved for one signature: every input's and output's spec, the
    report's record, and the program rewritten to rematerialize (None: as traced)."""

    in_specs: tuple[Any, ...]
    out_specs: tuple[Any, ...]
    record: AutoChoice
    body: Any = None


def resolve(
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """``plan`` with every AUTO spec chosen (NOTE [auto search] in ``search/descent.py``),
    once per signature (``searched.py``).

    ``plan``'s params hold AUTO where a spec is to be chosen; ``in_paths`` are the
    dynamic arguments' key paths (after the plan's constants), ``out_paths`` the
    outputs'.

    With ``memory_limit`` below what layouts alone reach, the returned plan's body may
    be rewritten to rematerialize (NOTE [auto remat] in ``remat/__init__.py``).

    An output left to XLA that the step hands back to an AUTO input is laid out as
    that input (NOTE [loop-safe layouts] in ``search/problem.py``).

    Raises:
        ValueError: no layout, rematerialized or not, fits ``memory_limit`` (the
            message names the smallest found).
    """
    plan = tie_outputs(plan, in_paths, out_paths)
    problem = problem_of(plan, in_paths, out_paths, memory_limit)
    resolution = searched.once(
        key_of(plan, problem), lambda: _search(plan, problem, in_paths, out_paths)
    )
    return resolved(plan, resolution)


def key_of(plan: CallPlan, problem: Problem) -> tuple[Any, ...]:
    """What a choice for ``plan`` depends on: the program's text, not the jaxpr object
    (two threads tracing one signature at once get two equal jaxprs), its specs, ties,
    limit and options."""
    params = plan.params
    return (
        "auto", str(params.jaxpr.jaxpr), tuple(params.jaxpr.in_avals), params.mesh,
        tuple(params.in_axis_resources), tuple(params.out_axis_resources), problem.out_ties,
        problem.in_families, problem.donated, problem.memory_limit, options.use_shardy(),
        params.compiler_options,
    )  # fmt: skip


def resolved(plan: CallPlan, resolution: Resolution) -> CallPlan:
    """``plan`` with ``resolution``'s specs, its program (rewritten where it
    rematerializes) and its record."""
    params = plan.params
    new_params = dataclasses.replace(
        params,
        in_axis_resources=resolution.in_specs,
        out_axis_resources=resolution.out_specs,
        jaxpr=resolution.body or params.jaxpr,
    )
    return dataclasses.replace(plan, params=new_params, auto=resolution.record)


def _search(
    plan: CallPlan, problem: Problem, in_paths: Sequence[KeyPath], out_paths: Sequence[KeyPath]
) -> Resolution:
    """Search, confirm with XLA (NOTE [auto floor]), rematerialize where that is what
    fits or where a scan's residuals cost more than its unrolled twin's (NOTE [auto
    remat]); the specs, the record and the program rewritten (``None``: as traced). The
    search says what it is doing as it goes (``search/progress.py``)."""
    with reporting(plan.api) as progress:
        progress.note(
            "choosing the layouts of %d AUTO leaves over the mesh %s%s",
            len(problem.auto_inputs),
            dict(problem.mesh_shape),
            "" if problem.memory_limit is None else f" within {problem.memory_limit:,} bytes",
        )
        chosen, outcome = _searched(plan, problem, in_paths)
        record = record_of(plan, problem, outcome, out_paths, _compiles(plan, outcome))
        _xla_warnings(outcome, progress)
        progress.done(_summary(record))
    emit(
        "auto_search",
        name=plan.params.name,
        leaves=len(problem.auto_inputs),
        evaluations=outcome.evaluations,
        compiles=record.compiles,
        search_s=outcome.search_s,
        confirm_s=outcome.confirm_s,
        collective_bytes=outcome.chosen_measured.collective_bytes,
        memory_bytes=outcome.chosen_measured.memory_bytes,
    )
    ins, outs = specs_of(plan, outcome.chosen)
    if chosen is None:
        return Resolution(ins, outs, record)
    record = dataclasses.replace(
        record,
        remat=chosen.recompute.rematerialized(),
        flops_added=chosen.outcome.chosen_measured.flops - chosen.layout_only_flops,
        remat_to_fit=chosen.to_fit,
    )
    return Resolution(ins, outs, record, chosen.body)


def _searched(
    plan: CallPlan, problem: Problem, in_paths: Sequence[KeyPath]
) -> tuple[Rematerialized | None, Outcome]:
    """The search's outcome, and the rematerialization chosen with it (or None)."""
    alone = compiles_alone(plan)
    try:
        outcome = solve(problem, functools.partial(measure, plan))
    except NoLayoutFits as failed:
        if problem.memory_limit is None or not alone:
            raise
        chosen = rematerialize(plan, problem, in_paths, failed)
        return chosen, chosen.outcome
    trim = trimmed(plan, outcome) if alone else None  # NOTE [auto scan residuals]
    return trim, outcome if trim is None else trim.outcome


def _xla_warnings(outcome: Outcome, progress: Progress) -> None:
    """XLA's warnings that it replicated a value (NOTE [trial compiles' warnings] in
    ``search/measure.py``): the chosen layout's written to stderr, they are the program's
    own; of the layouts passed over, how many had any, logged."""
    write_out("".join(outcome.chosen_measured.replicated))
    passed_over = sum(
        1 for _, measured in outcome.others if measured is not None and measured.replicated
    )
    if passed_over:
        progress.note(
            "XLA replicated values to compile %d of the layouts passed over (its warnings "
            "kept from stderr)",
            passed_over,
        )


def _compiles(plan: CallPlan, outcome: Outcome) -> int:
    """XLA's compiles the search spent (none where the model stood in for XLA)."""
    return outcome.compiles if compiles_alone(plan) else 0


def _summary(record: AutoChoice) -> str:
    """The search's line of summary: the choice, XLA's figures, what it cost."""
    chosen = ", ".join(
        f"{path}: {spec}" for path, spec in zip(record.paths, record.chosen.specs, strict=True)
    )
    if len(chosen) > 160:
        chosen = chosen[:157] + "..."
    return (
        f"chose {chosen}; XLA: {record.chosen.measured_collective_bytes or 0:,.0f} collective "
        f"bytes, {record.chosen.measured_memory_bytes or 0:,.0f} bytes per device; "
        f"{record.evaluations} layouts scored, {record.compiles} compiles; per mesh axis: "
        f"{record.axes_text()}"
    )


def record_of(
    plan: CallPlan,
    problem: Problem,
    outcome: Outcome,
    out_paths: Sequence[KeyPath],
    compiles: int,
) -> AutoChoice:
    """The report's record of the choice (``AutoChoice``)."""
    auto_in = problem.auto_inputs
    auto_out = [j for j, spec in enumerate(plan.params.out_axis_resources) if spec is AUTO]

    def candidate(scored: Scored, measured: Measured | None) -> Candidate:
        return candidate_of(problem, scored, measured)

    chosen = outcome.chosen
    record = AutoChoice(
        paths=problem.auto_names,
        out_paths=tuple(f"out{keystr(out_paths[j])}" for j in auto_out),
        out_specs=tuple(spec_text(chosen.out_layouts[j]) for j in auto_out),
        chosen=candidate(chosen, outcome.chosen_measured),
        runners_up=tuple(candidate(scored, measured) for scored, measured in outcome.others),
        memory_limit=problem.memory_limit,
        evaluations=outcome.evaluations,
        compiles=compiles,
        search_s=outcome.search_s,
        confirm_s=outcome.confirm_s,
        baselines=tuple(
            Baseline(name, candidate(scored, measured))
            for name, scored, measured in outcome.baselines
        ),
        shapes=tuple(tuple(plan.params.jaxpr.in_avals[i].shape) for i in auto_in),
        layouts=tuple(chosen.in_layouts[i] for i in auto_in),
    )
    return with_axes(record)


def with_axes(record: AutoChoice) -> AutoChoice:
    """``record`` naming, per mesh axis, what the chosen plan uses it for and the nearest
    plan weighed that uses it otherwise."""
    others = record.named_candidates()[1:]
    return dataclasses.replace(record, axes=axis_choices(record.chosen, others))
