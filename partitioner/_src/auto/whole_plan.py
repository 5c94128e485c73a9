"""The whole plan of a call whose body has AUTO pipelines: pipeline or not, where, how.

NOTE [whole plan]: a body with AUTO pipelines runs as the plain scan or as a pipeline
over a mesh axis the call's given specs leave free, with a schedule (NOTE [pipeline
decision] in ``trace/decision.py``); each is a program of its own, with its own
layouts. This module weighs them:

- the plain program first, searched as any call's AUTO leaves are (``resolve.py``:
  the cost model ranks, XLA confirms the finalists beside the baselines, and under
  ``auto_memory_limit`` rematerialization joins); that is the plan a user picking
  replicated, FSDP, tensor parallel or the layer dimension over an axis competes with;
- its choice shapes the pipelines: an axis it uses for the weights alone (tensor
  parallel) stays theirs inside the stages, the stages' microbatches split over the
  others (``PipelineDecision.batch_axes``), so a pipeline over one axis keeps tensor
  parallelism over another; each decision's program is then traced (``retrace``);
- each pipeline's layouts start from the plain choice without the stages' axis, one
  sweep over the families puts that axis back where the model finds it pays (the
  layer dimension of the stacked parameters, over the stages), and coordinate descent
  from there settles the rest: one start, not a whole search's three per program
  (where the whole plan keeps an axis for the weights inside the stages, the layer's
  column-split matmuls are constrained over it: NOTE [tensor parallel in the stages]
  in ``pipeline/tensor_split.py``); the schedules over one stage axis
  lay the same parameters over the same stages, so the first one's layouts serve the
  others, their programs scored with them;
- without a limit the pipeline the model ranks fastest is compiled once, as the call
  would run it (a compile per pipeline would double the search's time), under a limit
  every pipeline is (the model's memory of a pipeline's loop is far from XLA's, a
  ranking by it would not say which fits).

The choice: among the plain program's chosen layouts and each pipeline's best, those
that fit the limit and that no measured plan that fits (the plain program's baselines
included) dominates on XLA's collective bytes and memory (``Figures.dominates``); of
them the least time (``Figures.time_s``: the model's compute, XLA's collective bytes
and count, the one step time the layout search judges by too), ties going to less
memory. So AUTO never returns a pipeline that the plain program's choice or an
obvious layout beats, nor the plain program where a pipeline beats it on both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from jax.tree_util import KeyPath

from ..primitives.auto_choice import Candidate, WholePlan
from ..primitives.auto_pipeline import sites
from ..primitives.call_plan import CallPlan
from ..trace.decision import NO_PIPELINE, PipelineDecision
from . import searched
from .cost.layouts import Layout, replicated
from .cost.values import spec_layout
from .resolve import Resolution, key_of, record_of, resolve, resolved, with_axes
from .search.confirm import NoLayoutFits, Outcome, no_fit
from .search.descent import Scored, Search
from .search.measure import candidate_of, measure, specs_of
from .search.problem import Problem, problem_of, tie_outputs
from .search.progress import Progress, reporting
from .search.stderr_capture import write_out

#: A traced program: the decision it was traced under, and its plan.
Program = tuple[PipelineDecision, CallPlan]


@dataclasses.dataclass(frozen=True)
class _Weighed:
    """One program's best layouts: which program, its whole plan, and how to run it."""

    index: int
    plan: WholePlan
    resolution: Resolution
    program: CallPlan
    replicated: tuple[str, ...] = ()  # XLA's warnings that it replicated a value

    @property
    def candidate(self) -> Candidate:
        assert self.plan.candidate is not None  # a weighed program was measured
        return self.plan.candidate


