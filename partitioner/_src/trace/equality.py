"""When two jaxprs are the same program: structural equality up to variable names.

Why: the same body reaches the executable cache as different jaxpr objects, e.g.
``jax.vmap`` of a pjit-ed ``f`` (our batching rule batches ``f``'s jaxpr) and a
pjit of ``jax.vmap(f)`` (traced afresh). Equal programs with equal layouts must
share one executable (NOTE [executable cache]).

The comparison is exact and conservative: equations must use the same primitive
objects with equal params (sub-jaxprs compared the same way, other values by
``==`` where that gives a plain bool, else by identity), literals must be equal
values of equal types, constants must be the very same objects, and variables must
correspond one to one with avals that lower alike (:func:`lowered_type`). Anything
it cannot compare counts as different, which only costs a compile.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import jax_private as jp


def lowered_type(aval: Any) -> Any:
    """``aval`` as it lowers: untyped where its type names an all-Auto mesh and no axis.

    jax types a value committed to an all-Auto mesh over that mesh, no axis in its
    spec (``float32[8,2]`` either way), and lowers it as the untyped value. So a
    call on such values and the same call on numpy values trace apart (the body
    can read ``jax.typeof``) but are one program, and share one executable.
    """
    sharding = getattr(aval, "sharding", None)
    if sharding is None or not sharding.mesh.are_all_axes_auto:
        return aval
    spec = sharding.spec
    if any(p is not None for p in spec) or spec.unreduced or spec.reduced:
        return aval
    return aval.update(sharding=None)


def closed_jaxprs_equal(a: Any, b: Any) -> bool:
    """Whether ClosedJaxprs ``a`` and ``b`` are the same program (see the module docstring)."""
    if a is b:
        return True
    if len(a.consts) != len(b.consts) or any(x is not y for x, y in zip(a.consts, b.consts)):
        return False
    return _jaxprs_equal(a.jaxpr, b.jaxpr)


def _jaxprs_equal(a: Any, b: Any) -> bool:
    env: dict[Any, Any] = {}

    def bind(xs: Any, ys: Any) -> bool:
        if len(xs) != len(ys):
            return False
        for x, y in zip(xs, ys):
            if lowered_type(x.aval) != lowered_type(y.aval):
                return False
            env[x] = y
        return True

    def same_atom(x: Any, y: Any) -> bool:
        if isinstance(x, jp.Literal) or isinstance(y, jp.Literal):
            return (
                isinstance(x, jp.Literal)
                and isinstance(y, jp.Literal)
                and x.aval == y.aval
                and _values_equal(x.val, y.val)
            )
        return env.get(x) is y

    if not (bind(a.constvars, b.constvars) and bind(a.invars, b.invars)):
        return False
    if len(a.eqns) != len(b.eqns) or a.effects != b.effects:
        return False
    for ea, eb in zip(a.eqns, b.eqns):
        if ea.primitive is not eb.primitive or len(ea.invars) != len(eb.invars):
            return False
        if not all(same_atom(x, y) for x, y in zip(ea.invars, eb.invars)):
            return False
        if not _params_equal(ea.params, eb.params) or not bind(ea.outvars, eb.outvars):
            return False
    return len(a.outvars) == len(b.outvars) and all(
        same_atom(x, y) for x, y in zip(a.outvars, b.outvars)
    )


def _params_equal(pa: dict[str, Any], pb: dict[str, Any]) -> bool:
    return pa.keys() == pb.keys() and all(_values_equal(pa[k], pb[k]) for k in pa)


def _values_equal(x: Any, y: Any) -> bool:
    if x is y:
        return True
    if isinstance(x, jp.ClosedJaxpr) and isinstance(y, jp.ClosedJaxpr):
        return closed_jaxprs_equal(x, y)
    if isinstance(x, jp.Jaxpr) and isinstance(y, jp.Jaxpr):
        return _jaxprs_equal(x, y)
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return (
            type(x) is type(y)
            and len(x) == len(y)
            and all(_values_equal(u, v) for u, v in zip(x, y))
        )
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and x.shape == y.shape
            and bool(np.array_equal(x, y))
        )
    if type(x) is not type(y):
        return False
    try:
        same = x == y
    except Exception:
        return False
    return bool(same) if isinstance(same, (bool, np.bool_)) else False
