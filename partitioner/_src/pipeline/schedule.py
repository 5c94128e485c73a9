"""Which microbatch each stage works on at each step, for the two schedules.

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
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax.numpy as jnp


class ScheduleKind(enum.StrEnum):
    """How a pipeline's layers sit on its stages (NOTE [pipeline schedule])."""

    GPIPE = "gpipe"  # one visit of L / S contiguous layers per stage
    CIRCULAR = "circular"  # L / S visits of one layer: layer i on stage i mod S


SCHEDULES = tuple(kind.value for kind in ScheduleKind)


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
        return 1 if self.kind is ScheduleKind.GPIPE else self.layers // self.stages

    @property
    def per_visit(self) -> int:
        """Layers a stage applies in one visit."""
        return self.layers // self.stages if self.kind is ScheduleKind.GPIPE else 1

    @property
    def slots(self) -> int:
        """Microbatch slots: with several visits, whole groups of ``stages``."""
        if self.repeats == 1:
            return self.microbatches
        return -(-self.microbatches // self.stages) * self.stages

    @property
    def steps(self) -> int:
        return self.slots * self.repeats + self.stages - 1

    @property
    def bubble_fraction(self) -> float:
        """The share of stage-steps with no microbatch to work on."""
        return 1.0 - self.microbatches * self.repeats / self.steps

    def layers_of(self, stage: int) -> list[int]:
        """The layers stage ``stage`` holds, in the order it applies them."""
        stages, per_visit = self.stages, self.per_visit
        return [
            (r * stages + stage) * per_visit + j
            for r in range(self.repeats)
            for j in range(per_visit)
        ]

    def at(self, t: Any) -> tuple[Any, Any, Any]:
        """Per stage, at step ``t`` (traced): the microbatch, the visit, and whether
        that is real work (not bubble)."""
        u = t - jnp.arange(self.stages)
        group = self.stages * self.repeats
        visit = (u % group) // self.stages
        micro = (u // group) * self.stages + u % self.stages
        busy = (u >= 0) & (micro < self.microbatches)
        return micro, visit, busy
