"""Per-primitive strategies of the cost model (NOTE [auto cost model] in ``cost.py``).

Each function applies one equation to the walk's frame: it picks the layouts the
operands move to, pays the moves and the work, and sets the results' states. They
register in ``cost.HANDLERS`` by primitive name, each right after its definition.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .. import jax_private as jp
from .cost import (
    ALONG_AXIS,
    FLOPS_PER_S,
    HANDLERS,
    NO_AXES,
    REDUCE_BY_SUM,
    REDUCE_OTHER,
    Estimator,
    Frame,
    Tally,
    shape_of,
)
from .layouts import Axes, Layout, canonical, fits, replicated, shards


def _dot_general(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    lhs, rhs = eqn.invars
    out = eqn.outvars[0]
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lshape, rshape = shape_of(lhs), shape_of(rhs)
    lfree = [d for d in range(len(lshape)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rshape)) if d not in rc and d not in rb]
    lstate, rstate = est.read(frame, lhs), est.read(frame, rhs)
    # The roles each mesh axis may take, suggested by where the operands put it.
    roles: dict[str, list[tuple[str, int]]] = {}
    for a in est.order:
        if est.sizes[a] == 1:
            continue
        found: list[tuple[str, int]] = [("none", -1)]
        for d, on in enumerate(lstate[0]):
            if a in on:
                found.append(_role(d, lb, lc, lfree, "l"))
        for d, on in enumerate(rstate[0]):
            if a in on:
                found.append(_role(d, rb, rc, rfree, "r"))
        roles[a] = list(dict.fromkeys(found))
    contract_size = math.prod(lshape[d] for d in lc)
    out_shape = shape_of(out)
    best: tuple[float, float, Layout, Layout, Layout, Axes] | None = None
    axes = list(roles)
    for combo in itertools.product(*(roles[a] for a in axes)):
        ldims: list[list[str]] = [[] for _ in lshape]
        rdims: list[list[str]] = [[] for _ in rshape]
        odims: list[list[str]] = [[] for _ in out_shape]
        partial: set[str] = set()
        for a, (kind, k) in zip(axes, combo, strict=True):
            if kind == "batch":
                ldims[lb[k]].append(a)
                rdims[rb[k]].append(a)
                odims[k].append(a)
            elif kind == "contract":
                ldims[lc[k]].append(a)
                rdims[rc[k]].append(a)
                partial.add(a)
            elif kind == "lfree":
                ldims[lfree[k]].append(a)
                odims[len(lb) + k].append(a)
            elif kind == "rfree":
                rdims[rfree[k]].append(a)
                odims[len(lb) + len(lfree) + k].append(a)
        lay_l, lay_r, lay_o = (canonical(x, est.order) for x in (ldims, rdims, odims))
        if not (fits(lshape, lay_l, est.sizes) and fits(rshape, lay_r, est.sizes)):
            continue
        comm = est.move_cost(lhs, lay_l, frame) + est.move_cost(rhs, lay_r, frame)
        used = [a for a, (kind, _) in zip(axes, combo, strict=True) if kind != "none"]
        flops = 2.0 * math.prod(out_shape) * contract_size / shards(used, est.sizes)
        score = comm + flops / FLOPS_PER_S
        if best is None or (score, -len(used)) < (best[0], best[1]):
            best = (score, -len(used), lay_l, lay_r, lay_o, frozenset(partial))
    if best is None:  # nothing splits evenly: compute replicated
        best = (
            0.0,
            0.0,
            replicated(len(lshape)),
            replicated(len(rshape)),
            replicated(len(out_shape)),
            NO_AXES,
        )
    _, _, lay_l, lay_r, lay_o, summed = best
    est.move(lhs, lay_l, frame, tally, mult)
    est.move(rhs, lay_r, frame, tally, mult)
    local_out = est.local(out_shape, lay_o)
    local_contract = contract_size / shards(sorted(summed), est.sizes)
    tally.flops += 2.0 * local_out * local_contract * mult
    est.set(frame, out, (lay_o, summed))


HANDLERS["dot_general"] = _dot_general


def _role(
    d: int, batch: Sequence[int], contract: Sequence[int], free: Sequence[int], side: str
) -> tuple[str, int]:
    if d in batch:
        return ("batch", list(batch).index(d))
    if d in contract:
        return ("contract", list(contract).index(d))
    return (side + "free", list(free).index(d))


def _reduce(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    (v,) = eqn.invars[:1]
    layout, partial = est.read(frame, v)
    if partial and eqn.primitive.name not in REDUCE_BY_SUM:
        layout = est.settle(v, (layout, partial), None, frame, tally, mult)
        partial = NO_AXES
    axes = set(eqn.params.get("axes", ()))
    reduced = frozenset(a for d in axes for a in layout[d])
    est.work(v, layout, tally, mult)
    out_layout = tuple(x for d, x in enumerate(layout) if d not in axes)
    out = eqn.outvars[0]
    if eqn.primitive.name in REDUCE_BY_SUM:  # linear: partial sums stay partial
        est.set(frame, out, (out_layout, reduced | partial))
        return
    if reduced:  # max, min, ...: all-reduce the partial results at once
        tally.pay(
            [("all-reduce", shards(sorted(reduced), est.sizes), est.nbytes(out, out_layout))], mult
        )
    est.set(frame, out, (out_layout, NO_AXES))


HANDLERS.update({n: _reduce for n in REDUCE_BY_SUM | REDUCE_OTHER})


def _broadcast_in_dim(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = est.read(frame, v)
    out_shape = shape_of(out)
    dims: list[tuple[str, ...]] = [()] * len(out_shape)
    in_shape = shape_of(v)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if in_shape[i] == out_shape[d]:
            dims[d] = layout[i]
    est.work(out, tuple(dims), tally, mult)
    est.set(frame, out, (tuple(dims), partial))


HANDLERS["broadcast_in_dim"] = _broadcast_in_dim


def _transpose(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = est.read(frame, v)
    est.set(frame, out, (tuple(layout[d] for d in eqn.params["permutation"]), partial))


HANDLERS["transpose"] = _transpose


def _reshape(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = est.read(frame, v)
    mapped = _reshape_layout(shape_of(v), shape_of(out), layout, est.sizes)
    if mapped is None:  # axes a reshape cannot carry: gathered first
        est.move(v, replicated(len(shape_of(v))), frame, tally, mult)
        est.set(frame, out, (replicated(len(shape_of(out))), NO_AXES))
        return
    est.set(frame, out, (canonical(mapped, est.order), partial))


HANDLERS["reshape"] = _reshape


def _reshape_layout(
    src: Sequence[int], dst: Sequence[int], layout: Layout, sizes: Mapping[str, int]
) -> list[tuple[str, ...]] | None:
    """Carry each split dimension's axes to the major dimension of its group, or None."""
    out: list[tuple[str, ...]] = [()] * len(dst)
    i = j = 0
    while i < len(src) or j < len(dst):
        gi, gj = [i], [j]
        if i >= len(src) or j >= len(dst):
            rest_i = src[i:]
            rest_j = dst[j:]
            if any(n != 1 for n in rest_i) or any(n != 1 for n in rest_j):
                return None
            if any(layout[k] for k in range(i, len(src))):
                return None
            break
        a, b = src[i], dst[j]
        while a != b:
            if a < b:
                i += 1
                if i >= len(src):
                    return None
                gi.append(i)
                a *= src[i]
            else:
                j += 1
                if j >= len(dst):
                    return None
                gj.append(j)
                b *= dst[j]
        axes = [x for k in gi for x in layout[k]]
        sharded = [k for k in gi if layout[k]]
        if axes:
            major = next(k for k in gj if dst[k] > 1) if any(dst[k] > 1 for k in gj) else gj[0]
            if sharded != [next(k for k in gi if src[k] > 1)] or dst[major] % shards(axes, sizes):
                return None
            out[major] = tuple(axes)
        i += 1
        j += 1
    return out


