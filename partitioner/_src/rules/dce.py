"""Dead-code elimination inside a pjit: prune unused outputs and the inputs they needed."""

from __future__ import annotations

from typing import Any

from .. import jax_private as jp
from ..trace.primitive import PjitParams, pjit_p
from ._common import cache_per_jaxpr, keep_where


@cache_per_jaxpr
def _dce_body(jaxpr: Any, used_outputs: tuple[bool, ...]) -> tuple[Any, list[bool]]:
    body, used_inputs = jp.dce_jaxpr(jaxpr.jaxpr, used_outputs)
    return jp.ClosedJaxpr(body, jaxpr.consts), used_inputs


def _pjit_dce(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    if not any(used_outputs) and not jp.has_effects(eqn):
        return [False] * len(eqn.invars), None
    params = PjitParams.of(eqn.params)
    pruned_jaxpr, used_inputs = _dce_body(params.jaxpr, tuple(used_outputs))
    pruned = params.replace(
        jaxpr=pruned_jaxpr,
        in_axis_resources=keep_where(params.in_axis_resources, used_inputs),
        out_axis_resources=keep_where(params.out_axis_resources, used_outputs),
        donated_invars=keep_where(params.donated_invars, used_inputs),
    )
    new_invars = keep_where(eqn.invars, used_inputs)
    new_eqn = jp.new_jaxpr_eqn(
        list(new_invars),
        list(keep_where(eqn.outvars, used_outputs)),
        pjit_p,
        pruned.as_kwargs(),
        jp.eqn_effects(pruned_jaxpr, new_invars),
        eqn.source_info,
        eqn.ctx,
    )
    return used_inputs, new_eqn


jp.dce_rules[pjit_p] = _pjit_dce