def resolve_whole_plan(
    plain: CallPlan,
    decisions: Sequence[PipelineDecision],
    retrace: Callable[[PipelineDecision], CallPlan],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """The plan chosen among the plain program (``plain``) and a pipeline per decision
    (each traced by ``retrace``; NOTE [whole plan]), resolved, its record naming every
    whole plan weighed. Once per signature (``searched.py``).

    Raises:
        NoLayoutFits: no plan, pipelined or not, fits ``memory_limit``.
    """
    plain = tie_outputs(plain, in_paths, out_paths)
    key = (
        "whole plan",
        key_of(plain, problem_of(plain, in_paths, out_paths, memory_limit)),
        tuple(decisions),
    )
    chosen, program, resolution = searched.once(
        key, lambda: _weigh(plain, decisions, retrace, in_paths, out_paths, memory_limit)
    )
    return resolved(plain if chosen.axis is None else program, resolution)


def _weigh(
    plain: CallPlan,
    decisions: Sequence[PipelineDecision],
    retrace: Callable[[PipelineDecision], CallPlan],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> tuple[PipelineDecision, CallPlan, Resolution]:
    """NOTE [whole plan]: the decision taken, its program and its resolution, the record
    naming every whole plan weighed."""
    weighed: list[_Weighed] = []
    floor: list[Candidate] = []
    failed: NoLayoutFits | None = None
    seed: tuple[Layout, ...] | None = None
    try:
        chosen_plain = resolve(plain, in_paths, out_paths, memory_limit)
    except NoLayoutFits as error:  # a pipeline may fit where no layout of the scan does
        failed = error
    else:
        record = chosen_plain.auto
        assert record is not None  # resolve() records its choice
        params = chosen_plain.params
        body = None if params.jaxpr is plain.params.jaxpr else params.jaxpr
        resolution = Resolution(params.in_axis_resources, params.out_axis_resources, record, body)
        weighed.append(_Weighed(0, WholePlan(NO_PIPELINE, (), record.chosen), resolution, plain))
        floor = [b.candidate for b in record.baselines if b.candidate.figures.measured]
        given = _batch_axes_given(plain)
        decisions = [_with_batch_axes(d, record.chosen, given) for d in decisions]
        seed = _layouts(plain, resolution)
    programs, skipped = _traced(decisions, retrace, in_paths, out_paths)
    with reporting(plain.api) as progress:
        searched = _searched(programs, seed, in_paths, out_paths, memory_limit, progress)
        # Without a limit, the model's fastest pipeline alone is compiled (NOTE [whole plan]).
        compiled = searched if memory_limit is not None else sorted(searched, key=_model_time)[:1]
        for entry in compiled:
            progress.note("compiling the %s to measure it", entry.name)
            weighed.append(_measured(entry, out_paths))
        winner, notes = _decide(weighed, floor, memory_limit)
        if winner is None:
            raise failed or _none_fits(weighed, memory_limit, plain.api)
        others = [entry for entry in weighed if entry is not winner]
        plans = tuple(
            dataclasses.replace(entry.plan, note=notes.get(entry.index, ""))
            for entry in (winner, *others)
        )
        unmeasured = [entry for entry in searched if entry not in compiled]
        plans += _not_compiled(unmeasured, compiled[0].name if compiled else "")
        plans += tuple(WholePlan(decision, note=why) for decision, why in skipped)
        if failed is not None:
            plans += (WholePlan(NO_PIPELINE, note=f"no layout fits: {failed}"),)
        record = with_axes(
            dataclasses.replace(
                winner.resolution.record, chosen=winner.candidate, whole_plans=plans
            )
        )
        progress.done(f"chose the {winner.plan.name}; per mesh axis: {record.axes_text()}")
    write_out("".join(winner.replicated))  # the program's own (search/measure.py)
    return (
        winner.plan.decision,
        winner.program,
        dataclasses.replace(winner.resolution, record=record),
    )


def _layouts(plan: CallPlan, resolution: Resolution) -> tuple[Layout, ...]:
    """The layout of each input of ``plan`` as ``resolution`` lays it out."""
    order = tuple(str(axis) for axis in plan.mesh.axis_names)
    return tuple(
        replicated(len(aval.shape)) if spec is None else spec_layout(spec, len(aval.shape), order)
        for spec, aval in zip(resolution.in_specs, plan.params.jaxpr.in_avals, strict=True)
    )


def _batch_axes_given(plan: CallPlan) -> tuple[str, ...]:
    """The mesh axes the call's given input specs put on a leading dimension (the
    batch's own), in the order met."""
    found: dict[str, None] = {}
    for spec in plan.params.in_axis_resources[plan.num_consts :]:
        leading = getattr(spec, "partitions", ())[:1]
        found.update((str(axis), None) for dim in leading for axis in dim)
    return tuple(found)


def _with_batch_axes(
    decision: PipelineDecision, plain: Candidate, given: tuple[str, ...]
) -> PipelineDecision:
    """``decision`` keeping for the weights the axes the plain program's choice uses for
    them alone (tensor parallel), where it does: the stages' microbatches are split over
    the others (NOTE [whole plan]), the axes the call's batch already uses (``given``)
    first, so that a microbatch's shards are the batch's own: no reshard of the batch
    (and no gather from a dimension split one way by indices split another, which XLA
    miscompiles)."""
    roles = dict(plain.roles)
    free = tuple(axis for axis, role in plain.roles if axis != decision.axis)
    batch = tuple(axis for axis in free if roles[axis] in ("data", "FSDP"))
    ordered = tuple(sorted(batch, key=lambda axis: axis not in given))
    if ordered == free or not batch:
        return decision  # every free axis splits the batch, in mesh order: the pipeline's rule
    return dataclasses.replace(decision, batch_axes=ordered)


def _traced(
    decisions: Sequence[PipelineDecision],
    retrace: Callable[[PipelineDecision], CallPlan],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
) -> tuple[list[Program], list[tuple[PipelineDecision, str]]]:
    """Each decision's program, traced; the decisions the body cannot run, and why."""
    programs: list[Program] = []
    skipped: list[tuple[PipelineDecision, str]] = []
    for decision in decisions:
        try:
            programs.append((decision, tie_outputs(retrace(decision), in_paths, out_paths)))
        except ValueError as why:  # this body cannot run that pipeline
            skipped.append((decision, str(why).splitlines()[0]))
    return programs, skipped


def _searched(
    programs: Sequence[Program],
    seed: tuple[Layout, ...] | None,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
    progress: Progress,
) -> list[_Searched]:
    """Each pipeline's program with its layouts searched (NOTE [whole plan])."""
    searched: list[_Searched] = []
    for index, (decision, plan) in enumerate(programs, start=1):
        taken = _microbatches(plan)
        name = WholePlan(decision, taken).name
        progress.note("searching the layouts of the %s (%d of %d)", name, index, len(programs))
        # The schedules over one axis lay the same parameters over the same stages.
        same_axis = next((e.best for e in searched if e.decision.axis == decision.axis), None)
        searched.append(
            _search(
                index, decision, taken, plan, in_paths, out_paths, memory_limit,
                same_axis, seed,
            )
        )  # fmt: skip
    return searched


def _not_compiled(searched: Sequence[_Searched], ahead: str) -> tuple[WholePlan, ...]:
    """The pipelines searched by the model alone, with its figures."""
    return tuple(
        WholePlan(
            entry.decision,
            entry.microbatches,
            _staged(candidate_of(entry.problem, entry.best, None), entry.decision),
            f"not compiled: the cost model puts the {ahead} ahead",
        )
        for entry in searched
    )


@dataclasses.dataclass(frozen=True)
class _Searched:
    """A pipeline's program and the cost model's best layouts of it."""

    index: int
    decision: PipelineDecision
    microbatches: tuple[int, ...]
    plan: CallPlan
    problem: Problem
    best: Scored
    evaluations: int
    seconds: float

    @property
    def name(self) -> str:
        return WholePlan(self.decision, self.microbatches).name


def _microbatches(plan: CallPlan) -> tuple[int, ...]:
    """The microbatch counts the pipelines of ``plan``'s body took, as their marks say."""
    return tuple(
        sorted({site.microbatches for site in sites(plan.params.jaxpr) if site.microbatches})
    )


def _search(
    index: int,
    decision: PipelineDecision,
    microbatches: tuple[int, ...],
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
    same_axis: Scored | None,
    plain: tuple[Layout, ...] | None,
) -> _Searched:
    """A pipeline's program with its layouts searched by the cost model (NOTE [whole
    plan]): another schedule's over the same axis (``same_axis``), scored; else the plain
    program's choice (``plain``) without the stages' axis, and the moves that put that
    axis back on one dimension of a leaf; else (no plain choice) a whole search."""
    start = time.perf_counter()
    problem = problem_of(plan, in_paths, out_paths, memory_limit)
    search = Search(problem, refine=False)
    if same_axis is not None:
        best = search.adopt(same_axis.in_layouts)
    elif plain is not None and decision.axis is not None:
        best = search.around(plain, decision.axis)
    else:
        best = search.descend(None)
    seconds = time.perf_counter() - start
    return _Searched(
        index, decision, microbatches, plan, problem, best, search.evaluations, seconds
    )


def _model_time(entry: _Searched) -> float:
    return entry.best.estimate.time_s


def _measured(entry: _Searched, out_paths: Sequence[KeyPath]) -> _Weighed:
    """A pipeline's best layouts compiled as the call would run them, and measured."""
    start = time.perf_counter()
    measured = measure(entry.plan, entry.best, quick=False)
    seconds = entry.seconds + time.perf_counter() - start
    outcome = dataclasses.replace(
        Outcome.compiled_once(entry.best, measured, seconds), evaluations=entry.evaluations
    )
    record = record_of(entry.plan, entry.problem, outcome, out_paths, compiles=1)
    chosen = _staged(record.chosen, entry.decision)
    resolution = Resolution(*specs_of(entry.plan, entry.best), record)
    plan = WholePlan(entry.decision, entry.microbatches, chosen)
    return _Weighed(entry.index, plan, resolution, entry.plan, measured.replicated)


def _staged(candidate: Candidate, decision: PipelineDecision) -> Candidate:
    """``candidate`` with the decision's stage axis named as such (its layouts alone
    would call it tensor parallel: the stacked parameters' layer dimension)."""
    roles = tuple(
        (axis, "pipeline stages" if axis == decision.axis else role)
        for axis, role in candidate.roles
    )
    return dataclasses.replace(candidate, roles=roles)


def _decide(
    weighed: Sequence[_Weighed], floor: Sequence[Candidate], memory_limit: int | None
) -> tuple[_Weighed | None, dict[int, str]]:
    """The plan NOTE [whole plan] chooses (None: none fits), and why each other was not."""
    notes: dict[int, str] = {}

    def fits(candidate: Candidate) -> bool:
        figures = candidate.figures
        return memory_limit is None or (figures.measured and figures.memory_bytes <= memory_limit)

    pool = [(entry.plan.name, entry.candidate) for entry in weighed] + [
        ("the plain program's baseline", candidate) for candidate in floor
    ]
    pool = [(name, candidate) for name, candidate in pool if fits(candidate)]
    eligible = []
    for entry in weighed:
        if not fits(entry.candidate):
            notes[entry.index] = "over the memory limit"
            continue
        mine = entry.candidate.figures
        beaten = [name for name, other in pool if other.figures.dominates(mine)]
        if beaten:
            notes[entry.index] = f"beaten on collective bytes and memory by the {beaten[0]}"
            continue
        eligible.append(entry)
    if not eligible:
        return None, notes
    winner = min(
        eligible,
        key=lambda entry: (entry.candidate.figures.time_s, entry.candidate.figures.memory_bytes),
    )
    best = winner.candidate.figures.time_s
    for entry in eligible:
        if entry is not winner:
            notes[entry.index] = (
                f"slower: {entry.candidate.figures.time_s * 1e6:,.1f} us against "
                f"{best * 1e6:,.1f} us"
            )
    return winner, notes


def _none_fits(weighed: Sequence[_Weighed], memory_limit: int | None, api: str) -> NoLayoutFits:
    smallest = min(weighed, key=lambda entry: entry.candidate.figures.memory_bytes)
    memory = smallest.candidate.figures.memory_bytes
    return no_fit(api, memory_limit or 0, f"the {smallest.plan.name}", memory, "plan")
