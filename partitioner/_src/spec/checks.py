"""Checks of parsed specs against a mesh and the shapes they partition.

Why before tracing/compiling: a bad spec caught here names the argument's key
path, the spec, the axis and the sizes. The same mistake caught by XLA surfaces
as an opaque shape error deep in the partitioner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import KeyPath, keystr

from ..errors import MSG_NOT_DIVISIBLE, MSG_RANK, MSG_UNDEFINED_AXIS
from .parsed import ParsedPartitionSpec


def _where(api: str, what: str, path: KeyPath) -> str:
    return f"{api} {what}{keystr(path)}"


def check_spec(
    spec: ParsedPartitionSpec,
    shape: tuple[int, ...],
    mesh: Mesh,
    where: str,
    *,
    check_divisible: bool = True,
) -> None:
    """Check one spec against ``mesh`` and a value of ``shape``.

    Raises:
        ValueError: an axis is not in the mesh, the spec is longer than the rank,
            or (when ``check_divisible``) a dimension is not divisible by the
            product of its axes' sizes.
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
            raise ValueError(
                MSG_NOT_DIVISIBLE.format(
                    where=where,
                    dim=dim,
                    shape=tuple(shape),
                    size=shape[dim],
                    divisor=divisor,
                    axes=axes,
                    sizes=" * ".join(f"{a}={mesh_shape[a]}" for a in axes),
                )
            )


def check_specs(
    api: str,
    what: str,
    specs: Sequence[ParsedPartitionSpec],
    paths: Sequence[KeyPath],
    shapes: Sequence[tuple[int, ...]],
    mesh: Mesh,
    *,
    check_divisible: bool = True,
) -> None:
    """:func:`check_spec` for flat lists of specs, key paths and shapes."""
    for spec, path, shape in zip(specs, paths, shapes, strict=True):
        check_spec(spec, shape, mesh, _where(api, what, path), check_divisible=check_divisible)


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of an array, aval, ShapeDtypeStruct or Python scalar."""
    return tuple(getattr(x, "shape", ()))
