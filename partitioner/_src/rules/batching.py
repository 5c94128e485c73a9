"""vmap of a pjit and of a sharding constraint.

The batch dimension is moved to 0 and inserted into every spec: unpartitioned
by default, or over the mesh axes named by ``vmap(..., spmd_axis_name=...)``.
A constraint leaves a plain batch dimension open for XLA (``UNCONSTRAINED``).
"""

from __future__ import annotations

from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from ..spec.parsed import ParsedPartitionSpec
from ..trace.constraint import sharding_constraint_p
from ..trace.primitive import PjitParams, pjit_p
from ._common import batch_dims_first

not_mapped = None  # jax marks an unbatched value with None


def _spmd_axes(axis_data: Any) -> tuple[Any, ...]:
    name = getattr(axis_data, "spmd_name", None)
    if name is None:
        return ()
    return tuple(name) if isinstance(name, (tuple, list)) else (name,)


def batch_spec(
    spec: ParsedPartitionSpec | None,
    dim: int,
    spmd_axes: tuple[Any, ...],
    mesh: Mesh,
    batch_size: int,
    *,
    open_dim: bool = False,
) -> ParsedPartitionSpec | None:
    """``spec`` with the batch dimension inserted at ``dim``.

    Raises:
        ValueError: a ``spmd_axis_name`` that is not a mesh axis, is already used
            by the spec, or does not divide the batch size.
    """
    if spec is None:
        return None
    if not spmd_axes:
        return spec.insert_axis_partitions(dim, (), unconstrained=open_dim)
    sizes = dict(mesh.shape)
    for axis in spmd_axes:
        if axis not in sizes:
            raise ValueError(
                f"vmap spmd_axis_name={spmd_axes!r}: {axis!r} is not an axis of the mesh "
                f"{dict(mesh.shape)}; name a mesh axis to partition the batch over."
            )
        if axis in spec.mesh_axes:
            raise ValueError(
                f"vmap spmd_axis_name={spmd_axes!r}: mesh axis {axis!r} already partitions the "
                f"spec {spec.describe()}; a mesh axis can partition one dimension only."
            )
    batched = spec.insert_axis_partitions(dim, spmd_axes)
    divisor = batched.shards_per_dim(mesh, dim + 1)[dim]
    if batch_size % divisor:
        raise ValueError(
            f"vmap spmd_axis_name={spmd_axes!r}: the batch size {batch_size} is not divisible by "
            f"{divisor}, the product of the sizes of mesh axes {spmd_axes}."
        )
    return batched


# --- pjit ---


def _pjit_batcher(
    axis_data: Any, vals_in: Any, dims_in: Any, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    params = PjitParams.of(kwargs)
    vals_in, in_batched = batch_dims_first(vals_in, dims_in)
    batched_jaxpr, out_batched = jp.batch_jaxpr(params.jaxpr, axis_data, in_batched, False)
    mesh, spmd, size = params.mesh, _spmd_axes(axis_data), axis_data.size
    batched = params.replace(
        jaxpr=batched_jaxpr,
        in_axis_resources=tuple(
            batch_spec(s, 0, spmd, mesh, size) if b else s
            for s, b in zip(params.in_axis_resources, in_batched, strict=True)
        ),
        out_axis_resources=tuple(
            batch_spec(s, 0, spmd, mesh, size) if b else s
            for s, b in zip(params.out_axis_resources, out_batched, strict=True)
        ),
    )
    outs = batched.bind(*vals_in)
    return outs, [0 if b else not_mapped for b in out_batched]


jp.fancy_primitive_batchers[pjit_p] = _pjit_batcher


# --- sharding constraint ---


def _constraint_batcher(
    axis_data: Any, vals_in: Any, dims_in: Any, *, axis_resources: ParsedPartitionSpec, mesh: Mesh
) -> tuple[Any, Any]:
    (x,), (d,) = vals_in, dims_in
    if d is not_mapped:
        return sharding_constraint_p.bind(x, axis_resources=axis_resources, mesh=mesh), d
    spmd = _spmd_axes(axis_data)
    spec = batch_spec(axis_resources, d, spmd, mesh, axis_data.size, open_dim=not spmd)
    return sharding_constraint_p.bind(x, axis_resources=spec, mesh=mesh), d


jp.fancy_primitive_batchers[sharding_constraint_p] = _constraint_batcher
