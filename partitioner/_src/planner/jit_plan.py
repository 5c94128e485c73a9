"""A ``jit``/``pjit`` call -> :class:`CallPlan`: free functions over the options record.

A call flows one way, each step handing the next what it needs: bind the
arguments (``trace/arguments.py``) -> the mesh the call runs over
(``sharding/placement.py``) -> one checked spec and aval per leaf
(``sharding/call_inputs.py``) -> trace the body, cached (``trace/tracing.py``) ->
one checked spec per output (``sharding/call_outputs.py``) -> ``pjit_p``'s params. :class:`JitPlanner` is the
:class:`Planner` the dispatcher and the stages ask; with ``AUTO`` leaves it has the
AUTO stage choose them (``auto/resolve.py``) before anyone else sees the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import Mesh
from jax.tree_util import tree_flatten_with_path, tree_leaves, tree_unflatten

from .. import jax_private as jp
from .. import lazy, options
from ..compiler import producers
from ..primitives.auto_pipeline import sites
from ..primitives.call_plan import CallPlan, PlannerFromInfo
from ..primitives.pjit_call import PjitParams
from ..sharding.auto import AUTO, has_auto
from ..sharding.call_inputs import checked_inputs, input_specs
from ..sharding.call_outputs import output_specs
from ..sharding.mesh_env import resolve_call_mesh
from ..sharding.parsed import REPLICATED
from ..sharding.placement import (
    Placement,
    check_committed_layout,
    is_committed,
    placement_from_arguments,
    placement_in_body,
)
from ..sharding.tree import UNSPECIFIED
from ..trace.arguments import BoundCall, bind_call
from ..trace.decision import PipelineDecision
from ..trace.tracing import (
    BodySettings,
    check_mesh_unchanged,
    enclosing_body,
    enclosing_settings,
    trace_body,
    tracing_a_body,
)
from .jit_info import JitInfo, NoneRule

# NOTE [lazy AUTO]: the AUTO stage (its cost model, search and reports) is loaded
# by the first plan with an AUTO leaf, not by ``import partitioner`` (``lazy.py``);
# the whole-plan choice by the first body with an AUTO pipeline.
if TYPE_CHECKING:
    from ..auto import resolve as auto_resolve
    from . import decisions
else:
    auto_resolve = lazy.module("partitioner._src.auto.resolve")
    decisions = lazy.module("partitioner._src.planner.decisions")


def plan_jit_call(
    info: JitInfo,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    decision: PipelineDecision | None = None,
) -> CallPlan:
    """Check one call's arguments, trace the body (cached) and build ``pjit_p``'s params.

    AUTO leaves stay AUTO in the plan (:class:`JitPlanner` resolves them). The body is
    traced under ``decision`` (NOTE [pipeline decision]); None: the enclosing body's,
    the plain scan outside any.
    """
    bound = bind_call(info.binding, args, kwargs)
    settings = BodySettings(
        memory_limit=info.options["auto_memory_limit"],
        pipeline=enclosing_settings().pipeline if decision is None else decision,
    )
    return _plan_over(info, bound, _placement(info, bound), settings)


def _plan_over(
    info: JitInfo, bound: BoundCall, placement: Placement, settings: BodySettings
) -> CallPlan:
    """The plan of a bound call over ``placement``'s devices (moved once to the devices
    the body's own shardings name, when nothing outside it placed the call)."""
    mesh = placement.mesh
    check_mesh_unchanged(mesh, info.label)
    legacy = jp.legacy_mesh_active()
    in_tree, out_tree = info.spec_trees(legacy)
    flat = bound.flat
    specs, in_avals = _input_specs(info, bound, placement, in_tree, legacy)
    traced = trace_body(
        info.fun,
        bound.rebuild,
        in_avals,
        mesh,
        bound.trace_key(),
        _debug_info(info, bound),
        source=placement.source,
        settings=settings,
    )
    moved = placement_in_body(info.label, jp.body_shardings(traced.jaxpr.jaxpr), placement)
    if moved is not None:
        return _plan_over(info, bound, moved, settings)
    outs = tree_unflatten(traced.out_tree, list(traced.jaxpr.out_avals))
    out_specs, _ = output_specs(
        out_tree, outs, traced.jaxpr.out_avals, mesh, api=info.label, out_name=info.names.outputs
    )
    consts = traced.tracer_consts
    params = PjitParams(
        jaxpr=traced.jaxpr,
        in_axis_resources=(REPLICATED,) * len(consts) + specs,
        out_axis_resources=out_specs,
        mesh=mesh,
        donated_invars=(False,) * len(consts) + bound.donated,
        name=info.name,
        api=info.api,
        committed=placement.committed,
        compiler_options=info.compiler_options,
        keep_unused=info.options["keep_unused"],
    )
    return CallPlan(
        params=params,
        args_flat=tuple(consts) + tuple(_moved(placement, flat.leaves)),
        in_tree=flat.in_tree,
        out_tree=traced.out_tree,
        in_avals=in_avals,
        num_consts=len(consts),
        arguments=flat,
        inline=info.options["inline"] and _unspecified(in_tree) and _unspecified(out_tree),
        auto_pipelines=sites(traced.jaxpr),
    )


