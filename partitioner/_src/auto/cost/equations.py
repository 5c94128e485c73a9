"""What the cost model reads off one equation of a jaxpr: shapes, item sizes, its kind,
its structure.

Pure functions of the traced program, shared by the flop counter (``flops.py``),
the values' vocabulary (``values.py``), the rules and the walk's memo: none of them
depends on a layout. The search ties equal layers by the same structures
(``search/structure.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ... import jax_private as jp


def shape_of(v: Any) -> tuple[int, ...]:
    return getattr(v.aval, "shape", ())  # a tuple already: no copy on this hot path


def itemsize_of(v: Any) -> int:
    """Bytes per element of a variable (:func:`aval_itemsize` of its aval)."""
    return aval_itemsize(v.aval)


def aval_itemsize(aval: Any) -> int:
    """Bytes per element; an extended dtype (a typed key) counts its physical words."""
    if getattr(aval, "dtype", None) is None:
        return 0
    if jp.is_extended(aval):
        physical = jp.physical_aval(aval)
        extra = math.prod(physical.shape[len(aval.shape) :])
        return int(physical.dtype.itemsize * extra)
    return int(aval.dtype.itemsize)


def is_elementwise(eqn: Any) -> bool:
    """Every output the first one's shape; every operand that shape (size-1 dimensions
    broadcasting) or a scalar."""
    if not eqn.outvars:
        return False
    shape = shape_of(eqn.outvars[0])
    return all(shape_of(out) == shape for out in eqn.outvars) and all(
        shape_of(operand) == () or _broadcasts(shape_of(operand), shape) for operand in eqn.invars
    )


def _broadcasts(src: Sequence[int], dst: Sequence[int]) -> bool:
    return len(src) == len(dst) and all(
        size in (target, 1) for size, target in zip(src, dst, strict=True)
    )


def call_body(eqn: Any) -> Any:
    """The jaxpr a call-like equation runs on its operands (pjit, remat, custom
    derivatives, closed calls), or None."""
    for value in eqn.params.values():
        jaxpr = value.jaxpr if isinstance(value, jp.ClosedJaxpr) else value
        if (
            isinstance(jaxpr, jp.Jaxpr)
            and len(jaxpr.invars) == len(eqn.invars)
            and len(jaxpr.outvars) == len(eqn.outvars)
        ):
            return value
    return None


def trip_count(eqn: Any) -> int:
    """The trips of a ``while`` that counts ``i`` from a literal up to a literal bound by
    one (``fori_loop`` with a traced body), else 1 (unknown: counted once)."""
    params = eqn.params
    n_cond_consts, n_body_consts = params["cond_nconsts"], params["body_nconsts"]
    cond, body = params["cond_jaxpr"].jaxpr, params["body_jaxpr"].jaxpr
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return 1
    counter, bound = cond.eqns[0].invars
    if not isinstance(bound, jp.Literal) or counter not in cond.invars[n_cond_consts:]:
        return 1
    k = cond.invars[n_cond_consts:].index(counter)
    start = eqn.invars[n_cond_consts + n_body_consts + k]
    if not isinstance(start, jp.Literal):
        return 1
    carried = body.invars[n_body_consts + k]
    for body_eqn in body.eqns:
        if (
            body_eqn.outvars
            and body_eqn.outvars[0] is body.outvars[k]
            and body_eqn.primitive.name == "add"
        ):
            one = [operand for operand in body_eqn.invars if operand is not carried]
            if len(one) == 1 and isinstance(one[0], jp.Literal) and int(one[0].val) == 1:
                return max(int(bound.val) - int(start.val), 0)
    return 1


class Structures:
    """Small ints naming equations' structures: the primitive, its params (bodies by
    their text, which names variables canonically) and its operands' and results'
    types; equal for the equations of equal layers (NOTE [auto walk memo])."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self._texts: dict[int, tuple[Any, str]] = {}  # id(jaxpr) -> (jaxpr, its text)

    def of(self, eqn: Any) -> int:
        params = tuple(sorted((name, self._param(value)) for name, value in eqn.params.items()))
        ins = tuple((isinstance(value, jp.Literal), value.aval) for value in eqn.invars)
        outs = tuple((isinstance(value, jp.DropVar), value.aval) for value in eqn.outvars)
        return self._ids.setdefault((eqn.primitive, params, ins, outs), len(self._ids))

    def _param(self, value: Any) -> Any:
        if isinstance(value, (jp.ClosedJaxpr, jp.Jaxpr)):
            known = self._texts.get(id(value))
            if known is None:  # the jaxpr is kept so that its id is not reused
                known = self._texts[id(value)] = (value, str(value))
            return ("jaxpr", known[1])
        if isinstance(value, (tuple, list)):
            return tuple(self._param(item) for item in value)
        if callable(value) and not isinstance(value, type):
            return "fn"  # the model never calls a param (jvp and transpose thunks)
        try:
            hash(value)
        except TypeError:
            return ("id", id(value))
        return value
