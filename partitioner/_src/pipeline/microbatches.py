"""How many microbatches, and what each step saves, when the user leaves it to partitioner.

NOTE [pipeline microbatches]: more microbatches shrink the bubble (``schedule.py``)
and what each step holds, but every step pays a fixed cost (a collective-permute's
latency, the loop's own step) and the steps' saved activations add up. Each option,
a count and what a step saves (``program.Saves``), is priced per device with AUTO's
rates (``auto/cost/rates.py``) and flop counter (``auto/cost/flops.py``) as a training
step (forward and backward) of the pipeline alone:

- time: ``steps`` steps of ``V f / (M D)`` flops (three passes of it; four when a
  step saves only its inputs and recomputes the rest), and two permutes of a
  microbatch shard's activations ``a / (M D)`` (forward and backward), for ``V``
  layers a visit of ``f`` flops on the whole batch, activations of ``a`` bytes,
  ``M`` microbatches and ``D`` shards (NOTE [pipeline gradients]);
- collective bytes: those permutes, and the one reduction of the stage's weights
  over the shards after the loop;
- memory: the shards' copies of the stage's weights and their gradients, what the
  steps save (``steps`` visits' residuals, or ``steps`` visits' inputs and one
  visit's residuals), and the loop's buffers (the microbatches, the outputs, the
  microbatch in flight).

1F1B, interleaved 1F1B and zero bubble (NOTE [pipeline rounds]) are priced by their
rounds: each the dearest action of a round (a backward: two passes, three when it
recomputes the forward; zero bubble's input and weight gradients one each, run side
by side), one permute a round, and what at most ``in_flight`` microbatch visits keep:
their memory does not grow with ``M``.

The choice: under ``auto_memory_limit`` only options whose memory fits it (the least
memory where none does); without one, only options within :data:`MEMORY_SLACK` of
the least memory; among those the least time, ties (within :data:`TIE`) going to
more microbatches. It is made once per layer, shapes, schedule and placement, and
kept with what AUTO's searches found (``auto/searched.py``: bounded, cleared by
``partitioner.clear_caches()``). The figures are the model's, of the pipeline alone:
the report (``Report.pipelines``) gives XLA's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax

from .. import jax_private as jp
from ..auto import searched
from ..auto.cost import flops
from ..auto.cost.equations import aval_itemsize
from ..auto.cost.rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from ..primitives.auto_choice import Estimate
from .program import Saves
from .schedule import Schedule, ScheduleKind

#: Estimated times within this share of the best count as tied.
TIE = 0.01
#: Without a memory limit, options whose memory is above the least by more than this
#: share are not chosen, however fast.
MEMORY_SLACK = 0.25


@dataclasses.dataclass(frozen=True)
class LayerCosts:
    """What the choice knows of one layer, on the whole batch (bytes and flops).

    Attributes:
        flops: its floating-point work (AUTO's flop counter).
        activation_bytes: its input (and output): the activations a step moves.
        residual_bytes: the activations it saves for its backward pass (its weights
            are not counted: the pipeline never saves them per step).
        weight_bytes: its parameters.
    """

    flops: float
    activation_bytes: float
    residual_bytes: float
    weight_bytes: float


@dataclasses.dataclass(frozen=True)
class MicrobatchOption:
    """The model's figures for one option, per device (NOTE [pipeline microbatches]).

    Attributes:
        microbatches: the count.
        saves: what each step keeps for the backward pass.
        bubble_fraction: the share of stage-steps with no microbatch to work on.
        estimate: the pipeline's training step as AUTO's cost model counts a program:
            ``time_s`` (what the choice minimizes), compute, collective bytes and
            count, ``memory_bytes``.
    """

    microbatches: int
    saves: Saves
    bubble_fraction: float
    estimate: Estimate


def layer_costs(layer: Callable[..., Any], one_layer: Any, batch: Any) -> LayerCosts:
    """:class:`LayerCosts` of ``layer`` on one layer's parameters and the whole batch
    (arrays or ``jax.ShapeDtypeStruct``s)."""
    size = jax.tree.leaves(batch)[0].shape[0]
    residuals = jp.saved_residuals(layer, one_layer, batch)
    activations = sum(
        _nbytes(aval) for aval, _ in residuals if getattr(aval, "shape", ())[:1] == (size,)
    )
    return LayerCosts(
        flops=flops.program(jax.make_jaxpr(layer)(one_layer, batch)),
        activation_bytes=float(tree_bytes(batch)),
        residual_bytes=float(activations),
        weight_bytes=float(tree_bytes(one_layer)),
    )


def tree_bytes(tree: Any) -> int:
    """Bytes of every leaf of ``tree`` together."""
    return sum(_nbytes(leaf) for leaf in jax.tree.leaves(tree))


def _nbytes(value: Any) -> int:
    """Bytes of a value (an aval, array or ``jax.ShapeDtypeStruct``; a typed key's words)."""
    aval = jp.ShapedArray(tuple(value.shape), value.dtype)
    return int(math.prod(aval.shape)) * aval_itemsize(aval)


def estimate(schedule: Schedule, shards: int, costs: LayerCosts, saves: Saves) -> Estimate:
    """One option's figures per device, for a training step (NOTE [pipeline microbatches])."""
    count, steps, visit = schedule.microbatches, schedule.steps, schedule.per_visit
    piece = count * shards  # a microbatch's shard: the batch over this
    if schedule.kind.by_actions:  # a round: its dearest action, one permute
        passes, permutes, held = (3 if saves is Saves.INPUTS else 2), steps, schedule.in_flight
    else:  # a step: forward, backward (twice), recompute; a permute each way
        passes, permutes, held = (4 if saves is Saves.INPUTS else 3), 2 * steps, steps
    compute = steps * passes * visit * costs.flops / piece / FLOPS_PER_S
    moved = costs.activation_bytes / piece
    reduced = costs.weight_bytes * schedule.layers / schedule.stages if shards > 1 else 0.0
    collective_bytes = permutes * moved + reduced
    collectives = float(permutes) + (1.0 if shards > 1 else 0.0)
    comm = collective_bytes / BYTES_PER_S + collectives * LATENCY_S
    weights = 2 * costs.weight_bytes * schedule.layers / schedule.stages  # copies, gradients
    residuals = visit * costs.residual_bytes / piece
    if saves is Saves.INPUTS:
        saved = held * moved + residuals
    else:
        saved = held * residuals
    buffers = (2 + 1 / count) * costs.activation_bytes / shards
    return Estimate(
        time_s=compute + comm,
        compute_s=compute,
        comm_s=comm,
        collective_bytes=collective_bytes,
        collectives=collectives,
        memory_bytes=weights + saved + buffers,
    )


def options(
    kind: ScheduleKind,
    layers: int,
    stages: int,
    counts: Sequence[int],
    shards: Callable[[int], int],
    costs: LayerCosts,
    saves: Sequence[Saves],
) -> tuple[MicrobatchOption, ...]:
    """Every option's figures: each count (``shards(count)``: its microbatch's shards)
    with each of ``saves``, fewest microbatches first."""
    table = []
    for count in counts:
        schedule = Schedule(kind, layers, stages, count)
        for kept in saves:
            figures = estimate(schedule, shards(count), costs, kept)
            table.append(MicrobatchOption(count, kept, schedule.bubble_fraction, figures))
    return tuple(table)


def pick(table: Sequence[MicrobatchOption], memory_limit: int | None) -> MicrobatchOption:
    """The option NOTE [pipeline microbatches] takes."""
    least = min(option.estimate.memory_bytes for option in table)
    if memory_limit is not None and least <= memory_limit:
        bound = float(memory_limit)
    else:
        bound = least * (1 + MEMORY_SLACK) if memory_limit is None else least
    fitting = [option for option in table if option.estimate.memory_bytes <= bound]
    best = min(option.estimate.time_s for option in fitting)
    tied = [option for option in fitting if option.estimate.time_s <= best * (1 + TIE)]
    return max(tied, key=lambda option: (option.microbatches, -option.estimate.time_s))


def kept(key: Hashable, compute: Callable[[], Any]) -> Any:
    """The option kept for ``key`` (layer, shapes, schedule, placement), computed once."""
    return searched.once(("pipeline", key), compute)
