"""The schedule as data: what each stage does at each step, for every schedule.

NOTE [pipeline actions]: a schedule is, per stage, an *order* of actions on
(microbatch, visit) pairs: a forward (``F``), a whole backward (``B``), or, for zero
bubble, the backward split into the input gradient (``B`` too, on the critical path)
and the weight gradient (``W``, which nothing waits for). The *table*
(``Schedule.actions``) is the timeline those orders give on a pipeline whose stages
start an action as soon as its inputs are there, each column one forward's time: a
whole backward takes two columns, an input or a weight gradient one each (the zero
bubble paper's F = B = W). Its idle cells are the bubble.

- ``gpipe``/``circular``: every forward, then every backward (the backward loop is the
  forward loop's transpose: the steps in reverse, each a backward of what the step's
  forward did), as NOTE [pipeline schedule] places them.
- ``1f1b``: stage ``s`` runs ``S - s - 1`` forwards, then one forward and one backward
  in turn, then the backwards left: at most ``S - s`` microbatches in flight, whatever
  ``M``; bubble ``(S - 1) / (M + S - 1)``, gpipe's, at a fraction of its memory.
- ``interleaved-1f1b``: 1F1B over circular's stages (layer ``i`` on stage ``i mod
  S``, ``R`` visits of one layer each), Megatron-LM's order: microbatches in groups
  of ``S``, each group through every visit (forwards in visit order, backwards in
  reverse), ``2 (S - s - 1) + (R - 1) S`` forwards before the first backward.
- ``zero-bubble``: ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's
  order of forwards and input gradients, stage ``s`` putting off its first ``s``
  weight gradients until the backwards have passed it. Every stage holds at most
  ``S`` microbatches (1F1B's most), and the bubble is ``S - 1`` columns a stage
  against 1F1B's ``3 (S - 1)``: a third.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

#: Columns one action takes in the table (one forward's time).
WIDTH = {"F": 1, "B": 2, "I": 1, "W": 1}


class ActionKind(enum.StrEnum):
    """What a stage does in one cell of the table."""

    FORWARD = "forward"
    BACKWARD = "backward"  # the whole backward: input and weight gradients
    INPUT_GRADIENT = "input-gradient"  # zero bubble's B: the input's gradient only
    WEIGHT_GRADIENT = "weight-gradient"  # zero bubble's W
    IDLE = "idle"


_LETTER = {
    ActionKind.FORWARD: "F",
    ActionKind.BACKWARD: "B",
    ActionKind.INPUT_GRADIENT: "I",
    ActionKind.WEIGHT_GRADIENT: "W",
}
_KIND = {letter: kind for kind, letter in _LETTER.items()}


@dataclasses.dataclass(frozen=True)
class Action:
    """One action of a stage: its kind, the microbatch and the visit (``-1`` when idle)."""

    kind: ActionKind
    microbatch: int = -1
    visit: int = -1

    @property
    def letter(self) -> str:
        """``F``, ``B`` (a whole backward, or zero bubble's input gradient), ``W``, or ``.``."""
        if self.kind is ActionKind.INPUT_GRADIENT:
            return "B"
        return _LETTER.get(self.kind, ".")

    @property
    def width(self) -> int:
        """Columns it takes in the table."""
        return WIDTH[_LETTER[self.kind]] if self.kind is not ActionKind.IDLE else 1


IDLE = Action(ActionKind.IDLE)
#: One stage's actions in the order it runs them: (letter, microbatch, visit).
Order = tuple[tuple[str, int, int], ...]
#: The table: one row per stage, one column per step.
Table = tuple[tuple[Action, ...], ...]


def bubble_fraction(table: Table) -> float:
    """The share of the table's cells where a stage is idle."""
    cells = [action for row in table for action in row]
    return sum(action.kind is ActionKind.IDLE for action in cells) / len(cells)


# --- the orders of the schedules that run by actions ---


def one_f_one_b(stages: int, microbatches: int, stage: int, *, split: bool) -> Order:
    """1F1B's order for ``stage``; ``split``: zero bubble's ZB-H1 (NOTE [pipeline actions])."""
    backward = "I" if split else "B"
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m, 0) for m in range(warmup)]
    # weight gradients held back until the backwards have passed (as many as the forwards
    # between this stage's first one and its first backward)
    put_off = min(stage, microbatches - warmup) if split else 0
    for m in range(warmup, microbatches):
        order += [("F", m, 0), (backward, m - warmup, 0)]
        done = m - warmup - put_off
        if split and done >= 0:
            order.append(("W", done, 0))
    for m in range(microbatches - warmup, microbatches):
        order.append((backward, m, 0))
        done = m - put_off
        if split and done >= 0:
            order.append(("W", done, 0))
    if split:
        last = max((m for letter, m, _ in order if letter == "W"), default=-1)
        order += [("W", m, 0) for m in range(last + 1, microbatches)]
    return tuple(order)


