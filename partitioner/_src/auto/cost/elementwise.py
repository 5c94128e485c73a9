"""Rules for elementwise operations, reductions and shape changes.

Each rule applies one equation to the walk's frame (NOTE [auto cost model] in
``values.py``). Elementwise operations take one operand's layout, whichever moves
the fewest bytes (a partial sum passes through where the operation is linear in
it); reductions over a sharded dimension leave a partial sum (``reduce_sum``) or
all-reduce (max, min, ...); reshapes, transposes and broadcasts carry an axis along
with its dimension. ``rules.py`` registers them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .equations import shape_of
from .flops import REDUCE_BY_SUM
from .layouts import NO_AXES, Axes, Layout, canonical, replicated, shards, used_axes
from .rates import FLOPS_PER_S
from .values import Frame, State, Tally, Values

# --- elementwise ---

# Linear in each operand marked True: a partial sum may pass through (NOTE [auto cost model]).
_LINEAR: dict[str, tuple[bool, ...] | None] = {
    "convert_element_type": (True,),
    "copy": (True,),
    "copy_p": (True,),
}


def project(layout: Layout, shape: Sequence[int]) -> Layout:
    """``layout`` for an operand that broadcasts its size-1 dimensions (never split)."""
    return tuple(() if size == 1 else axes for axes, size in zip(layout, shape, strict=True))


def elementwise(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Every operand the output's shape (a size-1 dimension broadcasts) or a scalar:
    the output takes one operand's layout, or that of a copy of one an earlier
    equation made (NOTE [elementwise reads a copy]), whichever moves the fewest bytes."""
    out = eqn.outvars[0]
    shape = shape_of(out)
    operands = [operand for operand in eqn.invars if len(shape_of(operand)) == len(shape) and shape]
    states = [model.read(frame, operand) for operand in operands]
    copies = [(layout, NO_AXES) for operand in operands for layout in frame.moved.get(operand, ())]
    options = _split_enough(
        [(state[0], NO_AXES) for state in states] + copies + [(replicated(len(shape)), NO_AXES)],
        states + copies,
        model.sizes,
    )
    p_options = _partial_options(eqn, operands, states)

    def kept(
        state: State, layout: Layout, partial: Axes, operand: Any
    ) -> bool:  # a partial operand as is
        return bool(partial) and state == (project(layout, shape_of(operand)), partial)

    best: tuple[tuple[float, int], State] | None = None
    for layout, partial in dict.fromkeys(options + p_options):
        cost = sum(
            model.move_cost(operand, project(layout, shape_of(operand)), frame)
            for operand, state in zip(operands, states, strict=True)
            if not kept(state, layout, partial, operand)
        )
        local = model.local(shape, layout)
        score = (cost + local / FLOPS_PER_S, local)
        if best is None or score < best[0]:
            best = (score, (layout, partial))
    assert best is not None
    layout, partial = best[1]
    for operand, state in zip(operands, states, strict=True):
        if not kept(state, layout, partial, operand):
            model.move(operand, project(layout, shape_of(operand)), frame, tally, mult)
    model.work(eqn, layout, tally, mult)
    for result in eqn.outvars:
        same = shape_of(result) == shape
        model.set(
            frame,
            result,
            (layout, partial) if same else (replicated(len(shape_of(result))), NO_AXES),
        )


def _split_enough(
    options: list[State], states: list[State], sizes: Mapping[str, int]
) -> list[State]:
    """The options that split the output over as many devices as the most split operand
    (or copy of one) that is no partial sum.

    NOTE [elementwise keeps the split]: an elementwise operation's own cost can favour
    gathering a split operand (a residual ``x + f(x)`` whose ``f(x)`` is a partial sum:
    one all-reduce of the sum and a gather of ``x`` is a collective fewer than reducing
    the sum to ``x``'s layout), but the gathered result makes every operation after it
    work on the whole value, a cost this equation cannot see; a stack of such blocks then
    drifts to replicated activations. XLA's propagation keeps the most split operand's
    layout for an elementwise operation, and so does this rule.

    NOTE [elementwise reads a copy]: an operand an earlier equation moved (a partial sum
    reduced and split over the batch, for a consumer that wanted it so) has that copy,
    which XLA reuses: its layout is one of the options, free for that operand, and
    counts as a split of it. Without it, a second consumer of a partial sum whose other
    operands are whole (a layer norm's scale, in its backward pass) reduced it again, to
    whole, over every axis: an all-reduce XLA does not run (on 8 transformer blocks with
    the MLP over both mesh axes, 512 KiB of the model's 3,592 KiB).
    """
    most = max(
        (shards(sorted(used_axes(layout)), sizes) for layout, partial in states if not partial),
        default=1,
    )
    kept = [option for option in options if shards(sorted(used_axes(option[0])), sizes) >= most]
    return kept or options


