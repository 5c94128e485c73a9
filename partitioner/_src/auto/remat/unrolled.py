"""Rematerialization of the equal layers of an unrolled stack (NOTE [auto remat unrolled]).

NOTE [auto remat unrolled]: a stack written as a Python loop over layers (a list of
parameter dicts, flax's ``Block_0``, ``Block_1``...) is, once ``jax.grad`` has run
inside the call, one flat program: every layer's forward equations, in order, then
the backward pass reading the values they computed (the residuals). There is no loop
body to recompute in, so the rewrite does what ``jax.checkpoint`` on each layer
would have done, in the flat program:

- *Layers* are found by their parameters: inputs whose paths differ only in the layer
  (``structure.layer_keys``; the outermost key under which 3 layers or more hold the
  same leaves, so the index of a ``(params, opt_state)`` tuple is not taken for one).
  Layer k's forward equations run from the first one reading its parameters to the
  first one reading layer k+1's. Values a layer's equations
  compute that a later layer's forward reads (its output, the next layer's input) are
  kept, as ``jax.checkpoint`` keeps a block's inputs; the others that the backward
  reads are the residuals the policy may drop.
- Under a policy, walking back from a layer's residuals through its equations, an
  equation the policy calls saveable keeps its outputs; any other one is recomputed,
  just before the backward pass first reads one of the layer's residuals, from the
  kept values.
- The recomputation runs as both branches of a ``cond`` whose predicate is a value
  of the backward pass at that point (one element of the first reader's other
  operand, equal to itself unless it is NaN: either branch computes the same). The
  ``optimization_barrier`` ``jax.checkpoint`` relies on is not enough here: XLA's CPU
  pipeline expands barriers before its common-subexpression pass, which merges the
  recomputed equations back into the forward ones (jax's own ``jax.checkpoint`` on
  each block of an unrolled stack leaves XLA:CPU's memory figure as it was, where the
  ``cond`` lowers it: the README's "auto" row of the same 8 blocks unrolled, written
  by ``unrolled_rows`` in ``benchmarks/remat_case.py``). A branch is not merged with
  the equations outside it, and it cannot run before its predicate is known.
- The last layer is not rewritten: the backward pass reads its residuals first, at
  the peak, so recomputing them would add flops and lower nothing.

The equations computed again are the same operations on the same values: results
are unchanged. XLA's memory and cost analyses judge and price the plan, as for scans
(NOTE [auto remat]).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.tree_util import KeyPath, keystr

from ... import jax_private as jp
from ..search.structure import layer_keys
from .interpret import Env, as_traced, evaluate, outputs, readers_of, retraced, run_equations
from .policies import RecomputePolicy, saveable, tags


@dataclass(frozen=True)
class Layer:
    """One layer of an unrolled stack: its forward equations ``start:end``; reads of its
    values from ``late`` on are the backward pass's."""

    name: str  # its parameters' path prefix, e.g. ``args[0]['layers'][3]``
    start: int
    end: int
    late: int
    names: tuple[str, ...]  # checkpoint_name tags among its equations

    def describe(self, number: int) -> str:
        return f"layer {self.name}"


def layers(closed: Any, in_paths: Sequence[KeyPath]) -> list[Layer]:
    """The layers of ``closed``'s unrolled stacks that a policy may rewrite (NOTE [auto
    remat unrolled]); ``in_paths`` are its inputs' key paths."""
    eqns = closed.jaxpr.eqns
    readers = readers_of(closed.jaxpr)
    stacks: dict[str, dict[str, list[Any]]] = {}
    for (stack, layer), param in zip(
        _layers_of(in_paths, closed.in_avals), closed.jaxpr.invars, strict=True
    ):
        if stack and param in readers:
            stacks.setdefault(stack, {}).setdefault(layer, []).append(param)
    found: list[Layer] = []
    for held in stacks.values():
        starts = {
            layer: min(readers[param][0] for param in params) for layer, params in held.items()
        }
        order = sorted(starts.items(), key=lambda item: item[1])
        bounds = [start for _, start in order]
        if len(bounds) < 3 or len(set(bounds)) < len(bounds):
            continue  # parameters read all at once (a cast before the stack), or too few
        late = bounds[-1] + (bounds[-1] - bounds[-2])  # the last layer's forward ends
        spans = list(zip(bounds, [*bounds[1:], late], strict=True))
        shapes = [
            tuple(_kind(eqn) for eqn in eqns[span_start:span_end]) for span_start, span_end in spans
        ]
        for k, ((name, start), end) in enumerate(zip(order[:-1], bounds[1:], strict=False)):
            if shapes[k] not in (shapes[k - 1] if k else None, shapes[k + 1]):
                continue  # not a repeat of its neighbours: arguments alike, not layers
            if all(readers[param][-1] < late for param in held[name]):
                continue  # its inputs not read again after the stack: not differentiated
            made = (out for eqn in eqns[start:end] for out in eqn.outvars)
            if not any(i >= late for out in made for i in readers.get(out, ())):
                continue  # nothing of it read after the stack: no residual
            found.append(Layer(f"args{name}", start, end, late, tags(eqns[start:end])))
    return sorted(found, key=lambda layer: layer.start)


