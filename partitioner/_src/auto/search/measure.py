"""XLA's figures for a call laid out as the search proposes: lowered, compiled, reported.

Why in the search's room: the search proposes layouts and XLA's own figures decide
among its finalists (NOTE [auto floor] in ``confirm.py``); the measuring compiles
through dispatch's executable cache, so the winner's executable is the one the
call's first run uses, and reads the report's collectives, memory and cost tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import options
from ...compiler.cache import get_executable
from ...inspect.tables import build as build_report
from ...primitives.call_plan import CallPlan
from ...sharding.auto import AUTO
from .descent import Scored
from .problem import to_spec

#: Compiler options of a quick trial compile (NOTE [auto floor] in ``confirm.py``).
QUICK = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass(frozen=True)
class Measured:
    """XLA's figures for a compiled finalist."""

    collective_bytes: float
    memory_bytes: float
    collectives: float  # executions of collectives per run
    flops: float = 0.0  # XLA's cost analysis (the price of rematerializing, ``../remat/``)


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
    # Through the executable cache: the winner's is the one its first call runs.
    report = build_report(trial, get_executable(trial.params)[0], options.use_shardy())
    collective = sum(
        collective.bytes_per_device * collective.count for collective in report.collectives
    )
    memory = scored.estimate.memory_bytes if report.memory is None else report.memory.total
    count = sum(collective.count for collective in report.collectives)
    flops = 0.0 if report.cost is None else report.cost.flops
    return Measured(float(collective), float(memory), float(count), flops)