def interleaved(stages: int, microbatches: int, visits: int, stage: int) -> Order:
    """Interleaved 1F1B's order for ``stage`` (Megatron-LM's; NOTE [pipeline actions])."""
    total = microbatches * visits
    group = stages * visits

    def unit(k: int, *, backward: bool) -> tuple[int, int]:
        within = k % group
        visit = within // stages
        return (k // group) * stages + within % stages, visits - 1 - visit if backward else visit

    warmup = min(2 * (stages - stage - 1) + (visits - 1) * stages, total)
    order = [("F", *unit(k, backward=False)) for k in range(warmup)]
    for k in range(total - warmup):
        order += [("F", *unit(warmup + k, backward=False)), ("B", *unit(k, backward=True))]
    order += [("B", *unit(k, backward=True)) for k in range(total - warmup, total)]
    return tuple(order)


def needs(
    letter: str, microbatch: int, visit: int, stage: int, stages: int, visits: int
) -> list[tuple[str, int, int, int]]:
    """What an action waits for: (letter, microbatch, visit, stage) of other actions."""
    if letter == "F":
        if stage > 0:
            return [("F", microbatch, visit, stage - 1)]
        return [("F", microbatch, visit - 1, stages - 1)] if visit > 0 else []
    if letter == "W":
        return [("I", microbatch, visit, stage)]
    own = [("F", microbatch, visit, stage)]
    if stage < stages - 1:
        return [*own, (letter, microbatch, visit, stage + 1)]
    if visit < visits - 1:
        return [*own, (letter, microbatch, visit + 1, 0)]
    return own


def timeline(orders: Sequence[Order], visits: int) -> Table:
    """The table of stages running ``orders`` (one per stage), each action as soon as
    the stage is free and what it needs is done (NOTE [pipeline actions]).

    Raises:
        ValueError: orders that wait on each other (an internal error).
    """
    stages = len(orders)
    finish: dict[tuple[str, int, int, int], int] = {}
    free, position = [0] * stages, [0] * stages
    starts: list[list[tuple[int, tuple[str, int, int]]]] = [[] for _ in range(stages)]
    progressed = True
    while progressed:
        progressed = False
        for stage, order in enumerate(orders):
            while position[stage] < len(order):
                letter, micro, visit = order[position[stage]]
                waits = needs(letter, micro, visit, stage, stages, visits)
                if any(w not in finish for w in waits):
                    break
                start = max([free[stage], *(finish[w] for w in waits)])
                free[stage] = finish[(letter, micro, visit, stage)] = start + WIDTH[letter]
                starts[stage].append((start, order[position[stage]]))
                position[stage] += 1
                progressed = True
    if any(p < len(order) for p, order in zip(position, orders, strict=True)):
        raise ValueError(f"internal error: pipeline orders deadlock at {position}; please report")
    columns = max(free)
    table = []
    for row in starts:
        cells = [IDLE] * columns
        for start, (letter, micro, visit) in row:
            action = Action(_KIND[letter], micro, visit)
            cells[start : start + WIDTH[letter]] = [action] * WIDTH[letter]
        table.append(tuple(cells))
    return tuple(table)


def forward_then_backward(forward: Sequence[Sequence[Action]]) -> Table:
    """gpipe's and circular's table from their forward steps (``forward[stage][step]``):
    the backward loop after them runs the steps in reverse, each step's backward two
    columns wide (NOTE [pipeline actions])."""
    table = []
    for row in forward:
        backward = []
        for action in reversed(row):
            kind = ActionKind.IDLE if action.kind is ActionKind.IDLE else ActionKind.BACKWARD
            cell = dataclasses.replace(action, kind=kind)
            backward += [cell, cell]
        table.append((*row, *backward))
    return tuple(table)


def in_flight(order: Order) -> int:
    """The most microbatch visits ``order`` holds at once: forwarded, and not yet done
    with (their backward, or zero bubble's weight gradient, not yet run)."""
    last = (
        "W"
        if any(letter == "W" for letter, _, _ in order)
        else next((letter for letter, _, _ in order if letter in "BI"), "B")
    )
    held = most = 0
    for letter, _, _ in order:
        held += (letter == "F") - (letter == last)
        most = max(most, held)
    return most
