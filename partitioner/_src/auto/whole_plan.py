"""The whole plan of a call whose body has AUTO pipelines: pipeline or not, where, how.

NOTE [whole plan]: the planner traced the body once per option (NOTE [pipeline
decision] in ``trace/decision.py``): the plain scan, and a pipeline over each mesh axis
the call's given specs leave free with each schedule. This module weighs those
programs, each with its own layouts:

- the plain program is searched as any call's AUTO leaves are (``resolve.py``: the
  cost model ranks, XLA confirms the finalists beside the baselines, and under
  ``auto_memory_limit`` rematerialization joins); that is the plan a user picking
  replicated, FSDP, tensor parallel or the layer dimension over an axis competes with;
- each pipeline's program is searched by the cost model (its stages read the stacked
  parameters per stage, so what the search can change is little); without a limit
  the pipeline the model ranks fastest is compiled once, as the call would run it
  (a compile per pipeline would double the search's time), under a limit every
  pipeline is (the model's memory of a pipeline's loop is far from XLA's, a
  ranking by it would not say which fits).

The choice: among the plain program's chosen layouts and each pipeline's best, those
that fit the limit and that no measured plan that fits (the plain program's baselines
included) beats on both XLA's collective bytes and memory; of them the least time
(the model's compute, XLA's bytes, the model's collective count), ties going to less
memory. So AUTO never returns a pipeline that the plain program's choice or an
obvious layout beats, nor the plain program where a pipeline beats it on both.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence

from jax.tree_util import KeyPath

from ..primitives.auto_choice import Candidate, PlanOption
from ..primitives.auto_pipeline import sites
from ..primitives.call_plan import CallPlan
from ..trace.decision import PipelineDecision
from . import choices
from .cost.rates import BYTES_PER_S, LATENCY_S
from .resolve import Choice, key_of, record_of, resolve, resolved
from .search.confirm import NoLayoutFits, Outcome
from .search.descent import Scored, Search
from .search.measure import measure, specs_of
from .search.problem import Problem, problem_of, spec_text
from .search.progress import reporting

#: A traced program: the decision it was traced under, and its plan.
Program = tuple[PipelineDecision, CallPlan]


@dataclasses.dataclass(frozen=True)
class _Weighed:
    """One program's best plan: its name, figures and choice (to run it)."""

    index: int
    name: str
    candidate: Candidate
    choice: Choice
    replicated: tuple[str, ...] = ()  # XLA's warnings that it replicated a value


