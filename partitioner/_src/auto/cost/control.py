"""Rules for calls and control flow: nested pjits, call-like equations, scan, while, cond.

Each walks its body with the states its operands arrive in (NOTE [auto cost
model] in ``cost.py``), through ``Values.walk``: a ``scan`` body counts
``length`` times, its carried values settled (a partial sum reduced) and laid out
as the body returns them where that is cheaper (NOTE [loop carry layout]), its
sliced inputs whole along the scanned dimension (NOTE [scanned stack gather]); a
``while`` body counts its trip count where the loop counts a literal bound from a
literal start (``i < n``, ``i + 1``), else once; moves of a loop's constants are
paid once, outside it (NOTE [loop invariants] in ``values.py``); a ``cond`` its
dearest branch. A call's body is part of its caller's computation, a loop's body and
a branch computations of their own: XLA's all-reduce combiner merges within one
(NOTE [all-reduce combiner] in ``combiner.py``). ``rules.py`` registers them by
primitive name, and picks :func:`pinned_call` for our own pjit and :func:`call` for
other call-like equations (``equations.call_body``).
"""

from __future__ import annotations

from typing import Any

from ... import jax_private as jp
from ...primitives.pjit_call import PjitParams
from .equations import shape_of, trip_count
from .layouts import NO_AXES, Layout
from .values import Frame, Outside, State, Tally, Values, Walked, spec_layout


def call(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float, body: Any) -> float:
    """A call-like equation (remat, custom derivatives, jax's own jit): its body inline."""
    jaxpr = body.jaxpr if isinstance(body, jp.ClosedJaxpr) else body
    states = [model.read(frame, operand) for operand in eqn.invars]
    walked = model.walk(jaxpr, states, tally, mult)
    for result, state in zip(eqn.outvars, walked.outs, strict=True):
        model.set(frame, result, state)
    frame.called = (tuple(walked.levels), walked.top)
    return walked.peak