def _along_axis(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """Operations along one dimension (cumulative sums, sort, reverse): it must be whole."""
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, partial = est.read(frame, v)
    axes = eqn.params.get("dimensions", None) or (
        eqn.params.get("axis", eqn.params.get("dimension", 0)),
    )
    if isinstance(axes, int):
        axes = (axes,)
    keep = tuple(() if d in axes else x for d, x in enumerate(layout))
    for w in eqn.invars:
        if shape_of(w) == shape_of(v):
            est.move(w, keep, frame, tally, mult)
    est.work(out, keep, tally, mult)
    for w in eqn.outvars:
        est.set(
            frame,
            w,
            (keep, NO_AXES)
            if shape_of(w) == shape_of(v)
            else (replicated(len(shape_of(w))), NO_AXES),
        )


HANDLERS.update({n: _along_axis for n in ALONG_AXIS})


def _reshape_only_shape(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """squeeze / expand_dims: a reshape that only adds or drops size-1 dimensions."""
    _reshape(est, eqn, frame, tally, mult)


HANDLERS["squeeze"] = HANDLERS["expand_dims"] = _reshape_only_shape


def _no_operands(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    for v in eqn.outvars:
        est.set(frame, v, (replicated(len(shape_of(v))), NO_AXES))


HANDLERS["iota"] = HANDLERS["rng_bit_generator"] = _no_operands


def _sliced(est: Estimator, eqn: Any, frame: Frame, tally: Tally, mult: float) -> None:
    """slice, pad, concatenate, dynamic (update) slices: dimensions whose size changes are
    whole; the others keep the first operand's axes."""
    v, out = eqn.invars[0], eqn.outvars[0]
    layout, _ = est.read(frame, v)
    in_shape, out_shape = shape_of(v), shape_of(out)
    if len(in_shape) != len(out_shape):
        return est.gather_all(eqn, frame, tally, mult)
    keep = list(layout)
    for w in eqn.invars:
        ws = shape_of(w)
        if len(ws) == len(out_shape):
            for d in range(len(ws)):
                if ws[d] != out_shape[d] or in_shape[d] != out_shape[d]:
                    keep[d] = ()
    lay = tuple(keep)
    for w in eqn.invars:
        if len(shape_of(w)) == len(out_shape):
            est.move(w, lay, frame, tally, mult)
        elif not isinstance(w, jp.Literal):
            est.move(w, replicated(len(shape_of(w))), frame, tally, mult)
    est.work(out, lay, tally, mult)
    est.set(frame, out, (lay, NO_AXES))


HANDLERS.update(
    {n: _sliced for n in ("slice", "pad", "concatenate", "dynamic_slice", "dynamic_update_slice")}
)
