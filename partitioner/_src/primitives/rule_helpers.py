"""Small helpers shared by the rule modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from jax.sharding import Mesh

from .. import jax_private as jp
from ..sharding.parsed import ParsedPartitionSpec

T = TypeVar("T")


def keep_where(xs: Sequence[T], keep: Sequence[bool]) -> tuple[T, ...]:
    """The entries of ``xs`` whose flag in ``keep`` is true."""
    return tuple(x for x, k in zip(xs, keep, strict=True) if k)


def cotangents_for(
    primals_in: Sequence[Any], undef: Sequence[bool], nz_out: Sequence[bool], outs: Sequence[Any]
) -> list[Any]:
    """A transpose rule's result: None for known inputs, the computed cotangent or a
    symbolic zero (``nz_out`` says which) for each linear one, in input order."""
    outs_iter, nz_iter = iter(outs), iter(nz_out)
    result: list[Any] = []
    for x, u in zip(primals_in, undef, strict=True):
        if not u:
            result.append(None)
        elif next(nz_iter):
            result.append(next(outs_iter))
        else:
            result.append(jp.Zero(x.aval.to_ct_aval()))
    return result


def stage_unknown(
    trace: Any,
    primitive: Any,
    params: dict[str, Any],
    out_avals: Sequence[Any],
    effects: Any,
    residuals: Sequence[Any],
    in_tracers: Sequence[Any],
) -> list[Any]:
    """Stage the unknown half of a partial eval as one ``primitive`` equation of ``trace``.

    Its inputs are the residuals, then the unknown inputs; returns its output tracers.
    """
    res_tracers = [trace.new_instantiated_const(r) for r in residuals]
    tracers_in = [*res_tracers, *(t for t in in_tracers if not t.pval.is_known())]
    tracers_out = [jp.JaxprTracer(trace, jp.PartialVal.unknown(a), None) for a in out_avals]
    eqn = jp.new_eqn_recipe(
        trace, tracers_in, tracers_out, primitive, params, effects, jp.current_source_info()
    )
    for t in tracers_out:
        t.recipe = eqn
    return tracers_out


def batch_dims_first(
    vals: Sequence[Any], dims: Sequence[int | None]
) -> tuple[list[Any], list[bool]]:
    """A batching rule's inputs with their batch dimension moved to 0, and which are batched."""
    moved = [
        x if d is None or d == 0 else jp.moveaxis(x, d, 0) for x, d in zip(vals, dims, strict=True)
    ]
    return moved, [d is not None for d in dims]


# --- batching ---

not_mapped = None  # jax marks an unbatched value with None


def spmd_axes(axis_data: Any) -> tuple[Any, ...]:
    """The mesh axes ``vmap(..., spmd_axis_name=...)`` splits the batch over (none: ())."""
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