def _input_specs(
    info: JitInfo, bound: BoundCall, placement: Placement, in_tree: Any, legacy: bool
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """One checked spec and aval per dynamic leaf (``sharding/call_inputs.py``)."""
    flat = bound.flat
    where = lambda i: flat.where(i, info.label)  # noqa: E731
    specs = input_specs(
        in_tree,
        bound.dynamic_args,
        flat.leaves,
        placement.mesh,
        where,
        api=info.label,
        arg_name=info.names.inputs,
        check_committed=not options.reshard_committed_enabled(),
        keyword_spec=_keyword_spec(info, in_tree, legacy),
        origin=placement.source,
        move_all=placement.moves_arguments,
    )
    return checked_inputs(
        specs,
        flat.leaves,
        [flat.label(i) for i in range(len(flat.leaves))],
        placement.mesh,
        where,
        info.label,
        info.binding.static_hint,
        info.fun,
        auto_search=info.has_auto,
    )


def _moved(placement: Placement, leaves: list[Any]) -> list[Any]:
    """The arguments, committed ones moved onto the call's one device where
    ``jit(device=...)`` placed it (jax.jit moves them; nothing else does)."""
    if not placement.moves_arguments:
        return leaves
    device = placement.mesh.devices.flat[0]
    return [
        jax.device_put(x, device) if is_committed(x) and x.sharding.device_set != {device} else x
        for x in leaves
    ]


def _unspecified(tree: Any) -> bool:
    """Every leaf of a parsed spec tree is unspecified (none given)."""
    return all(
        leaf is UNSPECIFIED for leaf in tree_leaves(tree, is_leaf=lambda x: x is UNSPECIFIED)
    )


def _keyword_spec(info: JitInfo, in_tree: Any, legacy_mesh: bool) -> Any:
    """The spec of a keyword argument the in-spec tree does not cover: replicated
    where a given tree reads ``None`` as replicated (pjit under a classic mesh, the
    2022 rule), else as the argument is laid out (as jax.jit)."""
    replicated = info.none_rule is NoneRule.REPLICATED_UNDER_LEGACY_MESH and legacy_mesh
    return REPLICATED if replicated and in_tree is not UNSPECIFIED else UNSPECIFIED


MSG_MESH_WITH_DEVICE = (
    "Mesh context manager should not be used with jit when backend or device is also "
    "specified as an argument to jit."
)


def _context_mesh(info: JitInfo) -> Mesh | None:
    """The mesh in context this door reads (``JitInfo.use_resource_env``), or None.

    Each door reads its own context as jax's does, the other one only to give
    bare PartitionSpecs a mesh (where jax raises). A ``device``/``backend`` option
    wins over the other door's context and is jax's error under the door's own.

    Raises:
        ValueError: ``device``/``backend`` given under the door's own mesh context.
    """
    classic, set_mesh = jp.context_meshes()
    own, other = (classic, set_mesh) if info.use_resource_env else (set_mesh, classic)
    if info.device is not None:
        if own is not None:
            raise ValueError(f"{MSG_MESH_WITH_DEVICE} ({info.label})")
        return None
    if own is not None:
        return own
    # The other door's context only gives bare PartitionSpecs a mesh, where jax raises.
    return other if info.needs_mesh is not None else None


def _placement(info: JitInfo, bound: BoundCall) -> Placement:
    """The mesh in context (or named by the specs), else the arguments' devices."""
    context = _context_mesh(info)
    if info.named_meshes or info.needs_mesh is not None or context is not None:
        mesh, source = resolve_call_mesh(
            info.label,
            info.named_meshes,
            context,
            info.bare_specs or info.needs_mesh or info.names.inputs,
            door=info.api,
            bare_specs=info.bare_specs is not None,
        )
        return Placement(mesh, source=source)
    flat = bound.flat
    labels = [flat.label(i) for i in range(len(flat.leaves))]
    placement = placement_from_arguments(info.label, flat.leaves, labels, info.device)
    if not placement.committed and (enclosing := enclosing_body()) is not None:
        # Called inside another call's body on its values, nothing placing it: it
        # runs where the enclosing computation runs, as a jit inside jax.jit does.
        mesh, outer = enclosing
        return Placement(mesh, committed=False, derived=True, source=outer)
    return placement


def _debug_info(info: JitInfo, bound: BoundCall) -> Any:
    """jax's description of the traced function and its arguments (names the module's values).

    Traced "for jit" through either door: jax's pjit is jit, and its messages about
    the traced function ("... traced for jit returned ...") say so.
    """
    return jp.debug_info(
        "jit",
        info.fun,
        bound.args,
        bound.kwargs,
        static_argnums=[i for i, _ in bound.statics if isinstance(i, int)],
        static_argnames=[k for k, _ in bound.statics if isinstance(k, str)],
        signature=info.binding.signature,
    )


def resolve_auto(
    info: JitInfo, plan: CallPlan, retrace: Callable[[PipelineDecision], CallPlan] | None = None
) -> CallPlan:
    """Have the AUTO stage choose the plan's AUTO specs (and, for a body with AUTO
    pipelines, its whole plan among the programs ``retrace`` traces: NOTE [pipeline
    decision]), then check the arguments against the chosen specs as against any given
    spec."""
    params = plan.params
    n = plan.num_consts
    was_auto = [s is AUTO for s in params.in_axis_resources[n:]]
    out_avals = tree_unflatten(plan.out_tree, list(params.jaxpr.out_avals))
    out_paths = [path for path, _ in tree_flatten_with_path(out_avals)[0]]
    arguments = plan.arguments
    assert arguments is not None  # a jit plan always names its arguments
    limit = info.options["auto_memory_limit"]
    if retrace is not None and plan.auto_pipelines:
        plan = decisions.weigh(plan, retrace, arguments.paths, out_paths, limit)
    else:
        plan = auto_resolve.resolve(plan, arguments.paths, out_paths, limit)
    if not options.reshard_committed_enabled():
        for i, auto in enumerate(was_auto):
            if auto:
                chosen = plan.params.in_axis_resources[n + i]
                assert chosen is not None  # resolve() chose a spec for every AUTO leaf
                _check_auto_argument(
                    info, plan, arguments.leaves[i], chosen, arguments.where(i, info.label)
                )
    return plan


MSG_LAID_OUT_BY = (
    "\nIt was laid out by {source}, and AUTO chose {chosen} for it in this call: give that "
    "output this input's layout (an output left unspecified, or AUTO, at the same path, "
    "shape and dtype as an AUTO input follows that input), or pass the argument as "
    "jax.device_put(x, NamedSharding(mesh, {chosen}))."
)


def _check_auto_argument(info: JitInfo, plan: CallPlan, x: Any, chosen: Any, where: str) -> None:
    """A committed argument of an AUTO leaf is laid out as AUTO chose; the error names the
    output of the call that laid it out otherwise, where a recent call did (NOTE
    [loop-safe layouts] in ``auto/search/problem.py``)."""
    try:
        check_committed_layout(x, chosen, plan.mesh, where, info.label)
    except ValueError as mismatch:
        source = producers.produced_by(x.sharding)
        if source is None:
            raise
        spec = chosen.to_partition_spec()
        more = MSG_LAID_OUT_BY.format(source=source, chosen=spec)
        raise ValueError(f"{mismatch}{more}") from None


@dataclass(frozen=True)
class JitPlanner(PlannerFromInfo):
    """The :class:`Planner` of a ``jit``/``pjit``-ed function: its record and the functions above."""

    info: JitInfo

    @property
    def eager(self) -> Callable[..., Any]:
        """Under ``jax.disable_jit()`` a call runs the function itself, as jax.jit's does."""
        return self.info.fun

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
        plan = plan_jit_call(self.info, args, kwargs)
        params = plan.params
        auto = has_auto(params.in_axis_resources) or has_auto(params.out_axis_resources)
        # The outermost call decides its body's AUTO pipelines, nested calls' included
        # (NOTE [pipeline decision]); a call inside another body takes its decision.
        decides = bool(plan.auto_pipelines) and not tracing_a_body()
        if auto or decides:
            retrace = lambda decision: plan_jit_call(self.info, args, kwargs, decision)  # noqa: E731
            plan = resolve_auto(self.info, plan, retrace if decides else None)
        return plan

    def wrap_call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """A jit-ed function is called as it is (pmap's multi-process calls are wrapped)."""
        return call
