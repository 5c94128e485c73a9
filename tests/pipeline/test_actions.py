"""The schedule as data (NOTE [pipeline actions], NOTE [pipeline rounds]): every
schedule's table checked against the zero bubble paper's figures (F = B = W: a whole
backward two columns), and the rounds of the program against their one-permute rule.

Pure arithmetic: no program is compiled here.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioner._src.pipeline import actions as acts
from partitioner._src.pipeline import rounds as rd
from partitioner._src.pipeline.schedule import Schedule

BY_ACTIONS = ("1f1b", "interleaved-1f1b", "zero-bubble")
#: The values a program keeps, at their simplest: one residual a forward makes.
ONE_RESIDUAL = rd.Values(
    pools={"in": "f32", "ct": "f32", "r": "f32"},
    reads={"F": ("in",), "B": ("r", "ct"), "I": ("r", "ct"), "W": ("r", "ct")},
    makes={"F": ("r",)},
)


@st.composite
def by_actions(draw: st.DrawFn) -> Schedule:
    """Small schedules that run by actions: 1-5 stages (interleaved: 2 or 4), as many
    microbatches as they need up to three times that, 1-2 layers a stage."""
    kind = draw(st.sampled_from(BY_ACTIONS))
    stages = (
        draw(st.sampled_from((2, 4))) if kind == "interleaved-1f1b" else draw(st.integers(1, 5))
    )
    per_stage = draw(st.integers(1, 2))
    if kind == "interleaved-1f1b":
        microbatches = stages * draw(st.integers(1, 3))
    else:
        microbatches = draw(st.integers(stages, 3 * stages))
    return Schedule(kind, stages * per_stage, stages, microbatches)


def timeline(s: Schedule) -> dict[tuple[str, int, int, int], tuple[int, int]]:
    """Each action of the table: (letter, microbatch, visit, stage) -> (start, end)."""
    spans: dict[tuple[str, int, int, int], tuple[int, int]] = {}
    for stage, row in enumerate(s.actions):
        for column, action in enumerate(row):
            if action.kind is acts.ActionKind.IDLE:
                continue
            letter = "I" if action.kind is acts.ActionKind.INPUT_GRADIENT else action.letter
            key = (letter, action.microbatch, action.visit, stage)
            start, _ = spans.get(key, (column, column))
            spans[key] = (start, column + 1)
    return spans


@given(by_actions())
def test_each_stage_runs_every_action_once_after_what_it_needs(s: Schedule) -> None:
    spans = timeline(s)
    backward = "I" if s.kind == "zero-bubble" else "B"
    letters = ("F", backward, "W") if s.kind == "zero-bubble" else ("F", backward)
    want = {
        (letter, m, v, stage)
        for letter in letters
        for m in range(s.microbatches)
        for v in range(s.repeats)
        for stage in range(s.stages)
    }
    assert set(spans) == want
    for (letter, m, v, stage), (start, end) in spans.items():
        assert end - start == acts.WIDTH[letter]  # a whole backward two columns, the rest one
        for need in needs(letter, m, v, stage, s.stages, s.repeats):
            assert spans[need][1] <= start, (letter, m, v, stage, need)


def needs(letter: str, m: int, v: int, stage: int, stages: int, visits: int) -> list[Any]:
    """What an action waits for, written out: a forward its input from the stage before
    (the last stage's, one visit earlier, on stage 0), a backward its own forward and
    the gradient from the stage after (stage 0's, one visit later, on the last stage),
    a weight gradient its input gradient."""
    if letter == "W":
        return [("I", m, v, stage)]
    if letter == "F":
        before = (stage - 1, v) if stage else (stages - 1, v - 1)
        return [("F", m, before[1], before[0])] if before[1] >= 0 else []
    after = (stage + 1, v) if stage < stages - 1 else (0, v + 1)
    return [("F", m, v, stage)] + ([(letter, m, after[1], after[0])] if after[1] < visits else [])


@pytest.mark.parametrize("stages, microbatches", [(4, 4), (4, 8), (4, 16), (2, 6), (8, 16)])
def test_1f1b_as_the_zero_bubble_paper_has_it(stages: int, microbatches: int) -> None:
    """``3 (S - 1)`` idle columns a stage, gpipe's bubble ``(S - 1) / (M + S - 1)``, and
    stage ``s`` holding at most ``S - s`` microbatches whatever ``M``."""
    s = Schedule("1f1b", stages, stages, microbatches)
    assert len(s.actions[0]) == 3 * (microbatches + stages - 1)
    for row in s.actions:
        assert sum(a.kind is acts.ActionKind.IDLE for a in row) == 3 * (stages - 1)
    assert s.bubble_fraction == pytest.approx((stages - 1) / (microbatches + stages - 1))
    gpipe = Schedule("gpipe", stages, stages, microbatches)
    assert s.bubble_fraction == pytest.approx(gpipe.bubble_fraction)
    assert [acts.in_flight(o) for o in s.orders] == [stages - k for k in range(stages)]
    assert gpipe.in_flight == microbatches  # gpipe holds every microbatch


@pytest.mark.parametrize("stages, microbatches", [(4, 4), (4, 8), (4, 16), (2, 6), (8, 16)])
def test_zero_bubble_h1_has_a_third_of_the_bubble_at_1f1bs_memory(
    stages: int, microbatches: int
) -> None:
    """ZB-H1: ``S - 1`` idle columns a stage against 1F1B's ``3 (S - 1)``, no stage
    holding more microbatches than 1F1B's first stage (``S``)."""
    zb = Schedule("zero-bubble", stages, stages, microbatches)
    one = Schedule("1f1b", stages, stages, microbatches)
    assert len(zb.actions[0]) == 3 * microbatches + stages - 1
    for row in zb.actions:
        assert sum(a.kind is acts.ActionKind.IDLE for a in row) == stages - 1
    assert zb.bubble_fraction == pytest.approx((stages - 1) / (3 * microbatches + stages - 1))
    assert zb.in_flight == one.in_flight == stages
    # the idle share: (M + S - 1) / (3 M + S - 1) of 1F1B's, at most 0.4 from M = 3 (S - 1)
    ratio = zb.bubble_fraction / one.bubble_fraction
    assert ratio == pytest.approx((microbatches + stages - 1) / (3 * microbatches + stages - 1))
    if microbatches >= 3 * (stages - 1):
        assert ratio <= 0.4


@pytest.mark.parametrize("stages, microbatches", [(4, 4), (4, 8), (2, 6)])
def test_interleaved_1f1b_shrinks_the_bubble_by_its_visits(stages: int, microbatches: int) -> None:
    """1F1B over circular's stages, in one visit's time: ``3 (S - 1)`` idle columns of
    the ``3 (M R + S - 1)``, circular's bubble, at fewer microbatches in flight."""
    layers = 2 * stages
    s = Schedule("interleaved-1f1b", layers, stages, microbatches)
    total = microbatches * s.repeats
    assert len(s.actions[0]) == 3 * (total + stages - 1)
    assert s.bubble_fraction == pytest.approx((stages - 1) / (total + stages - 1))
    circular = Schedule("circular", layers, stages, microbatches)
    assert s.bubble_fraction == pytest.approx(circular.bubble_fraction)
    warmup = 2 * (stages - 1) + (s.repeats - 1) * stages  # Megatron-LM's forwards first
    assert s.in_flight == min(warmup + 1, total) <= circular.in_flight


@given(st.sampled_from(("gpipe", "circular")), st.integers(1, 4), st.integers(1, 6))
def test_gpipe_and_circular_run_every_forward_then_every_backward(
    kind: str, stages: int, microbatches: int
) -> None:
    s = Schedule(kind, 2 * stages, stages, microbatches)
    forward_steps = s.slots * s.repeats + stages - 1
    for row in s.actions:
        letters = [a.letter for a in row]
        assert "B" not in letters[:forward_steps] and "F" not in letters[forward_steps:]
        assert letters.count("F") == microbatches * s.repeats
        assert letters.count("B") == 2 * microbatches * s.repeats
    # the bubble the loop's arithmetic gives (NOTE [pipeline schedule])
    assert s.bubble_fraction == pytest.approx(1 - microbatches * s.repeats / forward_steps)


# --- the rounds of the program (NOTE [pipeline rounds]) ---


@given(by_actions())
def test_the_rounds_run_each_stages_order_with_one_permute_each(s: Schedule) -> None:
    """Every action once, a stage's forwards and backwards in its order, each send in its
    round's permute (the simulation raises otherwise), at most one permute a round."""
    r = s.rounds_of(ONE_RESIDUAL)
    table = r.table
    code, micro, visit = (r.column(n) for n in ("code", "m", "v"))
    for stage, order in enumerate(s.orders):
        comm = [(letter, m, v) for letter, m, v in order if letter != "W"]
        ran = [
            (_letter(int(row[code])), int(row[micro]), int(row[visit]))
            for row in table[stage]
            if _letter(int(row[code])) is not None
        ]
        assert ran == comm
    assert r.rounds == sum(len(body) * trips for body, trips in r.segments)
    assert r.sends <= r.rounds


@pytest.mark.parametrize("stages, microbatches", [(4, 4), (4, 16), (3, 7)])
def test_1f1b_sends_no_more_than_gpipe(stages: int, microbatches: int) -> None:
    """``2 M + 2 S - 2`` rounds: gpipe's ``2 (M + S - 1)`` permutes, no more."""
    r = Schedule("1f1b", stages, stages, microbatches).rounds_of(ONE_RESIDUAL)
    assert r.rounds == 2 * microbatches + 2 * stages - 2
    assert r.sends <= 2 * (microbatches + stages - 1)
    zb = Schedule("zero-bubble", stages, stages, microbatches).rounds_of(ONE_RESIDUAL)
    assert zb.sends == r.sends  # the weight gradients send nothing


@pytest.mark.parametrize("kind", BY_ACTIONS)
def test_what_a_stage_keeps_does_not_grow_with_the_microbatches(kind: str) -> None:
    """The pools are as large as the most a stage holds at once: the same from 8 to 64
    microbatches (a stage keeping every microbatch's values would hold 8 times more),
    and no larger at 4, where the pipeline never fills."""
    sizes = [
        Schedule(kind, 8, 4, count).rounds_of(ONE_RESIDUAL).pool_sizes["f32"]
        for count in (4, 8, 16, 64)
    ]
    assert sizes[0] <= sizes[1] == sizes[2] == sizes[3] <= 3 * 4


def _letter(code: int) -> str | None:
    if code in (rd.FORWARD, rd.FORWARD_WEIGHT, rd.HEAD, rd.HEAD_WEIGHT):
        return "F"
    if code == rd.BACKWARD:
        return "B"
    if code in (rd.INPUT, rd.INPUT_WEIGHT):
        return "I"
    return None
