"""Reverse mode: transpose a linear pjit, and a sharding constraint.

The transposed body runs as one ``pjit_p`` call taking the non-linear inputs
and the non-zero cotangents; each cotangent it returns is laid out like the
input it belongs to (the input's spec becomes the output spec). Zero
cotangents stay symbolic in both directions.
"""

from __future__ import annotations

from typing import Any

from .. import jax_private as jp
from ..trace.constraint import sharding_constraint_p
from ..trace.primitive import PjitParams, pjit_p
from ._common import cache_per_jaxpr, cotangents_for, keep_where


@cache_per_jaxpr
def _transposed_jaxpr(
    jaxpr: Any, undef: tuple[bool, ...], nz_cts: tuple[bool, ...], in_avals: tuple[Any, ...]
) -> tuple[Any, tuple[bool, ...]]:
    """The transposed body and which linear inputs get non-zero cotangents."""
    n_known = undef.count(False)
    nz_out_box: list[tuple[bool, ...]] = []

    def body(*args: Any) -> list[Any]:
        known, cts = iter(args[:n_known]), iter(args[n_known:])
        primals = [
            jp.UndefinedPrimal(a) if u else next(known)
            for a, u in zip(jaxpr.in_avals, undef, strict=True)
        ]
        cts_full = [
            next(cts) if nz else jp.Zero(a.to_ct_aval())
            for a, nz in zip(jaxpr.out_avals, nz_cts, strict=True)
        ]
        cts_out = jp.backward_pass(jaxpr.jaxpr, False, jaxpr.consts, primals, cts_full)
        linear = [ct for ct, u in zip(cts_out, undef, strict=True) if u]
        nz_out_box.append(tuple(type(ct) is not jp.Zero and ct is not None for ct in linear))
        return [ct for ct in linear if type(ct) is not jp.Zero and ct is not None]

    debug = jaxpr.jaxpr.debug_info.with_unknown_names()
    t_jaxpr, _, consts = jp.trace_to_jaxpr_dynamic(
        jp.wrap_init(body, debug_info=debug), list(in_avals)
    )
    return jp.ClosedJaxpr(t_jaxpr, consts), nz_out_box[-1]


# --- pjit ---


def _pjit_transpose(cts_in: Any, *primals_in: Any, **kwargs: Any) -> list[Any]:
    params = PjitParams.of(kwargs)
    jaxpr, in_specs, out_specs = params.jaxpr, params.in_axis_resources, params.out_axis_resources
    undef = tuple(jp.is_undefined_primal(x) for x in primals_in)
    nz_cts = tuple(type(ct) is not jp.Zero for ct in cts_in)
    known = [x for x, u in zip(primals_in, undef, strict=True) if not u]
    cts = keep_where(cts_in, nz_cts)
    in_avals = tuple(jp.typeof(x) for x in (*known, *cts))
    t_jaxpr, nz_out = _transposed_jaxpr(jaxpr, undef, nz_cts, in_avals)
    linear_specs = keep_where(in_specs, undef)
    t_in_specs = keep_where(in_specs, [not u for u in undef]) + keep_where(out_specs, nz_cts)
    transposed = params.replace(
        jaxpr=t_jaxpr,
        in_axis_resources=t_in_specs,
        out_axis_resources=keep_where(linear_specs, nz_out),
        donated_invars=(False,) * len(in_avals),
        name=f"transpose({params.name})",
    )
    outs = transposed.bind(*known, *cts) if t_jaxpr.out_avals or t_jaxpr.effects else []
    return cotangents_for(primals_in, undef, nz_out, outs)


jp.primitive_transposes[pjit_p] = _pjit_transpose


# --- sharding constraint ---


def _constraint_transpose(ct: Any, x: Any, **params: Any) -> list[Any]:
    if type(ct) is jp.Zero:
        return [jp.Zero(x.aval.to_ct_aval()) if jp.is_undefined_primal(x) else None]
    return [sharding_constraint_p.bind(ct, **params)]


jp.primitive_transposes[sharding_constraint_p] = _constraint_transpose
