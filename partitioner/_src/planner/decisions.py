"""A call whose body calls ``pipeline(..., axis=AUTO)``: its programs, one per decision.

NOTE [pipeline decision] (``trace/decision.py``): the body was traced once under
:data:`NO_PIPELINE` (its AUTO pipelines ran the plain scan, and marked where they
are); here it is traced again under each decision worth weighing, and the AUTO stage
(``auto/whole_plan.py``, NOTE [whole plan]) weighs the programs. The decisions: a
pipeline over each mesh axis (of more than one device) that no given spec of the
call's inputs uses, since an axis the user laid the batch or a weight over is theirs;
with each schedule every AUTO pipeline of the body allows (``schedule=None`` allows
both). A decision the body cannot run (too few layers for the axis's stages, a batch
the microbatches do not divide) is left out, and the report says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jax.tree_util import KeyPath

from .. import lazy
from ..primitives.call_plan import CallPlan
from ..trace.decision import PipelineDecision

if TYPE_CHECKING:
    from ..auto import whole_plan
else:  # NOTE [lazy AUTO] in jit_plan.py
    whole_plan = lazy.module("partitioner._src.auto.whole_plan")


def options(plan: CallPlan) -> list[PipelineDecision]:
    """The pipelines worth weighing for ``plan``'s body (the module's docstring)."""
    mesh = plan.mesh
    given = {
        axis
        for spec in plan.params.in_axis_resources[plan.num_consts :]
        for axes in getattr(spec, "partitions", ())
        for axis in axes
    }
    sites = plan.auto_pipelines
    allowed = [s for s in sites[0].schedules if all(s in site.schedules for site in sites[1:])]
    return [
        PipelineDecision(str(axis), schedule)
        for axis in mesh.axis_names
        if int(mesh.shape[axis]) > 1 and axis not in given
        for schedule in allowed
    ]


def weigh(
    plan: CallPlan,
    retrace: Callable[[PipelineDecision], CallPlan],
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """The plan the AUTO stage chooses for the call among the plain program (``plan``)
    and a pipeline per option, each traced by ``retrace`` under its decision; resolved
    (every AUTO spec chosen)."""
    return whole_plan.resolve_whole_plan(
        plan, options(plan), retrace, in_paths, out_paths, memory_limit
    )
