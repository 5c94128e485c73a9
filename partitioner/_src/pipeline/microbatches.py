"""How many microbatches, when the user leaves it to partitioner (``microbatches=None``).

NOTE [pipeline microbatches]: more microbatches shrink the bubble
(``schedule.py``) and the activations each step holds, but every step pays a
fixed cost (a collective-permute's latency, the loop's own step) whatever the
microbatch's size. With AUTO's rates (``auto/cost/rates.py``: flops over a FLOP
rate, bytes over a bandwidth, a latency per collective) and its flop counter
(``auto/cost/flops.py``), a step costs ``V f / M + a / M + latency`` for a layer of
``f`` flops on the whole batch and activations of ``a`` bytes, and the pipeline takes
``steps(M)`` of them. The choice is the divisor of the batch with the least
estimated time, ties (within 1%) going to more microbatches (less memory per step).
It is made once per layer, shapes and schedule, and kept with AUTO's choices
(``auto/choices.py``: bounded, cleared by ``partitioner.clear_caches()``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import jax

from ..auto import choices
from ..auto.cost import flops
from ..auto.cost.rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from ..primitives.auto_choice import Estimate
from .schedule import Schedule

#: Estimated times within this share of the best count as tied.
TIE = 0.01


@dataclasses.dataclass(frozen=True)
class MicrobatchOption:
    """The model's figures for one microbatch count, per device.

    Attributes:
        microbatches: the count.
        bubble_fraction: the share of stage-steps with no microbatch to work on.
        estimate: the pipeline's steps as AUTO's cost model counts a program: its
            time (``time_s``, what the choice minimizes), compute, the permutes'
            bytes and count; ``memory_bytes`` the activations its loop carries on one
            stage (the microbatch in flight and the output buffer).
    """

    microbatches: int
    bubble_fraction: float
    estimate: Estimate


def choose(
    kind: str,
    layers: int,
    stages: int,
    batch: int,
    layer_flops: float,
    activation_bytes: float,
) -> tuple[int, tuple[MicrobatchOption, ...]]:
    """The microbatch count with the least estimated time (NOTE [pipeline
    microbatches]), and every divisor's figures, fewest microbatches first."""
    table = []
    for count in (divisor for divisor in range(1, batch + 1) if batch % divisor == 0):
        schedule = Schedule(kind, layers, stages, count)
        table.append(_option(schedule, layer_flops, activation_bytes))
    best = min(option.estimate.time_s for option in table)
    chosen = max(
        option.microbatches for option in table if option.estimate.time_s <= best * (1 + TIE)
    )
    return chosen, tuple(table)


def _option(schedule: Schedule, layer_flops: float, activation_bytes: float) -> MicrobatchOption:
    count, steps = schedule.microbatches, schedule.steps
    compute = schedule.per_visit * layer_flops / FLOPS_PER_S
    step = (compute + activation_bytes / BYTES_PER_S) / count
    step += LATENCY_S
    estimate = Estimate(
        time_s=step * steps,
        compute_s=compute / count * steps,
        comm_s=(activation_bytes / BYTES_PER_S / count + LATENCY_S) * steps,
        collective_bytes=activation_bytes / count * steps,
        collectives=float(steps),
        memory_bytes=activation_bytes / count + activation_bytes,
    )
    return MicrobatchOption(count, schedule.bubble_fraction, estimate)


def layer_flops(layer: Callable[..., Any], p_aval: Any, h_aval: Any) -> float:
    """Floating-point work of one layer on the whole batch, as AUTO's cost model counts
    it (``auto/cost/flops.py``)."""
    return flops.program(jax.make_jaxpr(layer)(p_aval, h_aval))


def chosen_for(
    key: Hashable, compute: Callable[[], tuple[int, tuple[MicrobatchOption, ...]]]
) -> tuple[int, tuple[MicrobatchOption, ...]]:
    """The choice kept for ``key`` (layer, shapes, schedule), computed once."""
    return choices.chosen(("pipeline", key), compute)
