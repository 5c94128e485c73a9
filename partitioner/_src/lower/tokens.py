"""Effect tokens of partially manual Shardy regions: carried as int32 scalars.

NOTE [tokens as data in partial manual regions]: XLA's Shardy export cannot give
a token a sharding in a region manual over only some mesh axes (the body of a
``pmap`` around a nested one): it builds a subgroup sharding, which a token has
no dimensions for, and aborts the process. So, under Shardy, from such a region
inward (the regions nested in it too) the ordered-effect "tokens" are int32
scalars, *carriers*: each tap's callback takes the carrier as an operand and
returns the next one, so taps are ordered by data dependence as they would be
by tokens. Where a real token meets a carrier (entering the outermost such
region, and leaving it), a tiny host callback on the program's first device
turns one into the other, in order with the taps outside. (An
``optimization_barrier`` would not do: XLA removes barriers before it
schedules, and a carrier made by one loses its dependence.) GSPMD needs none of
this: its tokens stay tokens.

What threads tokens there must take carriers: taps and calls
(``host_callback/manual.py``) and nested ``pmap`` regions do; jax's control flow
and calls do not (they declare token types), and GSPMD's partitioner aborts on
a per-device tap in a loop of such a region: :func:`check_partial_body` refuses
an ordered effect anywhere but at the top level of a partially manual region's
body (or in the maps nested in it), with a clear error, under both partitioners.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import jax_private as jp
from ..primitives.pmap_region import pmap_region_p

#: The carrier's type: an int32 scalar.
CARRIER_AVAL = jp.ShapedArray((), np.int32)


def is_carrier(value: Any) -> bool:
    """Whether the ``tokens_in`` entry ``value`` is a carrier rather than a token."""
    return value.type != jp.token_type()


def carried_inside(axis_ctx: Any) -> bool:
    """Whether tokens are carriers in a region lowered under ``axis_ctx`` (NOTE above)."""
    return (
        jp.jax_uses_shardy()
        and isinstance(axis_ctx, jp.SPMDAxisContext)
        and set(axis_ctx.manual_axes) != set(axis_ctx.mesh.axis_names)
    )


def _zero() -> tuple[np.ndarray]:
    return (np.zeros((), np.int32),)


def to_carrier(ctx: Any, token: Any) -> tuple[Any, Any]:
    """``(carrier, token out)``: a carrier that exists once ``token``'s effects have run."""
    (carrier,), token, _ = jp.emit_python_callback(
        ctx.replace(avals_in=[], avals_out=[CARRIER_AVAL]),
        _zero,
        token,
        [],
        [],
        [CARRIER_AVAL],
        has_side_effect=True,
        sharding=_on_first_device(ctx, 1),
    )
    return carrier, token


def from_carrier(ctx: Any, token: Any, carrier: Any) -> Any:
    """``token`` continued once ``carrier`` exists (the effects it carries have run)."""
    _, token, _ = jp.emit_python_callback(
        ctx.replace(avals_in=[CARRIER_AVAL], avals_out=[]),
        lambda _: (),
        token,
        [carrier],
        [CARRIER_AVAL],
        [],
        has_side_effect=True,
        sharding=_on_first_device(ctx, 0),
    )
    return token


def _on_first_device(ctx: Any, num_results: int) -> Any:
    if getattr(ctx.module_context.axis_context, "num_devices", 1) <= 1:
        return None
    return device_sharding(0, num_results)


def device_sharding(index: int, num_results: int = 0) -> Any:
    """The sharding that runs a callback on the program's device ``index`` alone.

    Shardy wants one entry per result (at least one), as jax's own callbacks give.
    """
    if jp.jax_uses_shardy():
        one = jp.SdyArray(mesh_shape=(), dim_shardings=(), logical_device_ids=(index,))
        return jp.SdyArrayList((one,) * max(1, num_results))
    sharding = jp.OpSharding()
    sharding.type = jp.OpSharding.Type.MAXIMAL
    sharding.tile_assignment_dimensions = [1]
    sharding.tile_assignment_devices = [index]
    return sharding


def enter(
    ctx: Any, values: list[Any], carried: bool
) -> tuple[list[Any], Callable[[list[Any]], list[Any]]]:
    """What a region threads in place of ``values`` (its tokens in), and the way back.

    Args:
        ctx: the lowering context outside the region.
        values: the tokens (or carriers) outside.
        carried: whether tokens are carriers inside (:func:`carried_inside`).

    Returns:
        ``(inside, leave)``: the values to thread through the region (carriers
        where ``carried`` or where ``values`` already are), and the function
        turning the region's threaded results into the values that follow it
        (emitted in ``ctx``, after the region).
    """
    if not carried or any(is_carrier(v) for v in values):
        return list(values), list
    pairs = [to_carrier(ctx, v) for v in values]

    def leave(results: list[Any]) -> list[Any]:
        return [from_carrier(ctx, t, c) for (_, t), c in zip(pairs, results, strict=True)]

    return [c for c, _ in pairs], leave


def check_partial_body(jaxpr: Any, name: str, manual: Any, axes: Any) -> None:
    """Refuse taps nested in control flow or calls of a partially manual region's body.

    Raises:
        ValueError: an equation other than a nested ``pmap`` holds an ordered effect
            (a tap) in a sub-computation (NOTE above).
    """
    for eqn in jaxpr.eqns:
        if eqn.primitive is pmap_region_p or not any(jp.jaxprs_in_params(eqn.params)):
            continue
        if list(jp.ordered_effects.filter_in(eqn.effects)):
            raise ValueError(
                f"pmap {name}: an id_tap (or host_callback.call) inside "
                f"`{eqn.primitive.name}` in a body manual over only axes {sorted(manual)} of "
                f"the mesh's {list(axes)} (the body of a pmap around a nested pmap): XLA "
                "cannot order a per-device tap there. Tap outside the loop or call, or "
                "inside the inner pmap."
            )
