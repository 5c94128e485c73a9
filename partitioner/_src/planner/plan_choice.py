"""A call whose body calls ``pipeline(..., axis=AUTO)``: its programs, one per plan.

NOTE [pipeline decision] (``trace/plans.py``): the body was traced once without a
decision (its AUTO pipelines ran the plain scan); here it is traced again under each
pipeline worth weighing, and the AUTO stage (``auto/plans.py``, NOTE [whole plan])
chooses among the programs. The options: a pipeline over each mesh axis (of more
than one device) that no given spec of the call's inputs uses, since an axis the
user laid the batch or a weight over is theirs; with each schedule every AUTO
pipeline of the body allows (``schedule=None`` allows both). An option the body
cannot run (too few layers for the axis's stages, a batch the microbatches do not
divide) is left out, and the report says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jax.tree_util import KeyPath

from .. import lazy
from ..primitives.call_plan import CallPlan
from ..trace.plans import PipelineDecision, deciding

if TYPE_CHECKING:
    from ..auto import plans as auto_plans
else:  # NOTE [lazy AUTO] in jit_plan.py
    auto_plans = lazy.module("partitioner._src.auto.plans")


def options(plan: CallPlan) -> list[PipelineDecision]:
    """The pipelines worth weighing for ``plan``'s body (the module's docstring)."""
    mesh = plan.mesh
    given = {
        axis
        for spec in plan.params.in_axis_resources[plan.num_consts :]
        for axes in getattr(spec, "partitions", ())
        for axis in axes
    }
    allowed = list(plan.auto_pipelines[0])
    for schedules in plan.auto_pipelines[1:]:
        allowed = [schedule for schedule in allowed if schedule in schedules]
    return [
        PipelineDecision(str(axis), schedule)
        for axis in mesh.axis_names
        if int(mesh.shape[axis]) > 1 and axis not in given
        for schedule in allowed
    ]


def choose(
    plan: CallPlan,
    retrace: Callable[[], CallPlan],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """The plan chosen for the call among the plain program (``plan``) and a pipeline
    per option, each traced by ``retrace`` under its decision; resolved (every AUTO
    spec chosen)."""
    programs = [(PipelineDecision(None), plan)]
    skipped: list[tuple[PipelineDecision, str]] = []
    for decided in options(plan):
        with deciding(decided):
            try:
                programs.append((decided, retrace()))
            except ValueError as why:  # this body cannot run that pipeline
                skipped.append((decided, str(why).splitlines()[0]))
    return auto_plans.resolve_plans(programs, skipped, in_paths, out_paths, memory_limit)
