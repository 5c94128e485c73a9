"""``Schedule`` (NOTE [pipeline schedule]): which microbatch each stage works on at each step.

Pure arithmetic, so every property is checked against a table of ``at(t)`` for all
steps, or against the figures worked out by hand in the NOTE.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioner._src.pipeline.schedule import SCHEDULES, Schedule, ScheduleKind


@st.composite
def schedules(draw: st.DrawFn, kinds: tuple[str, ...] = ("gpipe", "circular")) -> Schedule:
    """Small schedules of ``kinds`` (gpipe's and circular's loop by default): 1-4
    stages, 1-3 layers a stage, 1-6 microbatches."""
    kind = draw(st.sampled_from(kinds))
    stages = draw(st.integers(1, 4))
    layers = stages * draw(st.integers(1, 3))
    return Schedule(kind, layers, stages, draw(st.integers(1, 6)))


def table(s: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``at(t)`` for every step: (microbatch, visit, busy), each ``[steps, stages]``."""
    rows = [s.at(np.int32(t)) for t in range(s.steps)]
    return tuple(np.array([np.asarray(row[i]) for row in rows]) for i in range(3))


@given(schedules(SCHEDULES))
def test_the_layers_are_repeats_times_stages_times_a_visit(s: Schedule) -> None:
    assert s.layers == s.repeats * s.stages * s.per_visit
    assert (s.repeats, s.per_visit) == (
        (s.layers // s.stages, 1) if s.kind.circular else (1, s.layers // s.stages)
    )


@given(schedules())
def test_each_stage_works_on_each_microbatch_once_a_visit(s: Schedule) -> None:
    micro, visit, busy = table(s)
    for stage in range(s.stages):
        done = sorted(zip(micro[busy[:, stage], stage], visit[busy[:, stage], stage]))
        assert done == [(m, r) for m in range(s.microbatches) for r in range(s.repeats)]
    # Every stage busy M R of the steps: the rest of the stage-steps is the bubble.
    assert busy.sum(axis=0).tolist() == [s.microbatches * s.repeats] * s.stages
    assert busy.size == s.steps * s.stages
    assert s.bubble_fraction == pytest.approx(1 - busy.sum() / busy.size)


@given(schedules())
def test_a_microbatch_goes_through_the_layers_in_order_one_stage_a_step(s: Schedule) -> None:
    """Where the roll by one stage puts it: the next stage on the next step, and stage 0
    of the next visit after the last stage."""
    micro, visit, busy = table(s)
    applied: dict[int, list[int]] = {m: [] for m in range(s.microbatches)}
    where: dict[tuple[int, int], tuple[int, int]] = {}  # (micro, visit) -> step, stage last
    for t in range(s.steps):
        for stage in np.flatnonzero(busy[t]):
            m, r = int(micro[t, stage]), int(visit[t, stage])
            v = s.per_visit
            applied[m] += s.layers_of(int(stage))[r * v : (r + 1) * v]
            previous = where.get((m, r - 1) if stage == 0 else (m, r))
            if stage > 0 or r > 0:
                assert previous == (t - 1, (stage - 1) % s.stages), (m, r, t, stage)
            where[(m, r)] = (t, int(stage))
    assert applied == {m: list(range(s.layers)) for m in range(s.microbatches)}


@given(schedules(SCHEDULES))
def test_the_stages_hold_every_layer_once(s: Schedule) -> None:
    held = [s.layers_of(stage) for stage in range(s.stages)]
    assert sorted(i for layers in held for i in layers) == list(range(s.layers))
    for stage, layers in enumerate(held):
        if not ScheduleKind(s.kind).circular:  # contiguous blocks: gpipe, 1f1b, zero bubble
            assert layers == list(range(stage * s.per_visit, (stage + 1) * s.per_visit))
        else:  # layer i on stage i mod S
            assert layers == list(range(stage, s.layers, s.stages))


@pytest.mark.parametrize(
    "kind, layers, stages, microbatches, steps, bubble",
    [
        # gpipe: (S - 1) / (M + S - 1)
        ("gpipe", 8, 4, 4, 7, 3 / 7),
        ("gpipe", 8, 2, 8, 9, 1 / 9),
        ("gpipe", 3, 1, 5, 5, 0.0),
        # circular: 1 - M R / (slots R + S - 1), slots = M rounded up to whole groups of S
        ("circular", 8, 4, 4, 11, 1 - 8 / 11),
        ("circular", 8, 4, 5, 19, 1 - 10 / 19),
        ("circular", 6, 2, 3, 13, 1 - 9 / 13),
        ("circular", 4, 4, 3, 6, 1 - 3 / 6),  # one visit: no rounding up
    ],
)
def test_steps_and_bubble_as_worked_out_by_hand(
    kind: str, layers: int, stages: int, microbatches: int, steps: int, bubble: float
) -> None:
    s = Schedule(kind, layers, stages, microbatches)
    assert s.steps == steps
    assert s.bubble_fraction == pytest.approx(bubble)


def test_the_circular_bubble_is_smaller_than_gpipes() -> None:
    assert (
        Schedule("circular", 8, 4, 4).bubble_fraction < Schedule("gpipe", 8, 4, 4).bubble_fraction
    )


@pytest.mark.parametrize(
    "s",
    [Schedule("gpipe", 8, 4, 4), Schedule("circular", 8, 4, 5), Schedule("circular", 6, 3, 2)],
    ids=repr,
)
def test_at_gives_the_same_on_numpy_ints_and_traced_ints(s: Schedule) -> None:
    traced = jax.jit(s.at)
    for t in range(s.steps):
        eager: Any = s.at(np.int32(t))
        for got, want in zip(traced(np.int32(t)), eager, strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert np.asarray(eager[0]).shape == (s.stages,)
