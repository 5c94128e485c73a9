"""How many microbatches, when the user leaves it to partitioner (``microbatches=None``).

NOTE [pipeline microbatches]: more microbatches shrink the bubble
(``schedule.py``) and the activations each step holds, but every step pays a
fixed cost (a collective-permute's latency, the loop's own step) whatever the
microbatch's size. With the auto cost model's rates (``auto/cost.py``: flops
over a FLOP rate, bytes over a bandwidth, a latency per collective), a step
costs ``V f / M + a / M + latency`` for a layer of ``f`` flops on the whole
batch and activations of ``a`` bytes, and the pipeline takes ``steps(M)`` of
them. The choice is the divisor of the batch with the least estimated time,
ties (within 1%) going to more microbatches (less memory per step). It is made
once per layer, shapes and schedule, and kept (as an AUTO choice is).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any

import jax

from .. import jax_private as jp
from ..auto.cost import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from .schedule import Schedule

#: Estimated times within this share of the best count as tied.
TIE = 0.01


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The model's figures for one microbatch count (seconds, per device)."""

    microbatches: int
    step_s: float
    total_s: float
    bubble_fraction: float


def choose(
    kind: str,
    layers: int,
    stages: int,
    batch: int,
    layer_flops: float,
    activation_bytes: float,
) -> tuple[int, tuple[Estimate, ...]]:
    """The microbatch count with the least estimated time (NOTE [pipeline
    microbatches]), and every divisor's estimate, fewest microbatches first."""
    table = []
    for m in (d for d in range(1, batch + 1) if batch % d == 0):
        s = Schedule(kind, layers, stages, m)
        step = (s.per_visit * layer_flops / FLOPS_PER_S + activation_bytes / BYTES_PER_S) / m
        step += LATENCY_S
        table.append(Estimate(m, step, step * s.steps, s.bubble_fraction))
    best = min(e.total_s for e in table)
    chosen = max(e.microbatches for e in table if e.total_s <= best * (1 + TIE))
    return chosen, tuple(table)


def layer_flops(layer: Callable[..., Any], p_aval: Any, h_aval: Any) -> float:
    """Floating-point work of one layer on the whole batch: matmuls as 2 m n k, any
    other operation one per output element (bodies of calls and loops counted)."""
    closed = jax.make_jaxpr(layer)(p_aval, h_aval)
    return _flops(closed.jaxpr)


def _flops(jaxpr: Any) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        inner = [getattr(v, "jaxpr", v) for v in eqn.params.values()]
        bodies = [j for j in inner if isinstance(j, jp.Jaxpr)]
        if bodies:
            trips = eqn.params.get("length", 1)
            total += trips * sum(_flops(b) for b in bodies)
        elif eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            k = math.prod(lhs[d] for d in contract)
            total += 2.0 * k * sum(math.prod(v.aval.shape) for v in eqn.outvars)
        else:
            total += sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    return total


_chosen: dict[Any, tuple[int, tuple[Estimate, ...]]] = {}
_lock = threading.Lock()


def chosen_for(key: Any, compute: Callable[[], tuple[int, tuple[Estimate, ...]]]) -> Any:
    """The choice kept for ``key`` (layer, shapes, schedule), computed once."""
    with _lock:
        found = _chosen.get(key)
    if found is None:
        found = compute()
        with _lock:
            _chosen[key] = found
    return found
