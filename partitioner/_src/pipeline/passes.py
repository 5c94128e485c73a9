"""A stage's visit as the pieces its actions run: the forward that keeps what the backward
reads, the whole backward, and the backward split into input and weight gradients.

NOTE [pipeline passes]: a schedule that runs by actions (NOTE [pipeline rounds]) runs a
microbatch's forward and its backward in different rounds, so the pipeline
differentiates each visit by hand, once: ``jax.vjp`` of the visit's layers, traced to
one program ``(weights, h) -> (out, residuals)`` and one ``(residuals, ct) -> (dweights,
dh)``. The forward program is split by data dependence (jax's partial evaluation) into
what the weights alone give (``fixed``: the weights the backward reads, casts of them),
recomputed by every action from the stage's weights and never kept per microbatch, and
what depends on the microbatch: its residuals, kept between the forward and the
backward (``saves="activations"``), or recomputed by the backward from the visit's
input (``saves="inputs"``). A residual that *is* the visit's input is not kept twice:
it is the input.

Zero bubble's backward is the whole backward's program cut in two by data dependence:
the input gradient is every equation the input's gradient needs; the weight gradient
every other equation the weights' gradients need, reading what the first part computed
(``q``: the gradients at the layers' outputs, kept from the one to the other) instead
of computing it again. So the two together do the whole backward's work, once, and
each reads only what it needs (XLA keeps nothing of the other).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import jax_private as jp

Leaves = list[Any]


@dataclasses.dataclass(frozen=True)
class Passes:
    """One visit's pieces (NOTE [pipeline passes]), on flat leaves.

    Attributes:
        fixed: ``fixed(weights) -> fixed``: what the weights alone give.
        forward: ``forward(fixed, h) -> (out, vjp)``: the output and every residual.
        vjp_of: ``vjp_of(fixed, h, kept) -> vjp``: every residual again, from the fixed
            values, the input and the kept ones.
        kept: per residual, whether a forward keeps it per microbatch (not fixed,
            not the input).
        from_input: per residual, whether it is (a leaf of) the visit's input.
        backward: ``backward(vjp, ct) -> (dweights, dh)``.
        input_gradient: ``input_gradient(vjp, ct) -> (dh, q)``.
        weight_gradient: ``weight_gradient(vjp, ct, q) -> dweights``.
        residual_avals, q_avals: the kept residuals' and ``q``'s avals.
        reads: per backward piece (``"B"``, ``"I"``, ``"W"``), the residuals it reads
            (indices of ``vjp``), whether it reads ``ct``, and (``"W"``) ``q``.
    """

    fixed: Callable[[Leaves], Leaves]
    forward: Callable[[Leaves, Leaves], tuple[Leaves, Leaves]]
    vjp_of: Callable[[Leaves, Leaves, Leaves], Leaves]
    kept: tuple[bool, ...]
    from_input: tuple[bool, ...]
    backward: Callable[[Leaves, Leaves], tuple[Leaves, Leaves]]
    input_gradient: Callable[[Leaves, Leaves], tuple[Leaves, Leaves]]
    weight_gradient: Callable[[Leaves, Leaves, Leaves], Leaves]
    residual_avals: tuple[Any, ...]
    q_avals: tuple[Any, ...]
    reads: dict[str, tuple[tuple[int, ...], bool]]

    def stored(self, vjp: Leaves) -> Leaves:
        """The residuals a forward keeps, of all of them."""
        return [leaf for leaf, keep in zip(vjp, self.kept, strict=True) if keep]


def passes(visit: Callable[[Any, Any], Any], weights: Any, h: Any) -> Passes:
    """The pieces of ``visit(weights, h) -> h`` (NOTE [pipeline passes]); ``weights``
    and ``h`` are avals (``jax.ShapeDtypeStruct`` trees)."""
    n_w, n_h = len(jax.tree.leaves(weights)), len(jax.tree.leaves(h))
    w_tree, h_tree = jax.tree.structure(weights), jax.tree.structure(h)
    box: list[Any] = []

    def with_vjp(*leaves: Any) -> Leaves:
        w, x = jax.tree.unflatten(w_tree, leaves[:n_w]), jax.tree.unflatten(h_tree, leaves[n_w:])
        out, pullback = jax.vjp(visit, w, x)
        flat, tree = jax.tree.flatten(pullback)
        box[:] = [tree, len(flat)]
        return [*jax.tree.leaves(out), *flat]

    whole = jax.make_jaxpr(with_vjp)(*jax.tree.leaves(weights), *jax.tree.leaves(h))
    vjp_tree, n_vjp = box
    known, unknown, out_unknown, _ = jp.partial_eval_jaxpr_nounits(
        whole, [False] * n_w + [True] * n_h, False
    )
    n_known_outs = sum(not u for u in out_unknown)
    vjp_unknown = out_unknown[n_h:]
    forwarded = _forwarded(unknown.jaxpr, out_unknown, n_h)
    kept = tuple(u and f is None for u, f in zip(vjp_unknown, forwarded, strict=True))
    vjp_avals = [v.aval for v in whole.jaxpr.outvars[n_h:]]

    def fixed(w: Leaves) -> Leaves:
        return list(jp.eval_jaxpr(known.jaxpr, known.consts, *w))

    def forward(fixed_values: Leaves, x: Leaves) -> tuple[Leaves, Leaves]:
        known_outs, pe_res = fixed_values[:n_known_outs], fixed_values[n_known_outs:]
        unknown_iter = iter(jp.eval_jaxpr(unknown.jaxpr, unknown.consts, *pe_res, *x))
        known_iter = iter(known_outs)
        outs = [next(unknown_iter) if u else next(known_iter) for u in out_unknown]
        return outs[:n_h], outs[n_h:]

    def vjp_of(fixed_values: Leaves, x: Leaves, stored: Leaves) -> Leaves:
        """Every residual from the fixed values, the input and the kept ones."""
        # the known outputs: the visit's outputs' first, then the residuals'
        known_outs = iter(fixed_values[sum(not u for u in out_unknown[:n_h]) : n_known_outs])
        kept_iter = iter(stored)
        return [
            next(known_outs) if not u else x[f] if f is not None else next(kept_iter)
            for u, f in zip(vjp_unknown, forwarded, strict=True)
        ]

    def pulled(*leaves: Any) -> Leaves:
        pullback = jax.tree.unflatten(vjp_tree, leaves[:n_vjp])
        d_w, d_h = pullback(jax.tree.unflatten(h_tree, leaves[n_vjp:]))
        return [*jax.tree.leaves(d_w), *jax.tree.leaves(d_h)]

    ct_avals = [v.aval for v in whole.jaxpr.outvars[:n_h]]
    back = jax.make_jaxpr(pulled)(*vjp_avals, *ct_avals)
    first, second, q_avals = _cut(back, [False] * n_w + [True] * n_h)

    def backward(vjp: Leaves, ct: Leaves) -> tuple[Leaves, Leaves]:
        outs = jp.eval_jaxpr(back.jaxpr, back.consts, *vjp, *ct)
        return list(outs[:n_w]), list(outs[n_w:])

    def input_gradient(vjp: Leaves, ct: Leaves) -> tuple[Leaves, Leaves]:
        outs = jp.eval_jaxpr(first.jaxpr, first.consts, *vjp, *ct)
        return list(outs[:n_h]), list(outs[n_h:])

    def weight_gradient(vjp: Leaves, ct: Leaves, q: Leaves) -> Leaves:
        return list(jp.eval_jaxpr(second.jaxpr, second.consts, *vjp, *ct, *q))

    reads = {
        "B": _reads(back.jaxpr, n_vjp, n_h),
        "I": _reads(first.jaxpr, n_vjp, n_h),
        "W": _reads(second.jaxpr, n_vjp, n_h),
    }
    return Passes(
        fixed=fixed,
        forward=forward,
        vjp_of=vjp_of,
        kept=kept,
        from_input=tuple(f is not None for f in forwarded),
        backward=backward,
        input_gradient=input_gradient,
        weight_gradient=weight_gradient,
        residual_avals=tuple(a for a, k in zip(vjp_avals, kept, strict=True) if k),
        q_avals=tuple(q_avals),
        reads=reads,
    )


def _forwarded(unknown: Any, out_unknown: Sequence[bool], n_h: int) -> list[int | None]:
    """Per residual, the index of the input leaf it is (None: another value)."""
    inputs = unknown.invars[len(unknown.invars) - n_h :]
    unknown_outs = iter(unknown.outvars)
    found: list[int | None] = []
    for k, u in enumerate(out_unknown):
        var = next(unknown_outs) if u else None
        if k < n_h:
            continue
        found.append(inputs.index(var) if u and var in inputs else None)
    return found


def _reads(jaxpr: Any, n_vjp: int, n_h: int) -> tuple[tuple[int, ...], bool]:
    """The residuals (indices) and whether ``ct`` a backward piece reads."""
    _, used = jp.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    residuals = tuple(k for k in range(n_vjp) if used[k])
    return residuals, any(used[n_vjp : n_vjp + n_h])


def _cut(closed: Any, first_outs: Sequence[bool]) -> tuple[Any, Any, list[Any]]:
    """``closed`` cut in two by data dependence (NOTE [pipeline passes]): the first part
    computes the outputs ``first_outs`` marks and every value of its own the second part
    reads (``q``); the second the other outputs, from the inputs and ``q``."""
    jaxpr = closed.jaxpr
    outs = list(jaxpr.outvars)
    first_vars = [v for v, f in zip(outs, first_outs, strict=True) if f]
    second_vars = [v for v, f in zip(outs, first_outs, strict=True) if not f]
    in_first = _needed(jaxpr.eqns, first_vars, skip=set())
    in_second = _needed(jaxpr.eqns, second_vars, skip=in_first)
    made_first = {v for k in in_first for v in jaxpr.eqns[k].outvars}
    read_second = {v for k in in_second for v in jaxpr.eqns[k].invars if isinstance(v, jp.Var)} | {
        v for v in second_vars if isinstance(v, jp.Var)
    }
    q = [v for k in sorted(in_first) for v in jaxpr.eqns[k].outvars if v in read_second]
    assert all(v in made_first for v in q)
    unnamed = jaxpr.debug_info._replace(arg_names=None, result_paths=None)
    first = jaxpr.replace(
        eqns=[jaxpr.eqns[k] for k in sorted(in_first)],
        outvars=[*first_vars, *q],
        debug_info=unnamed,
    )
    second = jaxpr.replace(
        invars=[*jaxpr.invars, *q],
        eqns=[jaxpr.eqns[k] for k in sorted(in_second)],
        outvars=second_vars,
        debug_info=unnamed,
    )
    return (
        jp.ClosedJaxpr(first, closed.consts),
        jp.ClosedJaxpr(second, closed.consts),
        [v.aval for v in q],
    )


def _needed(eqns: Sequence[Any], outs: Sequence[Any], skip: set[int]) -> set[int]:
    """The equations (indices, not in ``skip``) the values ``outs`` need."""
    live = {v for v in outs if isinstance(v, jp.Var)}
    found = set()
    for k in range(len(eqns) - 1, -1, -1):
        if k in skip:
            continue
        eqn = eqns[k]
        if any(v in live for v in eqn.outvars) or jp.has_effects(eqn):
            found.add(k)
            live |= {v for v in eqn.invars if isinstance(v, jp.Var)}
    return found
