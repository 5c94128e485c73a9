"""Every transformation rule of ``sharding_constraint_p``: vmap, jvp, transpose.

A constraint is linear and elementwise-shaped: tangents and cotangents are
constrained like the value, and under ``vmap`` a plain batch dimension is left
open for XLA (``UNCONSTRAINED``), or split over ``spmd_axis_name``'s axes.
"""

from __future__ import annotations

from typing import Any

from .. import jax_private as jp
from ..trace.constraint import ConstraintParams, sharding_constraint_p
from ._common import batch_spec, not_mapped, spmd_axes

# --- batching ---


def _constraint_batcher(
    axis_data: Any, vals_in: Any, dims_in: Any, **kwargs: Any
) -> tuple[Any, Any]:
    params = ConstraintParams.of(kwargs)
    (x,), (d,) = vals_in, dims_in
    if d is not_mapped:
        return params.bind(x), d
    spmd = spmd_axes(axis_data)
    spec = batch_spec(
        params.axis_resources, d, spmd, params.mesh, axis_data.size, open_dim=not spmd
    )
    return params.replace(axis_resources=spec).bind(x), d


jp.fancy_primitive_batchers[sharding_constraint_p] = _constraint_batcher


# --- jvp ---


def _constraint_jvp(primals: Any, tangents: Any, **kwargs: Any) -> tuple[Any, Any]:
    params = ConstraintParams.of(kwargs)
    (x,), (t,) = primals, tangents
    out = params.bind(x)
    if type(t) is jp.Zero:
        return out, t
    return out, params.bind(t)


jp.primitive_jvps[sharding_constraint_p] = _constraint_jvp


# --- transpose ---


def _constraint_transpose(ct: Any, x: Any, **kwargs: Any) -> list[Any]:
    if type(ct) is jp.Zero:
        return [jp.Zero(x.aval.to_ct_aval()) if jp.is_undefined_primal(x) else None]
    return [ConstraintParams.of(kwargs).bind(ct)]


jp.primitive_transposes[sharding_constraint_p] = _constraint_transpose
