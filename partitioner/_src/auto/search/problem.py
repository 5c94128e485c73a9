"""The search's view of a call: fixed layouts, AUTO leaves, ties, families and the limit.

Why a module of its own: the search (``descent.py``), XLA's confirmation
(``confirm.py``) and rematerialization (``../remat/``, which searches a rewritten
program's layouts again) all start from a call plan's :class:`Problem`; built here
once from the plan, it carries everything they need, the memory limit included,
so no stage has to pass the limit back up to another.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import AxisType, Mesh
from jax.tree_util import KeyPath, keystr

from ...primitives.call_plan import CallPlan
from ...sharding.auto import AUTO
from ...sharding.parsed import ParsedPartitionSpec
from ..cost.layouts import Layout
from ..cost.values import spec_layout
from .structure import families


@dataclass(frozen=True)
class Problem:
    """What the search needs, flat and in the jaxpr's input/output order.

    ``in_layouts``/``out_layouts``: a fixed layout, or None for an AUTO leaf.
    ``out_ties``: for an AUTO output, the input at the same path (or None).
    ``free_axes``: the mesh axes an AUTO leaf may be split over (the Auto ones: an
    Explicit axis is part of the traced types, which the search cannot change).
    ``in_families``: per input, its path with the layer left out (NOTE [auto
    repeats]; None: never tied). ``in_forced``: per input, the layout a given output
    spec at the same path asks for (the data-parallel baseline keeps it).
    ``memory_limit``: ``auto_memory_limit``, bytes per device (None: no limit).
    ``auto_names``: how messages name the AUTO inputs (``args[0]['w']``), and ``api``
    the call (``"jit step"``).
    """

    jaxpr: Any
    mesh_shape: Mapping[str, int]
    free_axes: tuple[str, ...]
    in_layouts: tuple[Layout | None, ...]
    out_layouts: tuple[Layout | None, ...]
    out_ties: tuple[int | None, ...]
    donated: tuple[bool, ...]
    in_families: tuple[str | None, ...] = ()
    in_forced: tuple[Layout | None, ...] = ()
    memory_limit: int | None = None
    auto_names: tuple[str, ...] = ()
    api: str = ""

    @property
    def auto_inputs(self) -> list[int]:
        """The positions of the AUTO inputs."""
        return [i for i, layout in enumerate(self.in_layouts) if layout is None]

    def describe(self, in_layouts: Sequence[Layout]) -> str:
        """The AUTO inputs laid out as ``in_layouts``, as messages name them."""
        return ", ".join(
            f"{name}: {spec_text(in_layouts[i])}"
            for name, i in zip(self.auto_names, self.auto_inputs, strict=True)
        )


def to_spec(layout: Layout) -> ParsedPartitionSpec:
    """A layout as a parsed spec, spelled as users write it (``to_partition_spec``)."""
    return ParsedPartitionSpec(ParsedPartitionSpec(None, layout).to_partition_spec(), layout)


def spec_text(layout: Layout) -> str:
    """A layout as the ``PartitionSpec`` a user would write (``P('data', None)``)."""
    return str(to_spec(layout).to_partition_spec())


def tie_outputs(
    plan: CallPlan, in_paths: Sequence[KeyPath], out_paths: Sequence[KeyPath]
) -> CallPlan:
    """``plan`` with every output left to XLA that a step hands back to an AUTO input
    (the same path, shape and dtype: the state a training step returns) made AUTO, so
    the search lays it out as that input.

    NOTE [loop-safe layouts]: ``state = step(state, batch)`` feeds each output back as
    the next call's argument. Left to XLA, an updated parameter or optimizer moment may
    come back laid out otherwise than the AUTO layout chosen for it (XLA's propagation
    follows the update's operands), and the next call meets a committed argument that
    does not match: jax's "Sharding passed to jit does not match". An AUTO output at such
    a path is already tied to its input (``problem_of``'s ``out_ties``), the cost of
    ending in that layout part of every candidate's score; an output left to XLA there
    is made one. A call that wants another layout for it says so: a spec given by hand.
    """
    params = plan.params
    n_consts = plan.num_consts
    in_specs = params.in_axis_resources[n_consts:]
    tie_of = ties(in_paths, params.jaxpr.in_avals[n_consts:], out_paths, params.jaxpr.out_avals)
    outs: tuple[Any, ...] = tuple(  # AUTO placeholders, as the planner leaves them
        AUTO if spec is None and tie is not None and in_specs[tie] is AUTO else spec
        for spec, tie in zip(params.out_axis_resources, tie_of, strict=True)
    )
    if outs == tuple(params.out_axis_resources):
        return plan
    return dataclasses.replace(plan, params=dataclasses.replace(params, out_axis_resources=outs))


def problem_of(
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> Problem:
    """The search's view of ``plan``: fixed layouts, AUTO leaves, ties and families;
    ``in_paths`` are the dynamic arguments' key paths (after the plan's constants),
    ``out_paths`` the outputs'."""
    params = plan.params
    mesh: Mesh = params.mesh
    order = tuple(str(axis) for axis in mesh.axis_names)
    jaxpr = params.jaxpr
    n_consts = plan.num_consts
    in_specs, out_specs = params.in_axis_resources, params.out_axis_resources

    def fixed(spec: Any, aval: Any) -> Layout | None:
        if spec is AUTO:
            return None
        if spec is None:  # a tracer's layout, left to XLA: the model reads it as whole
            return ((),) * len(aval.shape)
        return spec_layout(spec, len(aval.shape), order)

    out_fixed = tuple(
        None if spec is None or spec is AUTO else spec_layout(spec, len(aval.shape), order)
        for spec, aval in zip(out_specs, jaxpr.out_avals, strict=True)
    )
    tie_of = ties(in_paths, jaxpr.in_avals[n_consts:], out_paths, jaxpr.out_avals)
    forced: list[Layout | None] = [None] * len(in_specs)
    for j, tie in enumerate(tie_of):
        if tie is not None and out_fixed[j] is not None:
            forced[tie + n_consts] = out_fixed[j]
    return Problem(
        jaxpr=jaxpr,
        mesh_shape={str(axis): int(size) for axis, size in mesh.shape.items()},
        free_axes=tuple(
            str(axis)
            for axis, axis_type in zip(mesh.axis_names, mesh.axis_types, strict=True)
            if axis_type == AxisType.Auto
        ),
        in_layouts=tuple(
            fixed(spec, aval) for spec, aval in zip(in_specs, jaxpr.in_avals, strict=True)
        ),
        out_layouts=out_fixed,
        out_ties=tuple(
            None if (spec is not AUTO or tie is None) else tie + n_consts
            for spec, tie in zip(out_specs, tie_of, strict=True)
        ),
        donated=tuple(params.donated_invars),
        in_families=(None,) * n_consts + tuple(families(in_paths, jaxpr.in_avals[n_consts:])),
        in_forced=tuple(forced),
        memory_limit=memory_limit,
        auto_names=tuple(
            f"args{keystr(in_paths[i - n_consts])}"
            for i, spec in enumerate(in_specs)
            if spec is AUTO
        ),
        api=plan.api,
    )


def ties(
    in_paths: Sequence[KeyPath],
    in_avals: Sequence[Any],
    out_paths: Sequence[KeyPath],
    out_avals: Sequence[Any],
) -> list[int | None]:
    """For each output, the input at the same path with the same shape and dtype.

    Paths match as written (``out[0]['w']`` and ``args[0]['w']``) or, failing
    that, with the argument position dropped when exactly one input matches
    (``step(params, batch) -> params``).
    """

    def same(i: int, j: int) -> bool:
        in_aval, out_aval = in_avals[i], out_avals[j]
        return tuple(in_aval.shape) == tuple(out_aval.shape) and in_aval.dtype == out_aval.dtype

    exact = {keystr(path): i for i, path in enumerate(in_paths)}
    stripped: dict[str, list[int]] = collections.defaultdict(list)
    for k, path in enumerate(in_paths):
        stripped[keystr(path[1:])].append(k)
    found: list[int | None] = []
    for j, path in enumerate(out_paths):
        hit = exact.get(keystr(path))
        if hit is not None and same(hit, j):
            found.append(hit)
            continue
        near = [k for k in stripped.get(keystr(path), []) if same(k, j)]
        found.append(near[0] if len(near) == 1 else None)
    return found