def resolve_whole_plan(
    programs: Sequence[Program],
    skipped: Sequence[tuple[PipelineDecision, str]],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """The plan chosen among ``programs`` (the plain one first; NOTE [whole plan]),
    resolved, its record naming every plan weighed; ``skipped``: options that could not
    be built, and why. Once per signature (``choices.py``).

    Raises:
        NoLayoutFits: no plan, pipelined or not, fits ``memory_limit``.
    """
    first = programs[0][1]
    key = (
        "plans",
        key_of(first, problem_of(first, in_paths, out_paths, memory_limit)),
        tuple(decided for decided, _ in programs),
        tuple(skipped),
    )
    index, choice = choices.chosen(
        key, lambda: _choose(programs, skipped, in_paths, out_paths, memory_limit)
    )
    return resolved(programs[index][1], choice)


def _choose(
    programs: Sequence[Program],
    skipped: Sequence[tuple[PipelineDecision, str]],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> tuple[int, Choice]:
    weighed: list[_Weighed] = []
    floor: list[Candidate] = []
    failed: NoLayoutFits | None = None
    plain = programs[0][1]
    try:
        chosen_plain = resolve(plain, in_paths, out_paths, memory_limit)
    except NoLayoutFits as error:  # a pipeline may fit where no layout of the scan does
        failed = error
    else:
        record = chosen_plain.auto
        assert record is not None  # resolve() records its choice
        params = chosen_plain.params
        body = None if params.jaxpr is plain.params.jaxpr else params.jaxpr
        choice = (params.in_axis_resources, params.out_axis_resources, record, body)
        weighed.append(_Weighed(0, "no pipeline", record.chosen, choice))
        floor = [
            baseline.candidate
            for baseline in record.baselines
            if baseline.candidate.measured_memory_bytes is not None
        ]
    with reporting(plain.api) as progress:
        searched = []
        for index, (decided, plan) in enumerate(programs[1:], start=1):
            name = _name(decided, plan)
            progress.note(
                "searching the layouts of the %s (%d of %d)", name, index, len(programs) - 1
            )
            searched.append(_search(index, name, plan, in_paths, out_paths, memory_limit))
        # Without a limit, the model's fastest pipeline alone is compiled (NOTE [whole plan]).
        compiled = searched if memory_limit is not None else sorted(searched, key=_model_time)[:1]
        for entry in compiled:
            progress.note("compiling the %s to measure it", entry.name)
            weighed.append(_measured(entry, out_paths))
        winner, notes = _decide(weighed, floor, memory_limit)
        if winner is None:
            raise failed or _none_fits(weighed, memory_limit)
        progress.done(f"chose the {winner.name}")
    _ins, _outs, record, body = winner.choice
    sys.stderr.write("".join(winner.replicated))  # the program's own (search/measure.py)
    options = [winner, *(entry for entry in weighed if entry is not winner)]
    plans = tuple(
        PlanOption(entry.name, entry.candidate, notes.get(entry.index, "")) for entry in options
    )
    plans += tuple(
        PlanOption(
            entry.name,
            _candidate(entry),
            f"not compiled: the cost model puts the {compiled[0].name} ahead",
        )
        for entry in searched
        if entry not in compiled
    )
    plans += tuple(PlanOption(decided.describe(), None, why) for decided, why in skipped)
    if failed is not None:
        plans += (PlanOption("no pipeline", None, f"no layout fits: {failed}"),)
    record = dataclasses.replace(record, plan=winner.name, plans=plans)
    return winner.index, (_ins, _outs, record, body)


@dataclasses.dataclass(frozen=True)
class _Searched:
    """A pipeline's program and the cost model's best layouts of it."""

    index: int
    name: str
    plan: CallPlan
    problem: Problem
    best: Scored
    evaluations: int
    seconds: float


def _search(
    index: int,
    name: str,
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> _Searched:
    """A pipeline's program: its layouts searched by the cost model."""
    start = time.perf_counter()
    problem = problem_of(plan, in_paths, out_paths, memory_limit)
    search = Search(problem, refine=False)
    best = search.descend(None)
    return _Searched(
        index, name, plan, problem, best, search.evaluations, time.perf_counter() - start
    )


def _model_time(entry: _Searched) -> float:
    return entry.best.estimate.time_s


def _candidate(entry: _Searched) -> Candidate:
    """The cost model's figures of a pipeline never compiled."""
    return Candidate(
        specs=tuple(spec_text(entry.best.in_layouts[i]) for i in entry.problem.auto_inputs),
        estimate=entry.best.estimate,
    )


def _measured(entry: _Searched, out_paths: Sequence[KeyPath]) -> _Weighed:
    """A pipeline's best layouts compiled as the call would run them, and measured."""
    start = time.perf_counter()
    measured = measure(entry.plan, entry.best, quick=False)
    seconds = entry.seconds + time.perf_counter() - start
    outcome = dataclasses.replace(
        Outcome.compiled_once(entry.best, measured, seconds), evaluations=entry.evaluations
    )
    record = record_of(entry.plan, entry.problem, outcome, out_paths, compiles=1)
    choice = (*specs_of(entry.plan, entry.best), record, None)
    return _Weighed(entry.index, entry.name, record.chosen, choice, measured.replicated)


def _name(decided: PipelineDecision, plan: CallPlan) -> str:
    """``decided``'s description, with the microbatches its pipelines chose."""
    counts = sorted({site.microbatches for site in sites(plan.params.jaxpr) if site.microbatches})
    if not counts:
        return decided.describe()
    return f"{decided.describe()}, {'/'.join(map(str, counts))} microbatches"


def _decide(
    weighed: Sequence[_Weighed], floor: Sequence[Candidate], memory_limit: int | None
) -> tuple[_Weighed | None, dict[int, str]]:
    """The plan NOTE [whole plan] chooses (None: none fits), and why each other was not."""
    notes: dict[int, str] = {}

    def fits(candidate: Candidate) -> bool:
        memory = candidate.measured_memory_bytes
        return memory_limit is None or (memory is not None and memory <= memory_limit)

    pool = [(entry.name, entry.candidate) for entry in weighed] + [
        ("the plain program's baseline", candidate) for candidate in floor
    ]
    pool = [(name, candidate) for name, candidate in pool if fits(candidate)]
    eligible = []
    for entry in weighed:
        if not fits(entry.candidate):
            notes[entry.index] = "over the memory limit"
            continue
        beaten = [name for name, other in pool if _beats(other, entry.candidate)]
        if beaten:
            notes[entry.index] = f"beaten on collective bytes and memory by the {beaten[0]}"
            continue
        eligible.append(entry)
    if not eligible:
        return None, notes
    winner = min(
        eligible, key=lambda entry: (_time(entry.candidate), entry.candidate.measured_memory_bytes)
    )
    for entry in eligible:
        if entry is not winner:
            notes[entry.index] = (
                f"slower: {_time(entry.candidate) * 1e6:,.1f} us against "
                f"{_time(winner.candidate) * 1e6:,.1f} us"
            )
    return winner, notes


def _figures(candidate: Candidate) -> tuple[float, float]:
    bytes_ = candidate.measured_collective_bytes
    memory = candidate.measured_memory_bytes
    estimate = candidate.estimate
    return (
        estimate.collective_bytes if bytes_ is None else bytes_,
        estimate.memory_bytes if memory is None else memory,
    )


def _beats(mine: Candidate, theirs: Candidate) -> bool:
    pairs = list(zip(_figures(mine), _figures(theirs), strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def _time(candidate: Candidate) -> float:
    """The time a plan is judged by: the model's compute and collective count, XLA's
    bytes (``search/confirm.py``'s measured time)."""
    estimate = candidate.estimate
    moved, _ = _figures(candidate)
    return estimate.compute_s + moved / BYTES_PER_S + estimate.collectives * LATENCY_S


def _none_fits(weighed: Sequence[_Weighed], memory_limit: int | None) -> NoLayoutFits:
    smallest = min(weighed, key=lambda entry: _figures(entry.candidate)[1])
    memory = _figures(smallest.candidate)[1]
    return NoLayoutFits(
        f"no plan fits auto_memory_limit={memory_limit:,} bytes per device: the smallest "
        f"found, the {smallest.name}, needs {memory:,.0f} bytes",
        smallest=smallest.name,
        memory_bytes=memory,
    )
