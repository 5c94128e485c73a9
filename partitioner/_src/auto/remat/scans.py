"""Rematerialized scans: a differentiated scan's body under a ``jax.checkpoint`` policy.

``jax.grad`` inside the call has already split every differentiated ``scan`` into a
forward scan that stacks, per step, the values the backward pass needs (its ``ys``)
and a backward scan (the other direction, the same length) that reads them as its
``xs``. That stack is the memory rematerialization trades for flops (NOTE [auto
remat] in ``__init__.py``). A :class:`Block` is such a pair. Under a policy, walking
back from the stacked residuals through the forward body, an equation the policy
calls saveable has its outputs stacked instead; any other one is recomputed in the
backward body, per step, from the step's inputs (its carry, stacked; its ``xs``
slice; the scan's constants) and the stacked values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jax import lax

from ... import jax_private as jp
from .interpret import (
    Env,
    bind,
    environment,
    evaluate,
    outputs,
    read,
    readers_of,
    retraced,
    run_equations,
)
from .policies import RecomputePolicy, saveable, tags


@dataclass(frozen=True)
class Block:
    """A differentiated scan: the forward scan at ``forward`` stacks the residuals its
    ``ys`` outputs ``residuals`` hold, read by the backward scan at ``backward`` only."""

    forward: int  # equation indices in the traced program
    backward: int
    length: int
    residuals: tuple[int, ...]  # indices among the forward scan's ys
    names: tuple[str, ...]  # checkpoint_name tags in the forward body

    def describe(self, number: int) -> str:
        return f"scan #{number} ({self.length} steps)"


def blocks(closed: Any) -> list[Block]:
    """The differentiated scans at the top of ``closed`` (NOTE [auto remat])."""
    eqns = closed.jaxpr.eqns
    readers = readers_of(closed.jaxpr)
    results = {out for out in closed.jaxpr.outvars if isinstance(out, jp.Var)}
    found = []
    for index, forward in enumerate(eqns):
        if forward.primitive.name != "scan":
            continue
        n_carry = forward.params["num_carry"]
        residuals_by_reader: dict[int, list[int]] = {}
        for k, residual in enumerate(forward.outvars[n_carry:]):
            users = set(readers.get(residual, ()))
            if len(users) == 1 and residual not in results:
                (reader,) = users
                if _backward_of(forward, eqns[reader], residual):
                    residuals_by_reader.setdefault(reader, []).append(k)
        for backward, residuals in sorted(residuals_by_reader.items())[:1]:
            names = tags(forward.params["jaxpr"].jaxpr.eqns)
            found.append(Block(index, backward, forward.params["length"], tuple(residuals), names))
    return found


def _backward_of(forward: Any, candidate: Any, residual: Any) -> bool:
    """Whether ``candidate`` is a scan reading ``residual`` only among its ``xs``, the other way
    round from ``forward``."""
    if candidate.primitive.name != "scan":
        return False
    if candidate.params["length"] != forward.params["length"]:
        return False
    if candidate.params["reverse"] == forward.params["reverse"]:
        return False
    n_lead = candidate.params["num_consts"] + candidate.params["num_carry"]
    return residual not in candidate.invars[:n_lead]


def rewrite(closed: Any, recompute: RecomputePolicy[Block]) -> Any:
    """``closed`` with each block ``recompute`` names rematerialized (NOTE [auto remat]);
    the same inputs and outputs."""
    jaxpr = closed.jaxpr
    kept = {
        block.forward: _Kept.of(jaxpr.eqns[block.forward], block, policy)
        for block, policy in recompute.applied()
    }
    forward_of = {kept_block.block.backward: index for index, kept_block in kept.items()}

    def run(*args: Any) -> list[Any]:
        stacked: dict[int, _Stacked] = {}

        def step(index: int, eqn: Any, env: Env) -> Sequence[Any]:
            # None for a dropped residual: only its backward scan reads it, and recomputes it
            ins = [v.val if isinstance(v, jp.Literal) else env.get(v) for v in eqn.invars]
            if index in kept:
                outs, stacked[index] = kept[index].run_forward(eqn, ins)
                return outs
            if index in forward_of:
                forward = forward_of[index]
                return kept[forward].run_backward(eqn, ins, stacked[forward])
            return bind(eqn, ins)

        return outputs(jaxpr, evaluate(jaxpr, closed.consts, args, step))

    return retraced(closed, run)


@dataclass(frozen=True)
class _Stacked:
    """What a rewritten forward scan hands its backward scan: the forward scan's
    arguments, and the values it stacked in place of the dropped residuals (the saved
    values, then the carries the recomputation reads)."""

    ins: tuple[Any, ...]
    stacks: tuple[Any, ...]


@dataclass(frozen=True)
class _Kept:
    """One block under one policy: what the forward scan keeps, what the backward one
    recomputes (NOTE [auto remat])."""

    block: Block
    body: Any  # the forward body, a ClosedJaxpr
    n_consts: int
    n_carry: int
    dropped: tuple[int, ...]  # ys recomputed instead of stacked
    saved: tuple[Any, ...]  # body values the policy keeps, stacked
    inputs: tuple[int, ...]  # body inputs the recomputation reads
    recompute: tuple[Any, ...]  # body equations the backward scan runs again
    outer: tuple[Any, ...]  # the forward scan's dropped outputs (its outvars)

    @classmethod
    def of(cls, eqn: Any, block: Block, policy: Callable[..., Any]) -> _Kept:
        body = eqn.params["jaxpr"]
        n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
        ys = body.jaxpr.outvars[n_carry:]
        dropped = tuple(k for k in block.residuals if isinstance(ys[k], jp.Var))
        needed = {ys[k] for k in dropped}
        saved: list[Any] = []
        recompute: list[Any] = []
        for body_eqn in reversed(body.jaxpr.eqns):
            hit = [out for out in body_eqn.outvars if out in needed]
            if not hit:
                continue
            needed.difference_update(body_eqn.outvars)
            if saveable(body_eqn, policy):
                saved += hit
            else:
                recompute.append(body_eqn)
                needed.update(operand for operand in body_eqn.invars if isinstance(operand, jp.Var))
        invars = body.jaxpr.invars
        inputs = tuple(pos for pos, var in enumerate(invars) if var in needed)
        outer = tuple(eqn.outvars[n_carry + k] for k in dropped)
        return cls(block, body, n_consts, n_carry, dropped, tuple(saved), inputs,
                   tuple(reversed(recompute)), outer)  # fmt: skip

    def _carried(self) -> list[int]:
        """The body inputs the recomputation reads that are carries (stacked per step)."""
        return [pos for pos in self.inputs if self.n_consts <= pos < self.n_consts + self.n_carry]

    def run_forward(self, eqn: Any, ins: list[Any]) -> tuple[list[Any], _Stacked]:
        """The forward scan, stacking the saved values and needed carries in place of the
        dropped residuals: its results (``None`` for each dropped one) and what the
        backward scan reads."""
        n_consts, n_carry = self.n_consts, self.n_carry
        body = self.body.jaxpr
        carried = self._carried()

        def step(carry: list[Any], xs: list[Any]) -> tuple[list[Any], list[Any]]:
            env = evaluate(body, self.body.consts, [*ins[:n_consts], *carry, *xs])
            ys = [read(env, v) for j, v in enumerate(body.outvars[n_carry:])
                  if j not in self.dropped]  # fmt: skip
            extra = [env[v] for v in self.saved] + [env[body.invars[pos]] for pos in carried]
            return [read(env, v) for v in body.outvars[:n_carry]], ys + extra

        init, xs = ins[n_consts : n_consts + n_carry], ins[n_consts + n_carry :]
        carry, ys = _scan(eqn, step, list(init), list(xs))
        n_extra = len(self.saved) + len(carried)
        kept = iter(ys[: len(ys) - n_extra])
        n_ys = len(eqn.outvars) - n_carry
        results = [*carry, *(None if j in self.dropped else next(kept) for j in range(n_ys))]
        return results, _Stacked(tuple(ins), tuple(ys[len(ys) - n_extra :]))

    def run_backward(self, eqn: Any, ins: list[Any], forward: _Stacked) -> list[Any]:
        """The backward scan, recomputing the dropped residuals per step from what the
        ``forward`` scan stacked."""
        n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
        backward_body = eqn.params["jaxpr"]
        body = self.body.jaxpr
        first_slice = self.n_consts + self.n_carry
        dropped_at = {var: j for j, var in enumerate(self.outer)}
        slots = [dropped_at.get(var) for var in eqn.invars[n_consts + n_carry :]]
        given_xs = [value for value, slot in zip(ins[n_consts + n_carry :], slots, strict=True)
                    if slot is None]  # fmt: skip
        sliced = [pos for pos in self.inputs if pos >= first_slice]
        stacked_vars = [*self.saved, *(body.invars[pos] for pos in self._carried())]
        stacked_vars += [body.invars[pos] for pos in sliced]
        constants = [
            (body.invars[pos], forward.ins[pos]) for pos in self.inputs if pos < self.n_consts
        ]
        residual_vars = body.outvars[self.n_carry :]

        def step(carry: list[Any], xs: list[Any]) -> tuple[list[Any], list[Any]]:
            given, stacked = iter(xs[: len(given_xs)]), xs[len(given_xs) :]
            known = [*constants, *zip(stacked_vars, stacked, strict=True)]
            env = run_equations(self.recompute, environment(body, self.body.consts, known=known))
            residuals = [
                next(given) if slot is None else env[residual_vars[self.dropped[slot]]]
                for slot in slots
            ]
            args = [*ins[:n_consts], *carry, *residuals]
            done = evaluate(backward_body.jaxpr, backward_body.consts, args)
            results = outputs(backward_body.jaxpr, done)
            return results[:n_carry], results[n_carry:]

        extra = [*forward.stacks, *(forward.ins[pos] for pos in sliced)]
        carry, ys = _scan(eqn, step, list(ins[n_consts : n_consts + n_carry]), given_xs + extra)
        return [*carry, *ys]


def _scan(eqn: Any, step: Callable[..., Any], init: list[Any], xs: list[Any]) -> tuple[Any, Any]:
    params = eqn.params
    return lax.scan(
        step, init, xs, length=params["length"], reverse=params["reverse"], unroll=params["unroll"]
    )