def pinned_call(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
    """A nested pjit: its operands move to its input specs, its results are laid out as
    its output specs say (or as propagated where it leaves them open)."""
    params = PjitParams.of(eqn.params)
    states = []
    for operand, spec in zip(eqn.invars, params.in_axis_resources, strict=True):
        if spec is None:
            states.append(model.read(frame, operand))
            continue
        layout = spec_layout(spec, len(shape_of(operand)), model.order)
        model.move(operand, layout, frame, tally, mult)
        states.append((layout, NO_AXES))
    walked = model.walk(params.jaxpr.jaxpr, states, tally, mult)
    levels, top = list(walked.levels), walked.top
    for i, (result, state, spec) in enumerate(
        zip(eqn.outvars, walked.outs, params.out_axis_resources, strict=True)
    ):
        if spec is not None:
            layout = spec_layout(spec, len(shape_of(result)), model.order)
            steps = model.steps(result, state[0], state[1], layout)
            tally.pay(steps, mult)
            levels[i] = model.levels.add(levels[i], model.levels.of_steps(steps))
            top = model.levels.join(top, levels[i])
            state = (layout, NO_AXES)
        model.set(frame, result, state)
    frame.called = (tuple(levels), top)
    return walked.peak


def scan(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
    params = eqn.params
    n_consts, n_carry, length = params["num_consts"], params["num_carry"], params["length"]
    states: list[State] = []
    stacks = 0.0
    for i, operand in enumerate(eqn.invars):
        if i < n_consts + n_carry:
            states.append(model.settled(operand, frame, tally, mult))
        else:
            layout, gathered = _stack_whole(model, operand, frame, tally, mult)
            stacks += gathered
            states.append((layout[1:], NO_AXES))
    body = params["jaxpr"].jaxpr
    carry = slice(n_consts, n_consts + n_carry)
    outside = {i: Outside(const, frame, tally, mult)
               for i, const in enumerate(eqn.invars[:n_consts])
               if not isinstance(const, jp.Literal)}  # fmt: skip
    loop = _loop(model, body, states, carry, mult * length, outside)
    found = [
        (model.resolve_partial(out, state), NO_AXES)
        for out, state in zip(body.outvars[:n_carry], loop[1][:n_carry], strict=True)
    ]
    if found != states[carry]:  # NOTE [loop carry layout]
        other = states[: carry.start] + found + states[carry.stop :]
        entry = Tally()
        for operand, state in zip(eqn.invars[carry], found, strict=True):
            steps = model.steps(operand, *model.read(frame, operand), state[0])
            entry.pay(steps, mult)
            entry.collectives += sum(mult for step in steps if step[1] > 1 and step[3])
        again = _loop(model, body, other, carry, mult * length, outside)
        if entry.seconds() + again[0].seconds() < loop[0].seconds():
            for operand, state in zip(eqn.invars[carry], found, strict=True):
                model.move(operand, state[0], frame, tally, mult)
            states, loop = other, again
    looped, outs, peak = loop
    tally.add(looped)
    for result, state in zip(eqn.outvars[:n_carry], states[carry], strict=True):
        model.set(frame, result, state)
    for result, state in zip(eqn.outvars[n_carry:], outs[n_carry:], strict=True):
        model.set(frame, result, (((),) + state[0], state[1]))
    return peak + stacks


def _loop(
    model: Values,
    body: Any,
    states: list[State],
    carry: slice,
    mult: float,
    outside: dict[int, Outside],
) -> tuple[Tally, list[State], float]:
    """A loop body walked from ``states``, its carried results moved back to the layouts
    they entered in (every trip): the tally, the body's output states and its peak.
    ``outside``: the body's loop invariants (NOTE [loop invariants] in ``values.py``).

    NOTE [loop carry layout]: XLA lays a loop's state out as its body makes it, not as
    its initial value happens to be (a stack of gradients, accumulated layer by layer
    from zeros, stays split as each layer's gradient is). A loop is walked with its
    carries as they enter; where the body returns them laid out otherwise, it is
    walked again with the carries entering as the body returns them (the initial
    values moved once, before the loop), and the cheaper kept."""
    looped = Tally()
    walked = model.walk(body, states, looped, mult, outside)
    outs = _carried_back(model, body, walked, states[carry], looped, mult)
    return looped, outs, walked.peak


def _carried_back(
    model: Values, body: Any, walked: Walked, carry: list[State], tally: Tally, mult: float
) -> list[State]:
    """A loop body's carried results moved back to the layouts they entered in and its
    other results' partial sums reduced (NOTE [loop outputs reduced per trip]), in the
    body's computation, and the all-reduces the body runs per trip counted: as many per
    group as the deepest level it reaches (NOTE [all-reduce combiner] in
    ``combiner.py``); the body's results' states (the carried ones as the body returns
    them, NOTE [loop carry layout]).

    NOTE [loop outputs reduced per trip]: a scan's stacked result (a layer's weight
    gradient, a partial sum over the batch's axis) is written into the loop's output
    buffer every trip, and XLA reduces it there, before the write: one all-reduce per
    trip, in its layout (merged with the trip's others), not one of the whole stack
    after the loop. The bytes are the same; the count is the loop's length (8 where the
    model counted 1 on 8 scanned transformer blocks)."""
    levels = model.levels
    top = walked.top
    outs = list(walked.outs)
    wants = [want[0] for want in carry] + [state[0] for state in outs[len(carry) :]]
    for i, (out, state, want, level) in enumerate(
        zip(body.outvars, outs, wants, walked.levels, strict=True)
    ):
        steps = model.steps(out, state[0], state[1], want)
        tally.pay(steps, mult)
        top = levels.join(top, levels.add(level, levels.of_steps(steps)))
        if i >= len(carry):
            outs[i] = (want, NO_AXES)
    tally.collectives += levels.total(top) * mult
    return outs


def _stack_whole(
    model: Values, stack: Any, frame: Frame, tally: Tally, mult: float
) -> tuple[Layout, float]:
    """A scan's stacked operand laid out for the loop's slices: its leading dimension whole;
    the bytes of the gathered stack the loop holds (0 where none is gathered).

    NOTE [scanned stack gather]: a stack split over its leading dimension (FSDP over
    the stack) is all-gathered before the loop, by the loop and for it alone: XLA
    gathers it again for every loop that reads it (the forward scan and its
    transpose each pay the gather), and the whole stack is a temporary of the loop,
    not a copy a later equation reuses. Other splits move as any operand does."""
    src, partial = model.read(frame, stack)
    layout = ((),) + src[1:]
    if not src or not src[0]:
        model.move(stack, layout, frame, tally, mult)
        return layout, 0.0
    model.pay(frame, tally, model.steps(stack, src, partial, layout), mult, stack)
    return layout, model.nbytes(stack, layout)


def while_loop(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
    params = eqn.params
    n_cond_consts, n_body_consts = params["cond_nconsts"], params["body_nconsts"]
    trips = trip_count(eqn)
    states = [model.settled(operand, frame, tally, mult) for operand in eqn.invars]
    carry = states[n_cond_consts + n_body_consts :]
    outside = {i: Outside(const, frame, tally, mult)
               for i, const in enumerate(eqn.invars[n_cond_consts : n_cond_consts + n_body_consts])
               if not isinstance(const, jp.Literal)}  # fmt: skip
    body = params["body_jaxpr"].jaxpr
    walked = model.walk(
        body,
        states[n_cond_consts : n_cond_consts + n_body_consts] + carry,
        tally,
        mult * trips,
        outside,
    )
    test = model.walk(
        params["cond_jaxpr"].jaxpr, states[:n_cond_consts] + carry, tally, mult * trips
    )
    tally.collectives += model.levels.total(test.top) * mult * trips
    _carried_back(model, body, walked, carry, tally, mult * trips)
    for result, state in zip(eqn.outvars, carry, strict=True):
        model.set(frame, result, state)
    return max(walked.peak, test.peak)


def cond(model: Values, eqn: Any, frame: Frame, tally: Tally, mult: float) -> float:
    states = [model.settled(operand, frame, tally, mult) for operand in eqn.invars[1:]]
    best: tuple[Tally, list[State], float] | None = None
    for branch in eqn.params["branches"]:
        branch_tally = Tally()
        walked = model.walk(branch.jaxpr, states, branch_tally, mult)
        branch_tally.collectives += model.levels.total(walked.top) * mult  # its own computation
        if best is None or branch_tally.seconds() > best[0].seconds():
            best = (branch_tally, walked.outs, walked.peak)
    assert best is not None
    tally.add(best[0])
    for result, state in zip(eqn.outvars, best[1], strict=True):
        model.set(frame, result, state)
    return best[2]
