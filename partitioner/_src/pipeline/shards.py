"""Each stage's microbatch in shards, each shard with its own copy of the stage's weights.

NOTE [pipeline gradients]: a stage's weight gradient is a sum over the examples of
every step's microbatch. Written plainly (the weights closed over by the loop), each
step's gradient is a partial sum over the mesh axes the batch is split over, and
XLA's SPMD partitioners, which keep no partial sum across an operation, all-reduce
it inside the loop at every step: the stage's parameter bytes once per step instead
of once per call. So the pipeline gives every shard of a stage's batch its own copy
of the stage's weights: before the loop, the weights are broadcast along a new
dimension laid out over the batch axes (``[stages, shards, ...]``: a local copy on
each device, or the one all-gather of weights a stage also splits over a batch axis,
FSDP inside the stage), and each step applies the layer to each shard with that
shard's copy (a ``vmap`` over the shards, ``spmd_axis_name`` the batch axes). A
shard's weight gradient then never leaves its device inside the loop; the transpose
of the broadcast, after the loop, sums the copies: one all-reduce (or
reduce-scatter) of the stage's weights per call, by construction, on any backend.

The *batch axes* are the mesh axes other than the stages' that the layer does not
use to split anything but its batch: an axis a constraint inside the layer puts on a
later dimension (tensor parallelism, ``P("data", "model")`` on a hidden activation)
is the layer's own. Inside the shards, the layer's constraints no longer name the
batch axes (the shard dimension carries them): the layer's program is rewritten with
those axes dropped from every constraint, ours and jax's, in nested bodies too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .. import jax_private as jp
from ..primitives.constraint import (
    JAX_CONSTRAINT,
    ConstraintParams,
    constraints,
    sharding_constraint_p,
)
from ..sharding.parsed import ParsedPartitionSpec
from .tensor_split import tensor_split


def batch_axes(
    mesh: Mesh,
    axis: str,
    layer_program: Any,
    shard_size: int,
    allowed: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """The mesh axes a stage's microbatch is split over (NOTE [pipeline gradients]): the
    Auto axes of more than one device other than ``axis`` (only those in ``allowed``,
    where given: the others are left to the layer's weights, tensor parallel inside
    the stages) that the layer's constraints put on no dimension but the leading one,
    as many as divide ``shard_size`` (the microbatch's examples) together, taken in
    ``allowed``'s order (else the mesh's)."""
    own = _constrained_axes(layer_program.jaxpr, after_leading=True)
    free = free_axes(mesh, axis)
    found: list[str] = []
    for name in free if allowed is None else allowed:
        if name not in free or name in own:
            continue
        if shard_size % (math.prod(mesh.shape[a] for a in found) * mesh.shape[name]) == 0:
            found.append(str(name))
    return tuple(found)


def free_axes(mesh: Mesh, axis: str) -> tuple[str, ...]:
    """The mesh's Auto axes of more than one device other than the stages' ``axis``, in
    mesh order: those a stage's batch or its weights may be split over."""
    return tuple(
        str(name)
        for name, size, kind in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types, strict=True)
        if name != axis and size > 1 and kind == AxisType.Auto
    )


def _constrained_axes(jaxpr: Any, *, after_leading: bool = False) -> set[str]:
    """The mesh axes some constraint of ``jaxpr`` (its bodies included) puts on a
    dimension (only dimensions after the leading one, ``after_leading``)."""
    first = 1 if after_leading else 0
    found = (dim for _, spec in constraints(jaxpr) for dim in spec.partitions[first:])
    return {str(axis) for dim in found for axis in dim}


@dataclasses.dataclass(frozen=True)
class ShardLayer:
    """A layer as one shard runs it, split by data dependence: ``prepare(params)``
    computes what the layer derives from its weights alone (casts, reshapes, the
    weights themselves), ``apply(prepared, h)`` the rest. The pipeline prepares every
    layer of a stage once, before its loop, so what a step picks and saves per step is
    never a function of the weights (NOTE [pipeline residuals] in ``program.py``)."""

    prepare: Callable[[Any], list[Any]]
    apply: Callable[[Sequence[Any], Any], Any]


