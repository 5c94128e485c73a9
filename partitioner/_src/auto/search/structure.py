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
    return keystr(tuple(path[:1])) + "".join(_free(key) for key in path[1:])


def families(paths: Sequence[KeyPath], avals: Sequence[Any]) -> list[str]:
    """Each path's :func:`family`, a parameter's companions taking the parameter's.

    NOTE [auto companions]: an optimizer keeps, per parameter, state of the same shape
    that it updates elementwise with it (Adam's moments ``mu`` and ``nu``, momentum):
    ``[1][0].mu['blocks']['w1']`` beside ``[0]['blocks']['w1']``. Laid out otherwise than
    its parameter, every step moves it to the parameter's layout and back; the user's
    hand plans (FSDP, Megatron, pipelines) lay it out as the parameter. So a leaf whose
    trailing names (``['blocks']['w1']``), shape and dtype are another's with a shorter
    path moves with it in the search's first phase, over whole families: a third of an
    Adam step's variables. They stay apart as groups (their labels differ), so where
    the search refines groups a moment may still take a layout of its own.
    """
    found = [family(path) for path in paths]
    roles: dict[tuple[Any, ...], list[int]] = {}
    for k, (path, aval) in enumerate(zip(paths, avals, strict=True)):
        names = _trailing_names(path)
        if names:
            roles.setdefault((names, tuple(aval.shape), aval.dtype), []).append(k)
    for members in roles.values():
        leader = min(members, key=lambda k: (len(paths[k]), k))
        for k in members:
            found[k] = found[leader]
    return found


def _trailing_names(path: KeyPath) -> tuple[str, ...]:
    """The names (dict keys, attributes) that end ``path``, in order: a leaf's role."""
    names: list[str] = []
    for key in reversed(path):
        if isinstance(key, DictKey) and isinstance(key.key, str):
            names.append(key.key)
        elif isinstance(key, GetAttrKey) and not names:
            names.append(key.name)
        else:
            break
    return tuple(reversed(names))


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
    structure_ids = [structures.of(eqn) for eqn in eqns]
    label: dict[Any, Any] = {var: ("in", var.aval) for var in jaxpr.invars}
    label.update({var: ("const", var.aval) for var in jaxpr.constvars})
    made: dict[Any, tuple[int, int]] = {}
    read: dict[Any, list[tuple[int, int]]] = {}
    for i, eqn in enumerate(eqns):
        for k, var in enumerate(eqn.outvars):
            label[var], made[var] = ("val", var.aval), (i, k)
        for k, var in enumerate(eqn.invars):
            if not isinstance(var, jp.Literal):
                read.setdefault(var, []).append((i, k))
    outs = {var for var in jaxpr.outvars if not isinstance(var, jp.Literal)}
    for _ in range(rounds):
        eqn_labels = [
            hash((structure_ids[i],
                  tuple(None if isinstance(var, jp.Literal) else label[var] for var in eqn.invars)))
            for i, eqn in enumerate(eqns)
        ]  # fmt: skip
        label = {
            var: hash((
                old,
                (eqn_labels[made[var][0]], made[var][1]) if var in made else None,
                tuple(sorted((eqn_labels[i], k) for i, k in read.get(var, ()))),
                var in outs,
            ))
            for var, old in label.items()
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
        var = jaxpr.jaxpr.invars[i]
        key = ("alone", i) if families[i] is None else (families[i], var.aval, found[var])
        groups.setdefault(key, []).append(i)
    return list(groups.values())
