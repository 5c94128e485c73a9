"""The cost model's rules, one per primitive, registered in one place.

A *rule* applies one equation to the walk's frame (``values.Rule``: it picks the
layouts its operands move to, pays the moves and the work, sets its results'
states, and returns the peak bytes of its inner temporaries). They are defined by
kind of operation (``contractions.py``, ``elementwise.py``, ``slices.py``,
``control.py``) and wired to primitive names here, as ``_src/registry.py`` wires
partitioner's primitives to jax: "which rule does the model apply to ``gather``" is
one table to read. :func:`rule_for` adds the rules that depend on an equation's
params (constraints, our own pjit, calls); an elementwise operation the table does
not name takes :func:`elementwise.elementwise`, any other one gathers its operands
(``Values.gather_all``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ...primitives.constraint import constraint_spec
from ...primitives.pjit_call import pjit_p
from . import contractions, control, elementwise, slices
from .equations import call_body, is_elementwise, shape_of
from .flops import ALONG_AXIS, REDUCE_BY_SUM, REDUCE_OTHER, WINDOWS
from .layouts import NO_AXES, Layout, canonical, replicated, used_axes
from .values import Frame, Rule, Tally, Values, no_peak, spec_layout

RULES: Mapping[str, Rule] = {
    # contractions
    "dot_general": no_peak(contractions.dot_general),
    "conv_general_dilated": no_peak(contractions.conv),
    "gather": no_peak(contractions.gather),
    "scatter": no_peak(contractions.scatter),
    "scatter-add": no_peak(contractions.scatter),
    # reductions and shapes
    **{name: no_peak(elementwise.reduce) for name in REDUCE_BY_SUM | REDUCE_OTHER},
    "broadcast_in_dim": no_peak(elementwise.broadcast_in_dim),
    "transpose": no_peak(elementwise.transpose),
    "reshape": no_peak(elementwise.reshape),
    "squeeze": no_peak(elementwise.reshape),
    "expand_dims": no_peak(elementwise.reshape),
    "iota": no_peak(elementwise.no_operands),
    "rng_bit_generator": no_peak(elementwise.no_operands),
    # windows, slices, updates, operations along a dimension
    **{name: no_peak(slices.window) for name in WINDOWS},
    "select_and_scatter_add": no_peak(slices.select_and_scatter_add),
    **{name: no_peak(slices.sliced) for name in ("slice", "pad", "concatenate", "dynamic_slice")},
    "dynamic_update_slice": no_peak(slices.dynamic_update_slice),
    "shift": no_peak(slices.shift),
    "auto_pipeline": no_peak(elementwise.no_operands),  # a mark: no values, no work
    # top_k: XLA gathers its operand whole, whichever dimension is split (the default).
    **{name: no_peak(slices.along_axis) for name in ALONG_AXIS},
    # loops and branches
    "scan": control.scan,
    "while": control.while_loop,
    "cond": control.cond,
}


def rule_for(eqn: Any, model: Values) -> Rule:
    """How the walk applies ``eqn`` (NOTE [auto cost model] in ``values.py``)."""
    prim = eqn.primitive
    name = prim.name
    ndim = len(shape_of(eqn.outvars[0])) if eqn.outvars else 0
    if prim is pjit_p:
        return control.pinned_call
    spec = constraint_spec(eqn)
    if spec is not None:  # ours, or jax's own over another mesh's axes: replicated
        foreign = any(axis not in model.sizes for dim in spec.partitions for axis in dim)
        layout = replicated(ndim) if foreign else spec_layout(spec, ndim, model.order)
        open_dims = frozenset() if foreign else frozenset(spec.unconstrained_dims)
        return functools.partial(_fixed, layout=layout, open_dims=open_dims)
    rule = RULES.get(name)
    if rule is not None:
        return rule
    body = call_body(eqn)
    if body is not None:
        return functools.partial(control.call, body=body)
    return no_peak(elementwise.elementwise if is_elementwise(eqn) else Values.gather_all)


def _fixed(
    model: Values,
    eqn: Any,
    frame: Frame,
    tally: Tally,
    mult: float,
    layout: Layout,
    open_dims: frozenset[int],
) -> float:
    """A sharding constraint: its operand moves to ``layout``, but for its UNCONSTRAINED
    dimensions (``open_dims``), which keep the axes the operand has there (those the
    constrained ones do not take): XLA's partitioners propagate through an open
    dimension rather than gather it, so a stacked parameter constrained over the stages
    alone (a pipeline's staging) keeps its split of the rest."""
    operand = eqn.invars[0]
    if open_dims:
        current = model.read(frame, operand)[0]
        taken = used_axes(layout)
        layout = canonical(
            [
                [axis for axis in current[dim] if axis not in taken] if dim in open_dims else axes
                for dim, axes in enumerate(layout)
            ],
            model.order,
        )
    model.move(operand, layout, frame, tally, mult)
    model.set(frame, eqn.outvars[0], (layout, NO_AXES))
    return 0.0
