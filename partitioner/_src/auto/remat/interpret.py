"""The one jaxpr interpreter the rewrites share: evaluate a program, some equations replaced.

Why one: every rewrite (a scan's body rematerialized, an unrolled layer recomputed,
jit calls inlined) evaluates the traced program under a new trace, equation by
equation, doing something else at a few of them. Binding constants and inputs,
reading literals, binding an equation under its own context (its sharding and
compute placement) and retracing on the program's own input types are the same
each time, and live here; a rewrite says only what it does at its equations
(:data:`Step`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from ... import jax_private as jp

#: Values by variable, as an interpreted program computes them.
Env = dict[Any, Any]
#: How an interpreted program runs its equation ``index``: from the values so far, the
#: equation's results (``None`` for one left unset, which only a later step reads).
Step = Callable[[int, Any, Env], Sequence[Any]]


def read(env: Env, v: Any) -> Any:
    """A variable's value, or a literal's."""
    return v.val if isinstance(v, jp.Literal) else env[v]


def bind(eqn: Any, ins: Sequence[Any]) -> list[Any]:
    """``eqn`` applied to ``ins`` under the current trace, in the equation's own context
    (its sharding and compute placement)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*ins, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def as_traced(index: int, eqn: Any, env: Env) -> list[Any]:
    """The default :data:`Step`: the equation as traced."""
    return bind(eqn, [read(env, v) for v in eqn.invars])


def environment(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any] | None = None,
    known: Iterable[tuple[Any, Any]] = (),
) -> Env:
    """The values ``jaxpr`` (a ``Jaxpr``) starts from: its constants, and its arguments
    (``args``: all of them, in order; ``known``: some, by variable, with values a part
    of it recomputes from)."""
    env: Env = dict(zip(jaxpr.constvars, consts, strict=True))
    if args is not None:
        env.update(zip(jaxpr.invars, args, strict=True))
    env.update(known)
    return env


def evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], step: Step = as_traced) -> Env:
    """Every value of ``jaxpr`` (a ``Jaxpr``) from its constants and arguments, each
    equation run by ``step``."""
    env = environment(jaxpr, consts, args)
    for index, eqn in enumerate(jaxpr.eqns):
        outs = step(index, eqn, env)
        env.update(
            (v, value) for v, value in zip(eqn.outvars, outs, strict=True) if value is not None
        )
    return env


def run_equations(eqns: Sequence[Any], env: Env) -> Env:
    """``env`` with ``eqns`` (a slice of a program, recomputed) run as traced."""
    for eqn in eqns:
        env.update(zip(eqn.outvars, as_traced(0, eqn, env), strict=True))
    return env


def outputs(jaxpr: Any, env: Env) -> list[Any]:
    """``jaxpr``'s results, read from its evaluated values."""
    return [read(env, v) for v in jaxpr.outvars]


def retraced(closed: Any, run: Callable[..., list[Any]]) -> Any:
    """``run`` (``closed`` evaluated with some equations replaced) traced on ``closed``'s
    input types, weak types kept: a program with the same inputs and outputs."""
    avals = [
        jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
        for aval in closed.in_avals
    ]
    return jax.make_jaxpr(run)(*avals)


def readers_of(jaxpr: Any) -> dict[Any, list[int]]:
    """Per variable of ``jaxpr``, the indices of the equations reading it, in order."""
    readers: dict[Any, list[int]] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, jp.Var):
                readers.setdefault(v, []).append(i)
    return readers


def same_types(body: Any, traced: Any) -> bool:
    """Whether the rewritten ``body`` kept ``traced``'s input and output types (a rewrite
    whose retracing does not keep them is not tried)."""
    return (body.in_avals, body.out_avals) == (traced.in_avals, traced.out_avals)
