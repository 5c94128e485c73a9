"""The ``pjit`` primitive: what a partitioned call looks like inside a jaxpr.

Why our own primitive (not ``jax.jit``'s): its params carry *our* parsed specs
and mesh, so every transformation rule, the lowering and the dispatch path read
the partitioning from one place and jax's caches (keyed on hashable params) work.

Params (all hashable):
    jaxpr: the ClosedJaxpr of the body (inputs are flat, static args removed).
    in_axis_resources / out_axis_resources: one ParsedPartitionSpec per flat
        input / output, or None where XLA chooses the layout (residuals, see
        NOTE [residual shardings] in rules/partial_eval.py).
    mesh: the Auto-typed ``jax.sharding.Mesh`` the call runs over.
    donated_invars: one bool per flat input.
    name: the function's name, for HLO module and error messages.
"""

from __future__ import annotations

from typing import Any

from ..jax_private import core

pjit_p = core.Primitive("pjit")
pjit_p.multiple_results = True


def _pjit_abstract_eval(*avals: Any, jaxpr: core.ClosedJaxpr, **_: Any) -> tuple[Any, Any]:
    return jaxpr.out_avals, jaxpr.effects


pjit_p.def_effectful_abstract_eval(_pjit_abstract_eval)


def _pjit_impl(*args: Any, **params: Any) -> list[Any]:
    # Imported lazily: dispatch imports lowering and compilation, which import
    # this module for the primitive itself.
    from ..dispatch.execute import call_impl

    return call_impl(args, **params)


pjit_p.def_impl(_pjit_impl)


def _pjit_pp_rule(eqn: Any, context: Any, settings: Any) -> Any:
    # Show specs as the user would write them, not the parsed tuples.
    params = dict(eqn.params)

    def show(specs: Any) -> tuple[Any, ...]:
        return tuple("UNSPECIFIED" if s is None else s.to_partition_spec() for s in specs)

    params["in_axis_resources"] = show(params["in_axis_resources"])
    params["out_axis_resources"] = show(params["out_axis_resources"])
    params["mesh"] = dict(params["mesh"].shape)
    if not any(params["donated_invars"]):
        del params["donated_invars"]
    new_eqn = eqn.replace(params=params)
    return core._pp_eqn(new_eqn, context, settings)


core.pp_eqn_rules[pjit_p] = _pjit_pp_rule
