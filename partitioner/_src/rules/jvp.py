"""Forward-mode differentiation of a pjit and of a sharding constraint.

Tangents flow through the same ``pjit_p`` call as the primals: the JVP body
takes ``(*primals, *nonzero tangents)``, and each tangent is laid out like its
primal. Symbolic zero tangents never become arrays.
"""

from __future__ import annotations

from typing import Any

from .. import jax_private as jp
from ..trace.constraint import sharding_constraint_p
from ..trace.primitive import PjitParams, pjit_p
from ._common import keep_where

# --- pjit ---


def _pjit_jvp(primals_in: Any, tangents_in: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    params = PjitParams.of(kwargs)
    nz_in = [type(t) is not jp.Zero for t in tangents_in]
    jaxpr_jvp, nz_out = jp.jvp_jaxpr(params.jaxpr, nz_in, instantiate=False)
    in_specs, out_specs = params.in_axis_resources, params.out_axis_resources
    jvp_params = params.replace(
        jaxpr=jaxpr_jvp,
        in_axis_resources=(*in_specs, *keep_where(in_specs, nz_in)),
        out_axis_resources=(*out_specs, *keep_where(out_specs, nz_out)),
        donated_invars=(*params.donated_invars, *(False,) * sum(nz_in)),
        name=f"jvp({params.name})",
    )
    outs = jvp_params.bind(*primals_in, *keep_where(tangents_in, nz_in))
    primals_out, nz_tangents = outs[: len(out_specs)], iter(outs[len(out_specs) :])
    tangents_out = [
        next(nz_tangents) if nz else jp.Zero(aval.to_tangent_aval())
        for nz, aval in zip(nz_out, params.jaxpr.out_avals, strict=True)
    ]
    return primals_out, tangents_out


jp.primitive_jvps[pjit_p] = _pjit_jvp


# --- sharding constraint ---


def _constraint_jvp(primals: Any, tangents: Any, **params: Any) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    out = sharding_constraint_p.bind(x, **params)
    if type(t) is jp.Zero:
        return out, t
    return out, sharding_constraint_p.bind(t, **params)


jp.primitive_jvps[sharding_constraint_p] = _constraint_jvp
