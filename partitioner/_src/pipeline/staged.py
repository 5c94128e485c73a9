"""Stacked parameters in the order the stages hold them, laid out once.

Why: a stack ``[layers, ...]`` laid out over the stage axis gives each stage a
contiguous block of layers, which is what gpipe runs. Circular runs layer ``i`` on
stage ``i mod S``: from contiguous blocks, every call would move every parameter to
the round-robin order and its gradient back (an all-to-all each way). So the
pipeline owns the order it needs: :class:`StagedParams` holds the layers as
``[stages, repeats, per_visit, ...]`` (layer ``(r * S + s) * V + v`` at ``[s, r, v]``),
laid out ``P(axis)`` on its first dimension, and a layer count the stages do not
divide keeps its last layers apart (``rest``, run after the stages, outside them).
It is a pytree: optimizer states, gradients and ``jax.tree.map`` keep its form, so a
training loop stages its parameters once (``Pipelined.stage``) and never again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .schedule import Schedule, ScheduleKind


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StagedParams:
    """A stack of layers' parameters in the stages' order (the module's docstring).

    Attributes:
        staged: the pipelined layers, every leaf ``[stages, repeats, per_visit, ...]``.
        rest: the layers after them that the stages do not divide, every leaf
            ``[rest, ...]`` (``None``: none).
        schedule: the schedule the order is for (``"gpipe"`` or ``"circular"``).
    """

    staged: Any
    rest: Any
    schedule: ScheduleKind = dataclasses.field(metadata={"static": True})

    def unstage(self) -> Any:
        """The stack ``[layers, ...]`` in layer order (for a checkpoint, or the plain scan)."""
        stacked = jax.tree.map(_unstaged, self.staged)
        if self.rest is None:
            return stacked
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), stacked, self.rest)

    @property
    def layers(self) -> int:
        """Every layer: the stages' and the rest."""
        return pipelined_layers(self.staged) + rest_layers(self.rest)


def stage_order(stacked: Any, schedule: Schedule) -> StagedParams:
    """``stacked`` (every leaf ``[layers, ...]``) in the order ``schedule``'s stages hold
    it: its first ``schedule.layers`` layers staged, the others kept apart."""
    n = schedule.layers
    staged = jax.tree.map(lambda leaf: _staged(leaf[:n], schedule), stacked)
    layers = np.shape(jax.tree.leaves(stacked)[0])[0]
    rest = None if layers == n else jax.tree.map(lambda leaf: leaf[n:], stacked)
    return StagedParams(staged, rest, schedule.kind)


def _staged(leaf: Any, schedule: Schedule) -> Any:
    """``[layers, ...]`` -> ``[stages, repeats, per_visit, ...]``: layer
    ``(r * stages + s) * per_visit + v`` at ``[s, r, v]``."""
    shape = (schedule.repeats, schedule.stages, schedule.per_visit, *np.shape(leaf)[1:])
    return jnp.swapaxes(jnp.reshape(leaf, shape), 0, 1)


def _unstaged(leaf: Any) -> Any:
    swapped = jnp.swapaxes(leaf, 0, 1)
    return jnp.reshape(swapped, (-1, *np.shape(leaf)[3:]))


def pipelined_layers(staged: Any) -> int:
    """The layers a staged tree holds (``stages * repeats * per_visit``)."""
    return int(np.prod(np.shape(jax.tree.leaves(staged)[0])[:3]))


def rest_layers(rest: Any) -> int:
    return 0 if rest is None else int(np.shape(jax.tree.leaves(rest)[0])[0])
