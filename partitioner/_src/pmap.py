"""``pmap``: the map front door. A map over devices, as a pjit whose body is a pmap region.

It parses its options into a :class:`PmapInfo` (``planner/pmap_info.py``) and
wraps the function (``wrapped.py``); calls are planned by
``planner/pmap_plan.py`` (NOTE [pmap region] in ``primitives/pmap_region.py``),
and from the plan on it is pjit's pipeline: the same dispatcher, lowering and rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .planner.pmap_info import pmap_info
from .planner.pmap_plan import PmapPlanner
from .wrapped import Wrapped


class PmapWrapped(Wrapped):
    """What :func:`partitioner.pmap` returns (NOTE [pjit callable]: the same mechanics)."""

    kind = "pmap"

    def __repr__(self) -> str:
        return f"<pmap-ed function {self._planner.name}>"


def pmap(
    fun: Callable[..., Any],
    axis_name: str | None = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: int | Sequence[int] = (),
    devices: Sequence[jax.Device] | None = None,
    backend: str | None = None,
    axis_size: int | None = None,
    donate_argnums: int | Sequence[int] = (),
) -> PmapWrapped:
    """Map ``fun`` over the leading (``in_axes``) dimension of its arguments, one slice per device.

    The semantics of ``jax.pmap``: collectives over ``axis_name`` inside,
    ``in_axes``/``out_axes`` pytree prefixes with ``None`` for broadcast inputs and
    unmapped outputs, keyword arguments mapped over their leading dimension. The
    outputs are ``jax.Array``s laid out one slice per device
    (``partitioner.sharding_spec_of`` gives their ``ShardingSpec``).
    """
    info = pmap_info(
        fun,
        axis_name,
        in_axes,
        out_axes,
        static_broadcasted_argnums,
        devices,
        backend,
        axis_size,
        donate_argnums,
    )
    return PmapWrapped.make(PmapPlanner(info))
