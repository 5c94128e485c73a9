"""The schedules: which microbatch each stage works on at each step, and their tables.

NOTE [pipeline schedule]: ``L`` layers, ``S`` stages, ``M`` microbatches. Layer
``i`` is visit ``r`` of stage ``s``, position ``v`` in the visit, where
``i = (r * S + s) * V + v``: ``"gpipe"`` has one visit of ``V = L / S``
contiguous layers per stage; ``"circular"`` has ``R = L / S`` visits of one
layer, so layer ``i`` lives on stage ``i mod S``. A microbatch that leaves the
last stage after visit ``r`` enters stage 0 for visit ``r + 1`` on the next step,
which is exactly where the roll by one stage puts it. Microbatches go in groups
of ``S`` (``slots``: ``M`` rounded up to a multiple of ``S`` when there are
several visits; empty slots are bubble). Stage ``s`` at step ``t`` works on
``u = t - s``: visit ``(u mod S R) div S``, microbatch ``(u div S R) S + u mod S``.
Every stage is busy ``M R`` of the ``slots R + S - 1`` steps; the rest is the
bubble (``(S - 1) / (M + S - 1)`` for gpipe, smaller for circular: each of its
steps is one layer, not ``L / S``).

1F1B and zero bubble hold their layers as gpipe does, interleaved 1F1B as circular
does; they run by actions (NOTE [pipeline actions], NOTE [pipeline rounds]), each
stage its own order of forwards and backwards, and their steps are the rounds of that
program. Every schedule's table of actions (``actions``) gives its bubble.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from . import actions as acts
from .rounds import Values, schedule_rounds


class ScheduleKind(enum.StrEnum):
    """How a pipeline's layers sit on its stages and in which order the stages run
    (NOTE [pipeline schedule], NOTE [pipeline actions])."""

    GPIPE = "gpipe"  # one visit of L / S contiguous layers per stage
    CIRCULAR = "circular"  # L / S visits of one layer: layer i on stage i mod S
    ONE_F_ONE_B = "1f1b"  # gpipe's stages, each backward as soon as it can run
    INTERLEAVED = "interleaved-1f1b"  # 1F1B over circular's stages
    ZERO_BUBBLE = "zero-bubble"  # ZB-H1: 1F1B with the weight gradients in the bubble

    @property
    def circular(self) -> bool:
        """Whether layer ``i`` sits on stage ``i mod S`` (else contiguous blocks)."""
        return self in (ScheduleKind.CIRCULAR, ScheduleKind.INTERLEAVED)

    @property
    def by_actions(self) -> bool:
        """Whether it runs by actions (NOTE [pipeline rounds]): needs a loss head."""
        return self not in (ScheduleKind.GPIPE, ScheduleKind.CIRCULAR)

    @property
    def layout(self) -> ScheduleKind:
        """The gpipe or circular schedule whose stages hold the layers as this one's do."""
        return ScheduleKind.CIRCULAR if self.circular else ScheduleKind.GPIPE


SCHEDULES = tuple(kind.value for kind in ScheduleKind)
#: The rounds' values when only their count matters.
_COUNTING = Values(pools={"in": 0, "ct": 0}, reads={"F": ("in",)}, makes={})


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One pipeline's shape (NOTE [pipeline schedule]).

    Invariants: ``layers == repeats * stages * per_visit``; every stage works on
    ``microbatches * repeats`` of the ``steps``.
    """

    kind: ScheduleKind
    layers: int
    stages: int
    microbatches: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ScheduleKind(self.kind))  # canonical: "gpipe" too

    @property
    def repeats(self) -> int:
        """Visits of each microbatch to each stage."""
        return self.layers // self.stages if self.kind.circular else 1

    @property
    def per_visit(self) -> int:
        """Layers a stage applies in one visit."""
        return 1 if self.kind.circular else self.layers // self.stages

    @property
    def slots(self) -> int:
        """Microbatch slots: with several visits, whole groups of ``stages``."""
        if self.repeats == 1:
            return self.microbatches
        return -(-self.microbatches // self.stages) * self.stages

    @property
    def steps(self) -> int:
        """The loop's steps: for gpipe and circular each forward step (NOTE [pipeline
        schedule]), else the rounds (NOTE [pipeline rounds])."""
        if self.kind.by_actions:
            return self.rounds_of(_COUNTING).rounds
        return self.slots * self.repeats + self.stages - 1

    @functools.cached_property
    def orders(self) -> tuple[acts.Order, ...]:
        """Each stage's actions in the order it runs them (a schedule that runs by
        actions; NOTE [pipeline actions])."""
        stages, count = self.stages, self.microbatches
        if self.kind is ScheduleKind.INTERLEAVED:
            return tuple(acts.interleaved(stages, count, self.repeats, s) for s in range(stages))
        split = self.kind is ScheduleKind.ZERO_BUBBLE
        return tuple(acts.one_f_one_b(stages, count, s, split=split) for s in range(stages))

    def rounds_of(self, values: Values) -> Any:
        """The rounds of a schedule that runs by actions, keeping ``values`` (NOTE
        [pipeline rounds])."""
        return _rounds(self, values)

    @functools.cached_property
    def actions(self) -> acts.Table:
        """The table (NOTE [pipeline actions]): one row per stage, one column per step of
        one forward's time, each cell an :class:`~.actions.Action`."""
        if self.kind.by_actions:
            return acts.timeline(self.orders, self.repeats)
        forward = []
        for stage in range(self.stages):
            row = []
            for step in range(self.slots * self.repeats + self.stages - 1):
                micro, visit, busy = (int(a[stage]) for a in self.at(step, xp=np))
                kind = acts.ActionKind.FORWARD if busy else acts.ActionKind.IDLE
                row.append(acts.Action(kind, micro, visit) if busy else acts.IDLE)
            forward.append(row)
        return acts.forward_then_backward(forward)

    @property
    def bubble_fraction(self) -> float:
        """The share of the table's cells where a stage is idle."""
        return acts.bubble_fraction(self.actions)

    @property
    def in_flight(self) -> int:
        """The most microbatch visits a stage holds at once (forwarded, not yet done
        with): every one for gpipe and circular."""
        if not self.kind.by_actions:
            return self.microbatches * self.repeats
        return max(acts.in_flight(order) for order in self.orders)

    def layers_of(self, stage: int) -> list[int]:
        """The layers stage ``stage`` holds, in the order it applies them."""
        stages, per_visit = self.stages, self.per_visit
        return [
            (r * stages + stage) * per_visit + j
            for r in range(self.repeats)
            for j in range(per_visit)
        ]

    def at(self, t: Any, xp: Any = jnp) -> tuple[Any, Any, Any]:
        """Per stage, at forward step ``t`` (traced) of gpipe's or circular's loop: the
        microbatch, the visit, and whether that is real work (not bubble); ``xp=np``:
        in numpy, untraced."""
        u = t - xp.arange(self.stages)
        group = self.stages * self.repeats
        visit = (u % group) // self.stages
        micro = (u // group) * self.stages + u % self.stages
        busy = (u >= 0) & (micro < self.microbatches)
        return micro, visit, busy


@functools.lru_cache(maxsize=256)
def _rounds(schedule: Schedule, values: Values) -> Any:
    return schedule_rounds(
        schedule.orders,
        schedule.repeats,
        schedule.microbatches,
        values,
        ring=schedule.kind.circular,
    )
