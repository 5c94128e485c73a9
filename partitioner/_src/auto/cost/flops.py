"""The one flop counter: how much floating-point work each equation of a program does.

Why one: AUTO's cost model charges each equation's work to the devices that share
it (``Values.work``, split as the equation's layout splits it), and the pipeline's
microbatch choice prices a whole layer (:func:`program`); both read the same
table (:func:`counted`), so a plan with a pipeline and a plan without one are
priced in the same flops. A ``dot_general`` does ``2 k`` per result element (``k``
the contracted size), a convolution ``2 k`` per result element over its input
features and window, a gather or scatter one per result element; reductions,
windows, cumulative and sorting operations one per element of their operand, a
dynamic update one per element of its update; reshapes, transposes, shifts, constraints
and generators (``iota``, random bits) none; any other operation one per element of
its first result when it is elementwise, of every result otherwise. In a program, a
``scan`` body counts ``length`` times, a ``while`` body (and its condition) its trip
count where the loop counts a literal bound (``equations.trip_count``), a ``cond``
its dearest branch, a call its body once, a manual region (``pmap_region``: its body
runs on each device's blocks) its body once per device of its axis.
"""

from __future__ import annotations

import math
from typing import Any

from ... import jax_private as jp
from .equations import call_body, is_elementwise, shape_of, trip_count

REDUCE_BY_SUM = frozenset({"reduce_sum"})
REDUCE_OTHER = frozenset(
    {"reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "reduce_and", "reduce_or"}
)
#: Operations along one dimension, counted over their operand.
ALONG_AXIS = frozenset(
    {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "rev", "split"}
)
#: Pooling windows, counted over their operand.
WINDOWS = frozenset(
    {"reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
     "select_and_gather_add"}
)  # fmt: skip
#: Operations that move or make values without arithmetic.
NO_WORK = frozenset(
    {"transpose", "reshape", "squeeze", "expand_dims", "iota", "rng_bit_generator",
     "sharding_constraint", "shift"}
)  # fmt: skip

#: A value an equation's work is counted over, and the flops per element of it.
Counted = tuple[Any, float]


def counted(eqn: Any) -> tuple[Counted, ...]:
    """The values ``eqn``'s work is counted over, each with its flops per element (the
    table of the module's docstring); an equation with a body is not counted here."""
    name = eqn.primitive.name
    if name in NO_WORK:
        return ()
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = shape_of(eqn.invars[0])
        return ((eqn.outvars[0], 2.0 * math.prod(lhs[dim] for dim in contract)),)
    if name == "conv_general_dilated":
        _, (_, features, *spatial), _ = _conv_specs(eqn)
        rhs = shape_of(eqn.invars[1])
        return ((eqn.outvars[0], 2.0 * rhs[features] * math.prod(rhs[dim] for dim in spatial)),)
    if name in REDUCE_BY_SUM | REDUCE_OTHER | ALONG_AXIS | WINDOWS:
        return ((eqn.invars[0], 1.0),)
    if name == "select_and_scatter_add":  # over the operand, the pooled input's shape
        return ((eqn.invars[1], 1.0),)
    if name == "dynamic_update_slice":
        return ((eqn.invars[1], 1.0),)
    if is_elementwise(eqn) or name in ("gather", "scatter", "scatter-add"):
        return ((eqn.outvars[0], 1.0),)
    return tuple((out, 1.0) for out in eqn.outvars)


def _conv_specs(eqn: Any) -> tuple[Any, Any, Any]:
    numbers = eqn.params["dimension_numbers"]
    return numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec


def equation(eqn: Any) -> float:
    """``eqn``'s flops on whole values, its bodies included (as :func:`program` counts them)."""
    name = eqn.primitive.name
    if name == "scan":
        return eqn.params["length"] * program(eqn.params["jaxpr"])
    if name == "while":
        params = eqn.params
        return trip_count(eqn) * (program(params["body_jaxpr"]) + program(params["cond_jaxpr"]))
    if name == "cond":
        return max(program(branch) for branch in eqn.params["branches"])
    if name == "pmap_region":
        params = eqn.params
        return int(params["mesh"].shape[params["axis_name"]]) * program(params["body"])
    body = call_body(eqn)
    if body is not None:
        return program(body)
    return sum(per * math.prod(shape_of(value)) for value, per in counted(eqn))


def program(jaxpr: Any) -> float:
    """The flops of a whole program (a ``Jaxpr`` or ``ClosedJaxpr``) on whole values."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, jp.ClosedJaxpr) else jaxpr
    return sum(equation(eqn) for eqn in jaxpr.eqns)