def _layers_of(in_paths: Sequence[KeyPath], avals: Sequence[Any]) -> list[tuple[str, str]]:
    """Per input, its (stack, layer), or ``("", "")`` outside any: of the keys of its
    path that may name a layer (``structure.layer_keys``), the outermost under which 3
    layers or more hold the same leaves (paths below the key, shapes and types); the
    layers holding other leaves are not the stack's."""
    candidates = [layer_keys(path) for path in in_paths]
    held: dict[str, dict[str, set[Any]]] = {}
    for path, aval, keys in zip(in_paths, avals, candidates, strict=True):
        for k, stack, layer in keys:
            leaf = (keystr(tuple(path[k + 1 :])), aval.shape, aval.dtype)
            held.setdefault(stack, {}).setdefault(layer, set()).add(leaf)
    members: dict[str, set[str]] = {}
    for stack, layers in held.items():
        common, count = collections.Counter(
            frozenset(leaves) for leaves in layers.values()
        ).most_common(1)[0]
        if count >= 3:
            members[stack] = {name for name, leaves in layers.items() if leaves == common}
    return [
        next(((stack, name) for _, stack, name in keys if name in members.get(stack, ())), ("", ""))
        for keys in candidates
    ]


def _kind(eqn: Any) -> tuple[Any, ...]:
    """What equal layers' equations share: the operation and its operands' and results'
    shapes and types (not the avals' shardings, which differ where a layer reads the
    call's own inputs)."""
    types = tuple((var.aval.shape, var.aval.dtype) for var in (*eqn.invars, *eqn.outvars))
    return (eqn.primitive, types)


def rewrite(closed: Any, per_layer: RecomputePolicy[Layer]) -> Any:
    """``closed`` with each layer ``per_layer`` names rematerialized (NOTE [auto remat
    unrolled]); the same inputs and outputs."""
    jaxpr = closed.jaxpr
    readers = readers_of(jaxpr)
    made = (var for eqn in jaxpr.eqns for var in eqn.outvars)
    order = {var: k for k, var in enumerate(itertools.chain(jaxpr.constvars, jaxpr.invars, made))}
    before: dict[int, list[_Recompute]] = {}
    for layer, policy in per_layer.applied():
        recompute = _Recompute.of(jaxpr, layer, policy, readers, order)
        if recompute is not None:
            before.setdefault(recompute.before, []).append(recompute)

    def step(index: int, eqn: Any, env: Env) -> list[Any]:
        for recompute in before.get(index, ()):
            recompute.run(env)
        return as_traced(index, eqn, env)

    return retraced(
        closed, lambda *args: outputs(jaxpr, evaluate(jaxpr, closed.consts, args, step))
    )


@dataclass(frozen=True)
class _Recompute:
    """One layer under one policy: the equations computed again ``before`` the
    equation of that index, from ``inputs``, once ``probe`` (a floating value that
    equation reads) is known, giving ``residuals`` anew."""

    before: int
    inputs: tuple[Any, ...]
    probe: Any
    eqns: tuple[Any, ...]
    residuals: tuple[Any, ...]

    @classmethod
    def of(
        cls,
        jaxpr: Any,
        layer: Layer,
        policy: Callable[..., Any],
        readers: dict[Any, list[int]],
        order: dict[Any, int],
    ) -> _Recompute | None:
        mine = jaxpr.eqns[layer.start : layer.end]
        residuals, kept = [], set()
        for eqn in mine:
            for out in eqn.outvars:
                reads = readers.get(out, ())
                if any(layer.end <= i < layer.late for i in reads):
                    kept.add(out)  # a later layer's forward reads it: a boundary
                elif any(i >= layer.late for i in reads):
                    residuals.append(out)
        needed, recompute = set(residuals), []
        for eqn in reversed(mine):
            hit = [out for out in eqn.outvars if out in needed]
            if not hit or saveable(eqn, policy) or any(out in kept for out in eqn.outvars):
                continue
            needed.difference_update(eqn.outvars)
            needed.update(operand for operand in eqn.invars if isinstance(operand, jp.Var))
            recompute.append(eqn)
        if not recompute:
            return None
        made = {out for eqn in recompute for out in eqn.outvars}
        outs = tuple(residual for residual in residuals if residual in made)
        before = min(i for out in outs for i in readers[out] if i >= layer.late)
        probe = _probe([*jaxpr.eqns[before].invars, *needed], made)
        if probe is None:
            return None  # nothing floating to wait for: XLA would merge the recomputation
        inputs = tuple(sorted(needed, key=order.__getitem__))  # in the program's order
        return cls(before, inputs, probe, tuple(reversed(recompute)), outs)

    def run(self, env: Env) -> None:
        """The residuals recomputed into ``env``, for the backward pass to read."""
        probe = env[self.probe]
        probe = lax.slice(probe, (0,) * probe.ndim, (1,) * probe.ndim).reshape(())

        def again(ins: list[Any]) -> list[Any]:
            local = run_equations(self.eqns, dict(zip(self.inputs, ins, strict=True)))
            return [local[residual] for residual in self.residuals]

        # NaN, the one value unequal to itself, takes the other branch: the same one
        outs = lax.cond(probe == probe, again, again, [env[var] for var in self.inputs])
        env.update(zip(self.residuals, outs, strict=True))


def _probe(candidates: Sequence[Any], made: set[Any]) -> Any | None:
    """The first non-empty floating value among ``candidates`` not recomputed: a ``cond``
    predicate XLA cannot fold (``x == x`` is false for NaN)."""
    for candidate in candidates:
        if isinstance(candidate, jp.Var) and candidate not in made:
            aval: Any = candidate.aval
            if aval.size and jnp.issubdtype(aval.dtype, jnp.floating):
                return candidate
    return None
