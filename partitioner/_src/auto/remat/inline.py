"""Jit calls inlined, so that a scan differentiated inside one is found (NOTE [auto remat]).

A loss written as a jitted function (``jax.jit`` or a nested ``partitioner.jit``) and
differentiated by ``jax.grad`` puts its forward scan in one call and its backward
scan in another; neither call, as an equation, is a differentiated scan. A call that
gives its operands and results no layout, donates nothing and asks for no compiler
option is the same program to XLA with its body in place, so it is replaced by it.
"""

from __future__ import annotations

from typing import Any

from ... import jax_private as jp
from ...primitives.pjit_call import PjitParams, pjit_p
from .interpret import Env, as_traced, evaluate, outputs, read, retraced


def inlined(closed: Any) -> Any:
    """``closed`` with every jit call that asks for nothing of its own (``_inlinable``)
    replaced by its body, recursively; ``closed`` itself where there is none."""
    if not any(_inlinable(eqn) for eqn in closed.jaxpr.eqns):
        return closed
    return retraced(closed, lambda *args: _entered(closed, args))


def _entered(closed: Any, args: Any) -> list[Any]:
    """``closed`` evaluated on ``args``, inlinable calls entered (their bodies evaluated
    in place of the call)."""

    def step(index: int, eqn: Any, env: Env) -> list[Any]:
        if _inlinable(eqn):
            return _entered(eqn.params["jaxpr"], [read(env, v) for v in eqn.invars])
        return as_traced(index, eqn, env)

    return outputs(closed.jaxpr, evaluate(closed.jaxpr, closed.consts, args, step))


def _inlinable(eqn: Any) -> bool:
    """A ``jax.jit`` call, or a nested ``partitioner.jit``/``pjit`` one, that asks for no
    layout, donation or compiler option: its body inlined is the same program to XLA."""
    if eqn.primitive is pjit_p:
        params = PjitParams.of(eqn.params)
        free = all(spec is None for spec in (*params.in_axis_resources, *params.out_axis_resources))
        return free and not params.compiler_options and not any(params.donated_invars)
    return eqn.primitive.name == "jit" and jp.gives_no_layout(eqn)
