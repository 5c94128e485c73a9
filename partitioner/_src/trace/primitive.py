"""The ``pjit`` primitive and its typed parameters.

Why our own primitive (not ``jax.jit``'s): its params carry *our* parsed specs
and mesh, so every transformation rule, the lowering and the dispatch path read
the partitioning from one place and jax's caches (keyed on hashable params) work.

Why a dataclass beside it: jax hands rules the params as a flat keyword dict
(and must see the ``jaxpr`` there, to find sub-jaxprs). Rules read them through
:class:`PjitParams`, which names and types every field and checks the invariants
that tie them together, instead of string lookups and asserts in every rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jax.sharding import Mesh

from .. import jax_private as jp
from ..sharding.parsed import ParsedPartitionSpec
from .params import PrimitiveParams

pjit_p = jp.Primitive("pjit")
pjit_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class PjitParams(PrimitiveParams):
    """The parameters of one ``pjit_p`` equation (all hashable).

    Attributes:
        jaxpr: the ClosedJaxpr of the body (flat inputs, static arguments removed).
        in_axis_resources / out_axis_resources: one ParsedPartitionSpec per flat
            input / output, or None where XLA chooses the layout (residuals, see
            NOTE [residual shardings] in rules/pjit.py).
        mesh: the ``jax.sharding.Mesh`` the call runs over: with its axis types
            when some axis is Explicit (values are then typed with their
            shardings, NOTE [explicit axes] in ``sharding/mesh_env.py``), else its
            Auto twin.
        donated_invars: one bool per flat input: the caller asks to donate it.
        name: the function's name, for the HLO module and messages.
        api: the front door the user called (``"pjit"``, ``"jit"``, ``"pmap"``), so
            messages from the shared layers name what the user wrote.
        committed: its results are committed to their devices (False only for a
            call nothing committed: uncommitted arguments and no mesh).
        compiler_options: ``jit(..., compiler_options=...)`` as sorted ``(name,
            value)`` pairs (hashable), handed to XLA when the body is compiled.

    Invariants (checked at construction): one spec and one donation flag per
    jaxpr input, one spec per jaxpr output.
    """

    primitive: ClassVar[jp.Primitive] = pjit_p
    tuple_fields: ClassVar[tuple[str, ...]] = (
        "in_axis_resources",
        "out_axis_resources",
        "donated_invars",
    )

    jaxpr: jp.ClosedJaxpr
    in_axis_resources: tuple[ParsedPartitionSpec | None, ...]
    out_axis_resources: tuple[ParsedPartitionSpec | None, ...]
    mesh: Mesh
    donated_invars: tuple[bool, ...]
    name: str
    api: str = "pjit"
    committed: bool = True
    compiler_options: tuple[tuple[str, Any], ...] = ()

    def check(self) -> None:
        n_in, n_out = len(self.jaxpr.in_avals), len(self.jaxpr.out_avals)
        if not len(self.in_axis_resources) == len(self.donated_invars) == n_in:
            raise ValueError(
                f"internal error: {self.api} {self.name} has {n_in} inputs but "
                f"{len(self.in_axis_resources)} input specs and {len(self.donated_invars)} "
                "donation flags; please report"
            )
        if len(self.out_axis_resources) != n_out:
            raise ValueError(
                f"internal error: {self.api} {self.name} has {n_out} outputs but "
                f"{len(self.out_axis_resources)} output specs; please report"
            )


def _pjit_abstract_eval(*avals: Any, jaxpr: jp.ClosedJaxpr, **_: Any) -> tuple[Any, Any]:
    return jaxpr.out_avals, jaxpr.effects


pjit_p.def_effectful_abstract_eval(_pjit_abstract_eval)


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
    for field, default in (
        ("api", "pjit"),
        ("committed", True),
        ("compiler_options", ()),
    ):
        if params[field] == default:
            del params[field]
    new_eqn = eqn.replace(params=params)
    return jp.pp_eqn(new_eqn, context, settings)


jp.pp_eqn_rules[pjit_p] = _pjit_pp_rule
