"""A call plan: what a front door hands the dispatcher and the AOT stages.

Why its own module: the front doors (``pjit``, later ``pmap``) build plans, and
dispatch and ``stages`` consume them; with the type down here, below all three,
imports only ever point down the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import PyTreeDef, tree_unflatten

from ..sharding.auto import AutoChoice
from ..trace.arguments import FlatArguments
from .pjit_call import PjitParams


@dataclass(frozen=True)
class CallPlan:
    """Everything one call (or ``.lower``) needs, computed from its arguments."""

    params: PjitParams
    args_flat: tuple[Any, ...]  # tracer constants first, then the dynamic leaves
    in_tree: PyTreeDef  # of (dynamic positional args, dynamic kwargs)
    out_tree: PyTreeDef
    in_avals: tuple[Any, ...]  # of the dynamic leaves
    num_consts: int  # leading inputs that are values of an enclosing trace
    # How a call nested in another front door's body binds instead of pjit_p (a
    # pmap inside a pmap binds its region, which the outer map places).
    nested_bind: Callable[..., Any] | None = None
    # The dynamic leaves with the paths the user wrote (messages name them).
    arguments: FlatArguments | None = None
    # How the AUTO leaves were resolved (``_src/auto/``), for the report; None without AUTO.
    auto: AutoChoice | None = None

    @property
    def mesh(self) -> Mesh:
        return self.params.mesh

    @property
    def api(self) -> str:
        """``"pjit f"`` / ``"pmap f"``: how messages name what the user called."""
        return f"{self.params.api} {self.params.name}"

    def where(self, i: int) -> str:
        """How a message names flat input ``i`` of the call (constants first)."""
        j = i - self.num_consts
        if self.arguments is None or not 0 <= j < len(self.arguments.paths):
            return f"{self.api}: argument {j} (flat)"
        return self.arguments.where(j, self.api)

    def bind(self) -> Any:
        """Bind ``pjit_p`` (staged under a trace, else run by its impl); the output pytree."""
        bind = self.nested_bind or self.params.bind
        return tree_unflatten(self.out_tree, bind(*self.args_flat))
