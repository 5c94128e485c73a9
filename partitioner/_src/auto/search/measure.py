"""XLA's figures for a call laid out as the search proposes: lowered, compiled, reported.

Why in the search's room: the search proposes layouts and XLA's own figures decide
among its finalists (NOTE [auto floor] in ``confirm.py``); the measuring compiles
through dispatch's executable cache, so the winner's executable is the one the
call's first run uses, and reads the report's collectives, memory and cost tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

from ... import options
from ...compiler.cache import get_executable
from ...inspect.tables import build as build_report
from ...primitives.auto_choice import Candidate, Estimate, Figures
from ...primitives.call_plan import CallPlan
from ...sharding.auto import AUTO
from ..cost import rates
from ..cost.layouts import Layout
from .descent import Scored
from .problem import Problem, spec_text, to_spec
from .stderr_capture import capture

#: Compiler options of a quick trial compile (NOTE [auto floor] in ``confirm.py``).
QUICK = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass(frozen=True)
class Measured:
    """XLA's figures for a compiled finalist."""

    collective_bytes: float
    memory_bytes: float
    collectives: float  # executions of collectives per run
    flops: float = 0.0  # XLA's cost analysis (the price of rematerializing, ``../remat/``)
    # XLA's warnings that it replicated a value to compile it (NOTE [trial compiles' warnings])
    replicated: tuple[str, ...] = ()


def figures_of(estimate: Estimate, measured: Measured | None) -> Figures:
    """The figures a decision judges a plan by: XLA's, where it was compiled, with the
    model's compute; the model's alone otherwise (the one step time of NOTE [auto
    floor] and NOTE [whole plan])."""
    if measured is None:
        return Figures(estimate.collective_bytes, estimate.memory_bytes, estimate.time_s)
    time_s = estimate.compute_s + rates.seconds(
        0.0, measured.collective_bytes, measured.collectives
    )
    return Figures(
        measured.collective_bytes, measured.memory_bytes, time_s, measured.flops, measured=True
    )


def candidate_of(problem: Problem, scored: Scored, measured: Measured | None) -> Candidate:
    """The report's row of ``scored`` (its AUTO leaves' specs, the model's figures and
    the ones it was judged by, what it uses each mesh axis for)."""
    return Candidate(
        specs=tuple(spec_text(scored.in_layouts[i]) for i in problem.auto_inputs),
        estimate=scored.estimate,
        figures=figures_of(scored.estimate, measured),
        roles=axis_roles(problem, scored.in_layouts),
    )


def axis_roles(problem: Problem, in_layouts: Sequence[Layout]) -> tuple[tuple[str, str], ...]:
    """What ``in_layouts`` use each mesh axis (of more than one device) for: a step's
    parameters are the inputs it hands back (its state; without state, the AUTO
    inputs), the rest is its batch. An axis splitting the batch alone is ``"data"``;
    the batch and parameters, ``"FSDP"``; parameters alone, ``"tensor parallel"``;
    neither, ``"unused"`` (a pipeline's stage axis is named by its whole plan)."""
    tied = {i for i in problem.out_ties if i is not None}
    params = tied or set(problem.auto_inputs)
    roles = []
    for axis, size in problem.mesh_shape.items():
        if size == 1:
            continue
        batch = any(
            layout and axis in layout[0] for i, layout in enumerate(in_layouts) if i not in params
        )
        weights = any(axis in dim for i in params for dim in in_layouts[i])
        role = (
            ("FSDP" if weights else "data")
            if batch
            else ("tensor parallel" if weights else "unused")
        )
        roles.append((axis, role))
    return tuple(roles)


def compiles_alone(plan: CallPlan) -> bool:
    """Whether ``plan``'s body can be lowered and compiled by itself: not one that closes
    over values of an enclosing trace (a call nested in another's body), for which the
    cost model stands in for XLA."""
    return not plan.num_consts


def specs_of(plan: CallPlan, scored: Scored) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The call's specs with its AUTO leaves laid out as ``scored`` says."""
    params = plan.params
    ins = tuple(
        to_spec(scored.in_layouts[i]) if spec is AUTO else spec
        for i, spec in enumerate(params.in_axis_resources)
    )
    outs = tuple(
        to_spec(scored.out_layouts[j]) if spec is AUTO else spec
        for j, spec in enumerate(params.out_axis_resources)
    )
    return ins, outs


def measure(plan: CallPlan, scored: Scored, *, quick: bool) -> Measured:
    """XLA's figures for ``plan`` laid out as ``scored`` says, from its report; ``quick``:
    compiled without optimizing the machine code (the figures are the same). A plan
    that does not compile alone gets the model's figures."""
    if not compiles_alone(plan):
        return Measured(
            scored.estimate.collective_bytes,
            scored.estimate.memory_bytes,
            scored.estimate.collectives,
        )
    ins, outs = specs_of(plan, scored)
    compiler = plan.params.compiler_options
    if quick:
        compiler = tuple(sorted({**dict(compiler), **QUICK}.items()))
    new_params = dataclasses.replace(
        plan.params, in_axis_resources=ins, out_axis_resources=outs, compiler_options=compiler
    )
    trial = dataclasses.replace(plan, params=new_params)
    with _involuntary_rematerializations() as replicated:
        # Through the executable cache: the winner's is the one its first call runs.
        executable = get_executable(trial.params)[0]
    report = build_report(trial, executable, options.use_shardy())
    collective = report.collective_bytes
    memory = scored.estimate.memory_bytes if report.memory is None else report.memory.total
    count = sum(collective.count for collective in report.collectives)
    flops = 0.0 if report.cost is None else report.cost.flops
    return Measured(float(collective), float(memory), float(count), flops, tuple(replicated))


#: The start of the warning XLA's SPMD partitioner writes when it replicates a value.
INVOLUNTARY = "Involuntary full rematerialization"


def _involuntary_rematerializations() -> contextlib.AbstractContextManager[list[str]]:
    """XLA's warnings that it replicated a value, written while the block compiles, kept
    apart (in the list yielded) instead of reaching stderr; anything else XLA writes
    reaches stderr as it would have.

    NOTE [trial compiles' warnings]: a layout the search only measures can make XLA's
    partitioner replicate a value (a move it cannot make with collectives, NOTE
    [involuntary rematerialization] in ``cost/layouts.py``, where XLA's propagation
    takes another route than the cost model's), and XLA warns on stderr. A user would
    read that as a flaw of their program, when it is one of a layout nobody chose. So
    the search's compiles keep XLA's warnings apart: the chosen layout's are written out
    at the end (they are the program's own), the others logged at INFO.

    XLA writes them to file descriptor 2, which is the whole process's: while a trial
    compile runs, what other threads write to stderr (fd 2, or ``sys.stderr`` over it)
    is caught too. It is held and written out in order, never lost, at the latest when
    the capture ends; trial compiles overlapping in two threads share one redirection
    (NOTE [one stderr capture] in ``stderr_capture.py``). One thing is not told apart:
    a line with this warning that another thread writes meanwhile (its own compile's,
    or another search writing out its chosen layout's) is taken for the trial's, and
    reaches stderr only if the trial's layout is chosen.
    """
    return capture(lambda line: INVOLUNTARY in line)