def per_shard(
    layer: Callable[..., Any],
    batch: Sequence[str],
    one_layer: Any,
    one_shard: Any,
    tensor: tuple[Mesh, Sequence[str]] | None = None,
) -> ShardLayer:
    """``layer`` as one shard runs it: its program traced on one layer's parameters and
    one shard's activations (arrays or ``jax.ShapeDtypeStruct``s), with ``batch``
    dropped from every constraint (NOTE [pipeline gradients]), split into
    :class:`ShardLayer`'s two parts; with ``tensor`` (a mesh and axes), its
    column-split matmuls constrained over those axes (NOTE [tensor parallel in the
    stages]) unless the layer's own constraints name one of them."""
    closed = jax.make_jaxpr(layer)(one_layer, one_shard)
    constrained = _constrained_axes(closed.jaxpr)
    if tensor is not None and constrained & set(tensor[1]):
        tensor = None  # the layer lays its activations out itself
    if batch and constrained & set(batch):
        closed = jp.ClosedJaxpr(_without(closed.jaxpr, frozenset(batch)), closed.consts)
    n_params = len(jax.tree.leaves(one_layer))
    unknowns = [False] * n_params + [True] * (len(closed.in_avals) - n_params)
    known, unknown, _, _ = jp.partial_eval_jaxpr_nounits(closed, unknowns, True)
    _, out_tree = jax.tree.flatten(jax.eval_shape(layer, one_layer, one_shard))
    n_prepared = len(unknown.jaxpr.invars) - len(jax.tree.leaves(one_shard))

    def prepare(params: Any) -> list[Any]:
        return list(jp.eval_jaxpr(known.jaxpr, known.consts, *jax.tree.leaves(params)))

    run = (
        (lambda args: jp.eval_jaxpr(unknown.jaxpr, unknown.consts, *args))
        if tensor is None
        else tensor_split(unknown.jaxpr, unknown.consts, n_prepared, *tensor)
    )

    def apply(prepared: Sequence[Any], h: Any) -> Any:
        return jax.tree.unflatten(out_tree, run([*prepared, *jax.tree.leaves(h)]))

    return ShardLayer(prepare, apply)


def _without(jaxpr: Any, batch: frozenset[str]) -> Any:
    """``jaxpr`` with ``batch`` dropped from every constraint, bodies included."""
    return jaxpr.replace(eqns=[_eqn_without(eqn, batch) for eqn in jaxpr.eqns])


def _eqn_without(eqn: Any, batch: frozenset[str]) -> Any:
    params = {k: _value_without(v, batch) for k, v in eqn.params.items()}
    if eqn.primitive is sharding_constraint_p:
        constraint = ConstraintParams.of(params)
        spec = _spec_without(constraint.axis_resources.to_partition_spec(), batch)
        parsed = ParsedPartitionSpec.from_user_input(
            spec, "partitioner.pipeline", allow_unconstrained=True
        )
        params = constraint.replace(axis_resources=parsed).as_kwargs()
    elif eqn.primitive.name == JAX_CONSTRAINT and isinstance(params.get("sharding"), NamedSharding):
        sharding = params["sharding"]
        params["sharding"] = NamedSharding(sharding.mesh, _spec_without(sharding.spec, batch))
    return eqn.replace(params=params)


def _value_without(value: Any, batch: frozenset[str]) -> Any:
    if isinstance(value, jp.ClosedJaxpr):
        return jp.ClosedJaxpr(_without(value.jaxpr, batch), value.consts)
    if isinstance(value, jp.Jaxpr):
        return _without(value, batch)
    if isinstance(value, tuple):
        return tuple(_value_without(v, batch) for v in value)
    return value


def _spec_without(spec: PartitionSpec, batch: frozenset[str]) -> PartitionSpec:
    """``spec`` with the ``batch`` axes dropped (an entry left with no axis is None)."""
    entries: list[Any] = []
    for entry in spec:
        if entry is PartitionSpec.UNCONSTRAINED:
            entries.append(entry)
            continue
        axes = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(a for a in axes if a not in batch)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries)
