"""Recompute policies: one of jax's own ``jax.checkpoint`` policies per part.

A *part* (:class:`Recomputable`) is what one policy applies to: a differentiated
scan (``scans.Block``) or a layer of an unrolled stack (``unrolled.Layer``); a
:class:`RecomputePolicy` gives each part a policy or none (NOTE [auto remat] in
``__init__.py``). The recompute policies tried are few: per part, its tagged names (where the
program tags values with ``checkpoint_name``) and jax's three policies that keep
less and less (:data:`POLICIES`), and all their combinations while they are at most
:data:`MAX_PLANS`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from jax import ad_checkpoint

from ... import jax_private as jp

_policies = ad_checkpoint.checkpoint_policies
#: jax's policies tried on each part, each keeping a subset of what the one before keeps
#: (so each recomputes at least what the one before does).
POLICIES: dict[str, Callable[..., Any]] = {
    "dots_saveable": _policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": _policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": _policies.nothing_saveable,
}
#: At most this many recompute policies are compiled; with more parts, one policy for every part.
MAX_PLANS = 16
#: Where layouts alone fit (any limit, or none), the policy every differentiated scan's
#: body is tried with, kept where XLA counts at most this share more flops for it
#: (NOTE [auto scan residuals] in ``fit.py``).
TRIM, TRIM_FLOPS = "dots_saveable", 0.02


class Recomputable(Protocol):
    """What a recompute policy gives a jax policy: a scan's ``scans.Block``, or a layer of an unrolled
    stack (``unrolled.Layer``)."""

    @property
    def names(self) -> tuple[str, ...]: ...  # checkpoint_name tags among its equations

    def describe(self, number: int) -> str: ...


Part = TypeVar("Part", bound=Recomputable)


@dataclass(frozen=True)
class RecomputePolicy(Generic[Part]):
    """A policy name (or ``None``: residuals kept as jax saved them) per part."""

    parts: tuple[Part, ...]
    policies: tuple[str | None, ...]

    def recomputes_more_than(self, other: RecomputePolicy[Part]) -> bool:
        """Whether this recompute policy recomputes at least what ``other`` does, part by part
        (:data:`POLICIES` order; a tagged-names policy compares with none)."""
        order = [None, *POLICIES]
        pairs = zip(self.policies, other.policies, strict=True)
        return all(
            mine in order and theirs in order and order.index(mine) >= order.index(theirs)
            for mine, theirs in pairs
        )

    def applied(self) -> list[tuple[Part, Callable[..., Any]]]:
        """Each part a policy recomputes, with that policy (jax's function)."""
        pairs = zip(self.parts, self.policies, strict=True)
        return [(part, policy_of(name)) for part, name in pairs if name is not None]

    def rematerialized(self) -> tuple[tuple[str, str], ...]:
        """(part, policy) for each part recomputed, as the report shows them."""
        return tuple(
            (part.describe(number), name)
            for number, (part, name) in enumerate(zip(self.parts, self.policies, strict=True), 1)
            if name is not None
        )


def policy_of(name: str) -> Callable[..., Any]:
    """The jax policy a recompute policy names (``save_only_these_names:a,b`` for tagged values)."""
    if name.startswith("save_only_these_names:"):
        names = name.split(":", 1)[1].split(",")
        return ad_checkpoint.checkpoint_policies.save_only_these_names(*names)
    return POLICIES[name]


def policies_to_try(found: Sequence[Part]) -> list[RecomputePolicy[Part]]:
    """Every recompute policy to try, least recomputed first per part; one policy for all parts
    when the product passes :data:`MAX_PLANS`."""
    options = [_options(part) for part in found]
    product = list(itertools.product(*options))
    if len(product) > MAX_PLANS:
        common = sorted(set.intersection(*(set(named) for named in options)), key=options[0].index)
        product = [(name,) * len(found) for name in common]
    return [RecomputePolicy(tuple(found), tuple(combination)) for combination in product]


def _options(part: Recomputable) -> list[str]:
    tagged = [f"save_only_these_names:{','.join(part.names)}"] if part.names else []
    return [*tagged, *POLICIES]


def saveable(eqn: Any, policy: Callable[..., Any]) -> bool:
    """Whether jax's ``policy`` keeps ``eqn``'s outputs (an effect is never recomputed)."""
    if eqn.effects:
        return True
    decision = policy(eqn.primitive, *(operand.aval for operand in eqn.invars), **eqn.params)
    return jp.remat_policy(decision) != "recompute"


def tags(eqns: Sequence[Any]) -> tuple[str, ...]:
    """The ``checkpoint_name`` tags among ``eqns``, sorted (a recompute policy may keep
    only those)."""
    return tuple(sorted({eqn.params["name"] for eqn in eqns if eqn.primitive.name == "name"}))
