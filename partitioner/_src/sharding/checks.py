"""Checks of parsed specs against a mesh and the shapes they partition.

Why before tracing/compiling: a bad spec caught here names the argument's key
path, the spec, the axis and the sizes. The same mistake caught by XLA surfaces
as an opaque shape error deep in the partitioner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, NamedSharding

from .. import jax_private as jp
from .errors import IndivisibleShapeError
from .parsed import ParsedPartitionSpec

MSG_NOT_DIVISIBLE = """\
Sharding {sharding} implies that array axis {dim} is partitioned {divisor} times, but the \
dimension size is {size} (full shape: {shape}, per-dimension tiling factors: {factors} \
should evenly divide the shape).
{where}: dimension {dim} of shape {shape} has size {size}, which is not divisible by \
{divisor}, the product of the sizes of mesh axes {axes} it is split over ({sizes}). \
Pad the dimension to a multiple of {divisor}, or partition it over fewer axes."""

MSG_RANK = """\
{subject}Sharding {sharding} is only valid for values of rank at least {spec_len}, but was applied \
to a value of rank {ndim}.{scalar_hint}
{where}: the spec {spec} has {spec_len} entries but the value has rank {ndim} \
(shape {shape}). A spec can be at most as long as the value's rank (ndim); drop the \
trailing entries, e.g. {suggestion}."""

MSG_UNDEFINED_AXIS = """\
Resource axis: {axis} of {spec} is not found in mesh: {mesh_axes}.
{where}: the spec {spec} names mesh axis {axis!r}, which is not in the current mesh \
(axes {mesh_axes}). Did you forget the mesh, or misspell the axis? Use one of {mesh_axes}."""


def _as_jax_sharding(spec: ParsedPartitionSpec, mesh: Mesh) -> NamedSharding:
    """The sharding jax.jit's messages name for ``spec`` over ``mesh``."""
    return NamedSharding(mesh, spec.to_partition_spec())


def check_spec(
    spec: ParsedPartitionSpec,
    shape: tuple[int, ...],
    mesh: Mesh,
    where: str,
    *,
    check_divisible: bool = True,
    subject: str | None = None,
) -> None:
    """Check one spec against ``mesh`` and a value of ``shape``.

    ``subject`` is how jax.jit names the value in the sentence it puts before a
    rank error (``"pjit arguments with pytree key path x"``), where it has one.

    Raises:
        ValueError: an axis is not in the mesh, or the spec is longer than the rank.
        IndivisibleShapeError: (when ``check_divisible``) a dimension is not
            divisible by the product of its axes' sizes (jax's ``IndivisibleError``).
    """
    mesh_shape = dict(mesh.shape)
    for axis in spec.mesh_axes:
        if axis not in mesh_shape:
            raise ValueError(
                MSG_UNDEFINED_AXIS.format(
                    where=where, spec=spec.describe(), axis=axis, mesh_axes=tuple(mesh.axis_names)
                )
            )
    if len(spec.partitions) > len(shape):
        suggestion = spec.to_partition_spec().partitions[: len(shape)]
        raise ValueError(
            MSG_RANK.format(
                subject=""
                if subject is None
                else f"One of {subject} is incompatible with its sharding annotation "
                f"{_as_jax_sharding(spec, mesh)}: ",
                sharding=_as_jax_sharding(spec, mesh),
                scalar_hint=" For scalars the PartitionSpec should be P()" if not shape else "",
                where=where,
                spec=spec.describe(),
                spec_len=len(spec.partitions),
                ndim=len(shape),
                shape=tuple(shape),
                suggestion=f"PartitionSpec{tuple(suggestion)!r}",
            )
        )
    if not check_divisible:
        return
    for dim, (axes, divisor) in enumerate(
        zip(spec.partitions, spec.shards_per_dim(mesh, len(spec.partitions)), strict=True)
    ):
        if shape[dim] % divisor:
            raise IndivisibleShapeError(
                MSG_NOT_DIVISIBLE.format(
                    sharding=_as_jax_sharding(spec, mesh),
                    factors=[*spec.shards_per_dim(mesh, len(shape))],
                    where=where,
                    dim=dim,
                    shape=tuple(shape),
                    size=shape[dim],
                    divisor=divisor,
                    axes=axes,
                    sizes=" * ".join(f"{a}={mesh_shape[a]}" for a in axes),
                )
            )


def given_specs(specs: Sequence[Any], avals: Sequence[Any]) -> list[int]:
    """The indices of the specs a user gave, the ones checked and resolved.

    A leaf left to XLA (``None``, ``UNSPECIFIED``), one the AUTO stage chooses, and
    an ordering token (no data, no layout) have no spec yet.
    """
    return [
        i
        for i, (spec, aval) in enumerate(zip(specs, avals, strict=True))
        if isinstance(spec, ParsedPartitionSpec) and not jp.is_token(aval)
    ]


def check_specs(
    where: str,
    specs: Sequence[ParsedPartitionSpec],
    wheres: Sequence[str],
    subjects: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    mesh: Mesh,
) -> None:
    """:func:`check_spec` for flat lists of specs, their values' names and shapes.

    Args:
        where: names the whole spec tree (``"jit f in_shardings"``) when several fail.
        wheres / subjects: each value as ours / jax.jit's messages name it.

    Raises:
        ValueError: every bad leaf's problem at once (see :func:`raise_all`); an
            ``IndivisibleShapeError`` where each is a dimension not divisible.
    """
    errors: list[Exception] = []
    for spec, leaf_where, subject, shape in zip(specs, wheres, subjects, shapes, strict=True):
        try:
            check_spec(spec, shape, mesh, leaf_where, subject=subject)
        except ValueError as e:
            errors.append(e)
    raise_all(errors, where)


def raise_all(errors: Sequence[Exception], where: str) -> None:
    """Raise nothing, the one error, or one error listing every problem of a spec tree.

    Why all at once (as jax's ``shard_map`` does): fixing a tree of specs one
    leaf per run is slow, and seeing every bad leaf shows a pattern (a mesh
    axis misspelt everywhere) that one message hides. The combined error is of
    the problems' class where they share one (each leaf indivisible: jax's
    ``IndivisibleError`` still catches it), else a TypeError if any problem is
    one, else a ValueError; each line is one leaf's full message, naming its path.
    """
    if not errors:
        return
    if len(errors) == 1:
        raise errors[0]
    kinds = {type(e) for e in errors}
    if len(kinds) == 1:
        (kind,) = kinds
    else:
        kind = TypeError if any(isinstance(e, TypeError) for e in errors) else ValueError
    lines = "\n".join(f"  - {e}" for e in errors)
    raise kind(f"{where}: {len(errors)} spec leaves are invalid:\n{lines}")


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of an array, aval, ShapeDtypeStruct or Python scalar."""
    return tuple(getattr(x, "shape", ()))
