"""Equations named by their structure, and AUTO leaves grouped by the layers they sit in.

NOTE [auto repeats]: deep models are stacks of one layer, unrolled (a Python loop
over a list of parameter dicts, flax's ``Block_0``, ``Block_1``...) or scanned. A
scan over stacked parameters has one AUTO leaf per kind of parameter already;
unrolled, every layer has its own. Two AUTO leaves are *tied* (one variable of the
search, so a stack of N layers is searched as one layer) when

- their paths are equal once the layer is left out: sequence indices, keys that
  are numbers and numbers after an underscore in names become ``#``
  (``args[0][3]['wq']`` and ``args[0][5]['wq']``, ``['Block_0']`` and
  ``['Block_1']``; ``'ln1'`` and ``'ln2'`` stay apart, and the argument's position
  is kept, so two positional arguments never tie);
- they have the same type;
- they play the same part in the program: equal labels after a few rounds of
  Weisfeiler-Lehman refinement over the jaxpr (each value's label takes in the
  structure of the equations that make and read it, and their other operands'
  labels, :data:`ROUNDS` equations deep). Layers at the ends of a stack (the
  first, whose input is the batch; the last, feeding the loss) differ within
  that depth and form groups of their own; the layers between tie.

So a 2-layer MLP written as a list of two weights of one shape (whose best
layouts differ: one column-split, one row-split) keeps two variables, and the
search over a deep stack costs a few distinct layers' worth of variables,
whatever its depth.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, KeyPath, SequenceKey, keystr

from ... import jax_private as jp
from ..cost.equations import Structures

#: Refinement rounds: a label takes in the program this many equations around a value.
ROUNDS = 4


def family(path: KeyPath) -> str:
    """``path`` with the layer left out (NOTE [auto repeats])."""
    return keystr(tuple(path[:1])) + "".join(_free(k) for k in path[1:])


def layer_keys(path: KeyPath) -> list[tuple[int, str, str]]:
    """Each key of ``path`` that may name a layer (NOTE [auto repeats]), outermost
    first, as (its position, the stack: the path up to it with the layer left out, the
    layer: the path up to it): ``[0][3]['wq']`` -> ``(1, '[0][#]', '[0][3]')``;
    ``['Block_2']['Dense_0']`` -> ``['Block_#']`` then ``['Block_2']['Dense_#']``. Which
    one is the stack's is for the caller to tell (a ``(params, opt_state)`` tuple's
    index names no layer)."""
    return [
        (k, keystr(tuple(path[:k])) + _free(key), keystr(tuple(path[: k + 1])))
        for k, key in enumerate(path)
        if k and _free(key) != keystr((key,))
    ]


def _free(key: Any) -> str:
    """One key as :func:`family` spells it: an index or a number ``[#]``, a name with
    its layer number left out; other keys as they are."""
    if isinstance(key, (SequenceKey, FlattenedIndexKey)):
        return "[#]"
    if isinstance(key, DictKey):
        return f"[{_layer_free(key.key)!r}]" if isinstance(key.key, str) else "[#]"
    if isinstance(key, GetAttrKey):
        return "." + _layer_free(key.name)
    return keystr((key,))


def _layer_free(name: str) -> str:
    """``Block_3`` -> ``Block_#``, ``3`` -> ``#``; ``w1`` stays ``w1`` (a role, not a layer)."""
    return "#" if name.isdigit() else re.sub(r"_\d+\b", "_#", name)


def labels(jaxpr: Any, structures: Structures, rounds: int = ROUNDS) -> dict[Any, int]:
    """Each top-level value's label after ``rounds`` of refinement (NOTE [auto repeats])."""
    eqns = jaxpr.eqns
    sid = [structures.of(e) for e in eqns]
    label: dict[Any, Any] = {v: ("in", v.aval) for v in jaxpr.invars}
    label.update({v: ("const", v.aval) for v in jaxpr.constvars})
    made: dict[Any, tuple[int, int]] = {}
    read: dict[Any, list[tuple[int, int]]] = {}
    for i, e in enumerate(eqns):
        for k, v in enumerate(e.outvars):
            label[v], made[v] = ("val", v.aval), (i, k)
        for k, v in enumerate(e.invars):
            if not isinstance(v, jp.Literal):
                read.setdefault(v, []).append((i, k))
    outs = {v for v in jaxpr.outvars if not isinstance(v, jp.Literal)}
    for _ in range(rounds):
        at = [
            hash((sid[i], tuple(None if isinstance(v, jp.Literal) else label[v] for v in e.invars)))
            for i, e in enumerate(eqns)
        ]
        label = {
            v: hash((
                old,
                (at[made[v][0]], made[v][1]) if v in made else None,
                tuple(sorted((at[i], k) for i, k in read.get(v, ()))),
                v in outs,
            ))
            for v, old in label.items()
        }  # fmt: skip
    return label


def tie(
    jaxpr: Any, leaves: Sequence[int], families: Sequence[str | None], structures: Structures
) -> list[list[int]]:
    """The AUTO inputs ``leaves`` (positions in ``jaxpr``'s inputs) in groups that share
    a layout (NOTE [auto repeats]), in first-member order."""
    found = labels(jaxpr.jaxpr, structures)
    groups: dict[Any, list[int]] = {}
    for i in leaves:
        v = jaxpr.jaxpr.invars[i]
        key = ("alone", i) if families[i] is None else (families[i], v.aval, found[v])
        groups.setdefault(key, []).append(i)
    return list(groups.values())
