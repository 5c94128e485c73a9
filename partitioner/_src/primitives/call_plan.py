"""A call plan and the planner that makes one: what a front door hands dispatch and the stages.

Why down here: the front doors (``jit``, ``pjit``, ``pmap``) make plans, and
dispatch, the AOT stages, AUTO and the report consume them; with both types below
all of them, imports only ever point down the pipeline, and dispatch talks to any
front door through the one :class:`Planner` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from jax.sharding import Mesh
from jax.tree_util import PyTreeDef, tree_unflatten

from .. import jax_private as jp
from ..trace.arguments import Binding, FlatArguments
from .auto_pipeline import AutoPipelineSite
from .pjit_call import PjitParams

if TYPE_CHECKING:  # the AUTO stage's record, loaded with that stage (``lazy.py``)
    from .auto_choice import AutoChoice


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
    # ``jit(inline=True)`` with no specs: inside another trace the body's equations
    # join that trace instead of one ``pjit_p`` call (as jax.jit inlines).
    inline: bool = False
    # The AUTO pipelines the body calls, as their marks say: the call chooses its whole
    # plan (NOTE [pipeline decision] in ``trace/decision.py``).
    auto_pipelines: tuple[AutoPipelineSite, ...] = ()

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
        if self.inline and not jp.at_top_level():
            outs = jp.eval_closed_jaxpr(self.params.jaxpr, *self.args_flat)
            return tree_unflatten(self.out_tree, outs)
        bind = self.nested_bind or self.params.bind
        return tree_unflatten(self.out_tree, bind(*self.args_flat))


class Planner(Protocol):
    """What a front door gives the dispatcher and the stages (jax's ``stages.Wrapped`` role).

    ``name`` / ``fun``: the function (for jaxlib's dispatcher and messages);
    ``binding``: how its calls bind (statics, donation; ``trace/arguments.py``);
    ``plan``: one call's :class:`CallPlan` (checks, trace, specs); ``eager``: what a
    call runs under ``jax.disable_jit()``; ``wrap_call``: the callable users call,
    around jaxlib's (the identity, except for a multi-process pmap's local slices).
    """

    @property
    def name(self) -> str: ...

    @property
    def fun(self) -> Callable[..., Any]: ...

    @property
    def binding(self) -> Binding: ...

    @property
    def eager(self) -> Callable[..., Any]: ...

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan: ...

    def wrap_call(self, call: Callable[..., Any]) -> Callable[..., Any]: ...


class PlannerFromInfo:
    """The part of a :class:`Planner` read from its options record ``self.info``.

    Every front door's planner is a frozen record (``info``: ``name``, ``fun``,
    ``binding``) plus free functions, so ``name``, ``fun`` and ``binding`` are the
    same three reads for all of them; a planner subclasses this and adds ``eager``,
    ``plan`` and ``wrap_call``.
    """

    info: Any

    @property
    def name(self) -> str:
        return str(self.info.name)

    @property
    def fun(self) -> Callable[..., Any]:
        return self.info.fun  # type: ignore[no-any-return]

    @property
    def binding(self) -> Binding:
        return self.info.binding  # type: ignore[no-any-return]