def _partial_options(eqn: Any, operands: list[Any], states: list[State]) -> list[State]:
    """Output states that keep a partial sum, where the operation is linear in it."""
    if len(operands) != len(eqn.invars) or eqn.primitive.name not in _LINEAR:
        return []
    partials = {state[1] for state in states if state[1]}
    if len(partials) != 1:
        return []
    (partial,) = partials
    carriers = [i for i, state in enumerate(states) if state[1] == partial]
    linear = _LINEAR[eqn.primitive.name]
    layout = states[carriers[0]][0]
    if linear is None:  # sums: every operand a partial sum over the same axes
        return [(layout, partial)] if len(carriers) == len(states) else []
    if eqn.primitive.name == "select_n":  # every case partial alike, the predicate not
        cases_partial = carriers == list(range(1, len(states))) and not (
            used_axes(states[0][0]) & partial
        )
        return [(layout, partial)] if cases_partial else []
    # products: one partial factor, the others whole and not split over the partial sum's axes
    if len(carriers) != 1 or not linear[min(carriers[0], len(linear) - 1)]:
        return []
    if any(used_axes(state[0]) & partial for i, state in enumerate(states) if i != carriers[0]):
        return []
    return [(layout, partial)]


# --- reductions ---


def reduce(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    (operand,) = eqn.invars[:1]
    layout, partial = model.read(frame, operand)
    if partial and eqn.primitive.name not in REDUCE_BY_SUM:
        layout = model.settle(operand, (layout, partial), None, frame, tally, mult)
        partial = NO_AXES
    dims = set(eqn.params.get("axes", ()))
    reduced = frozenset(axis for dim in dims for axis in layout[dim])
    model.work(eqn, layout, tally, mult)
    out_layout = tuple(split for dim, split in enumerate(layout) if dim not in dims)
    out = eqn.outvars[0]
    if eqn.primitive.name in REDUCE_BY_SUM:  # linear: partial sums stay partial
        model.set(frame, out, (out_layout, reduced | partial))
        return
    if reduced:  # max, min, ...: all-reduce the partial results at once
        axes = tuple(sorted(reduced))
        step = ("all-reduce", shards(axes, model.sizes), model.nbytes(out, out_layout))
        model.pay(frame, tally, [(*step, (eqn.primitive.name, axes))], mult)
    model.set(frame, out, (out_layout, NO_AXES))


# --- shapes ---


def broadcast_in_dim(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    operand, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, operand)
    out_shape = shape_of(out)
    dims: list[tuple[str, ...]] = [()] * len(out_shape)
    in_shape = shape_of(operand)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if in_shape[i] == out_shape[d]:
            dims[d] = layout[i]
    model.work(eqn, tuple(dims), tally, mult)
    model.set(frame, out, (tuple(dims), partial))


def transpose(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    operand, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, operand)
    model.set(frame, out, (tuple(layout[d] for d in eqn.params["permutation"]), partial))


def reshape(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """reshape, and squeeze / expand_dims (reshapes that only drop or add size-1 dims):
    each group of dimensions that merge or split carries its axes to its major
    dimension where it can; a group that cannot is gathered first, the others kept."""
    operand, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = model.read(frame, operand)
    mapped = _reshape_layout(shape_of(operand), shape_of(out), layout, model.sizes)
    if mapped is None:  # shapes this rule does not follow: gathered first
        model.move(operand, replicated(len(shape_of(operand))), frame, tally, mult)
        model.set(frame, out, (replicated(len(shape_of(out))), NO_AXES))
        return
    needed, carried = mapped
    if needed != layout:
        model.move(operand, needed, frame, tally, mult)
        partial = NO_AXES
    model.set(frame, out, (canonical(carried, model.order), partial))


def _reshape_groups(
    src: Sequence[int], dst: Sequence[int]
) -> list[tuple[list[int], list[int]]] | None:
    """The groups of dimensions a reshape merges or splits: (source dims, result dims)
    of equal sizes in order; size-1 dimensions at the end join no group. None: the
    shapes do not line up so."""
    groups = []
    i = j = 0
    while i < len(src) and j < len(dst):
        src_group, dst_group = [i], [j]
        src_size, dst_size = src[i], dst[j]
        while src_size != dst_size:
            if src_size < dst_size and i + 1 < len(src):
                i += 1
                src_group.append(i)
                src_size *= src[i]
            elif src_size > dst_size and j + 1 < len(dst):
                j += 1
                dst_group.append(j)
                dst_size *= dst[j]
            else:
                return None
        groups.append((src_group, dst_group))
        i += 1
        j += 1
    if any(size != 1 for size in src[i:]) or any(size != 1 for size in dst[j:]):
        return None
    return groups


def _reshape_layout(
    src: Sequence[int], dst: Sequence[int], layout: Layout, sizes: Mapping[str, int]
) -> tuple[Layout, list[tuple[str, ...]]] | None:
    """The operand's layout the reshape needs and the result's: a group's axes go to
    its major dimension when only its first non-trivial dimension is split (and the
    major dimension takes them); otherwise the group is whole. None: see
    :func:`_reshape_groups`."""
    groups = _reshape_groups(src, dst)
    if groups is None:
        return None
    needed: list[tuple[str, ...]] = [() for _ in src]
    out: list[tuple[str, ...]] = [()] * len(dst)
    for src_group, dst_group in groups:
        axes = [axis for k in src_group for axis in layout[k]]
        if not axes:
            continue
        major = next((k for k in dst_group if dst[k] > 1), dst_group[0])
        sharded = [k for k in src_group if layout[k]]
        first = next((k for k in src_group if src[k] > 1), src_group[0])
        if sharded == [first] and dst[major] % shards(axes, sizes) == 0:
            out[major] = tuple(axes)
            needed[first] = layout[first]
    return tuple(needed), out


def no_operands(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    for out in eqn.outvars:
        model.set(frame, out, (replicated(len(shape_of(out))), NO_AXES))
