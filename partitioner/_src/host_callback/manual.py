"""Taps and calls in manual regions: a ``pmap`` body, a ``shard_map`` over some axes.

NOTE [taps in manual regions]: a region manual over every mesh axis (a ``pmap``
body) has per-device semantics, so each device taps its block, with ``device=``
its own device (found from its position along the mesh axes), in program order
on that device: the region threads the tap token through its body. Devices run
concurrently; their taps interleave as they arrive (the module's did too).

NOTE [taps in partially manual regions]: in a region manual over only some axes
(the body of a ``pmap`` around a nested one, outside the inner map) a value is
one per index of the manual ("outer") axes, and XLA may split it over the free
("inner") ones. jax's callbacks refuse such regions; the 2021-2024 module tapped
once per outer-map device. So the tap enters a region manual over the free axes
too, with its operands replicated over them (every device of an outer index then
holds the outer block whole), as jax's ``shard_map`` lowering nests one: GSPMD by
the sharding custom calls, Shardy by a nested ``sdy.manual_computation``. Every
device runs the callback; the device at position 0 along the free axes taps,
with ``device=`` itself, and the others return at once. The tap token is
threaded through (under Shardy as data: NOTE [tokens as data in partial manual
regions] in ``lower/tokens.py``), so each outer device's taps keep program
order. ``call`` is not offered there: its result would have to come back to
every device of the outer index.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from .. import jax_private as jp
from ..lower import annotate
from ..lower import tokens as tokens_lib
from ..sharding.parsed import REPLICATED
from .call import HostCall
from .primitive import TapParams, host_copy, tap_effect
from .receiver import current

_POSITION = jp.ShapedArray((), np.int32)

#: A tap in a region manual over only some axes whose tokens are real (jax's shard_map).
_MSG_SHARDY_PARTIAL = (
    "id_tap inside a shard_map manual over only axes {manual} of a mesh with axes {axes}: "
    "under the Shardy partitioner the tap's ordered-effect token cannot enter such a "
    "region (XLA aborts). Make the shard_map manual over every axis, tap outside it, or "
    "use GSPMD (jax.config.update('jax_use_shardy_partitioner', False)). In a pmap body "
    "around a nested pmap taps work under both partitioners."
)


def is_manual(ctx: Any) -> bool:
    """Whether ``ctx`` lowers inside a manual region (a ``pmap`` body, a ``shard_map``)."""
    return isinstance(ctx.module_context.axis_context, jp.SPMDAxisContext)


def emit_tap(ctx: Any, operands: Sequence[Any], avals: Sequence[Any], p: TapParams) -> None:
    """The tap of ``operands`` in a manual region, per device (NOTE [taps in manual regions])."""
    axis_ctx = ctx.module_context.axis_context
    mesh: Mesh = axis_ctx.mesh
    free = tuple(a for a in mesh.axis_names if a not in axis_ctx.manual_axes)
    dims = p.shown_batch_dims()
    # A position taps when it is first along the free axes (all do without free axes).
    makers = [
        p.tap.site(p.transforms, dims, device) if first else None
        for device, first in zip(mesh.devices.flat, _first_along(mesh, free), strict=True)
    ]

    def on_host(where: Any, *arrays: Any) -> tuple[()]:
        make = makers[int(where)]
        if make is not None:
            current().sequencer.put(make([host_copy(a) for a in arrays]))
        return ()

    link = ctx.tokens_in.get(tap_effect) if tap_effect in ctx.tokens_in.effects() else None
    if not free:
        _, link = _emit(ctx, link, on_host, operands, avals, [])
    elif jp.jax_uses_shardy():
        if link is not None and not tokens_lib.is_carrier(link):
            raise ValueError(
                _MSG_SHARDY_PARTIAL.format(
                    manual=sorted(axis_ctx.manual_axes), axes=list(mesh.axis_names)
                )
            )
        link = _emit_in_nested_shardy(ctx, free, link, on_host, operands, avals)
    elif math.prod(mesh.shape[a] for a in free) == 1:  # nothing to gather: a block is whole
        _, link = _emit(_fully_manual(ctx), link, on_host, operands, avals, [])
    else:
        blocks = [_gspmd_replicated_block(ctx, x, a) for x, a in zip(operands, avals, strict=True)]
        _, link = _emit(_fully_manual(ctx), link, on_host, blocks, avals, [])
    if link is not None:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: link})))


def _first_along(mesh: Mesh, free: tuple[str, ...]) -> list[bool]:
    """Per mesh position (row-major over the axes): whether it is 0 along every ``free`` axis."""
    coords = np.indices(tuple(mesh.shape.values())).reshape(len(mesh.axis_names), -1)
    free_rows = [coords[i] for i, a in enumerate(mesh.axis_names) if a in free]
    return [not any(row[k] for row in free_rows) for k in range(coords.shape[1])]


def _fully_manual(ctx: Any) -> Any:
    """``ctx`` lowering as manual over every mesh axis (the nested region's inside)."""
    mesh = ctx.module_context.axis_context.mesh
    sub = ctx.module_context.replace(
        axis_context=jp.SPMDAxisContext(mesh, frozenset(mesh.axis_names))
    )
    return dataclasses.replace(ctx, module_context=sub)


def _emit(
    ctx: Any,
    link: Any,
    on_host: Callable[..., tuple[Any, ...]],
    operands: Sequence[Any],
    avals: Sequence[Any],
    result_avals: Sequence[Any],
) -> tuple[list[Any], Any]:
    """The per-device callback in a fully manual ``ctx``, ``on_host(position, *operands)``.

    ``link`` orders it after the taps before it: the tap token, or a carrier (NOTE
    [tokens as data in partial manual regions]), which the callback then takes
    and returns as data; None: unordered.

    Returns:
        ``(results, link out)``.
    """
    by_data = link is not None and tokens_lib.is_carrier(link)
    carrier = [tokens_lib.CARRIER_AVAL] if by_data else []
    in_avals = [*carrier, _POSITION, *avals]
    out_avals = [*result_avals, *carrier]

    def callback(*args: Any) -> tuple[Any, ...]:
        if not by_data:
            return on_host(*args)
        return (*on_host(*args[1:]), np.zeros((), np.int32))

    results, token, _ = jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=in_avals, avals_out=out_avals),
        callback,
        None if by_data else link,
        [*([link] if by_data else []), _device_position(ctx), *operands],
        in_avals,
        out_avals,
        has_side_effect=True,
        sharding=jp.manual_callback_sharding(out_avals),
    )
    results = list(results)
    return (results[:-1], results[-1]) if by_data else (results, token)


def _gspmd_replicated_block(ctx: Any, x: Any, aval: Any) -> Any:
    """GSPMD: ``x`` of a partially manual region, replicated over the free axes, fully manual."""
    axis_ctx = ctx.module_context.axis_context
    mesh, outer = axis_ctx.mesh, axis_ctx.manual_axes
    aval = jp.physical_aval(aval)
    ndim = len(aval.shape)
    replicated = jp.manual_scoped_op_sharding(mesh, REPLICATED.to_partition_spec(), outer, ndim)
    x = jp.wrap_with_sharding_op(ctx, x, aval, replicated, unspecified_dims=set())
    every_axis = jp.manual_proto(aval, frozenset(mesh.axis_names), mesh)
    return jp.wrap_with_full_to_shard_op(ctx, x, aval, every_axis, set())


def _emit_in_nested_shardy(
    ctx: Any,
    free: tuple[str, ...],
    link: Any,
    on_host: Callable[..., tuple[()]],
    operands: Sequence[Any],
    avals: Sequence[Any],
) -> Any:
    """Shardy: the callback in an ``sdy.manual_computation`` over the free axes.

    Its operands enter replicated over them, ``link`` (a carrier here: NOTE
    [tokens as data in partial manual regions]) with them; returns the next one.
    """
    mesh = ctx.module_context.axis_context.mesh
    symbol = annotate.ensure_sdy_mesh(ctx.module_context.module, mesh)
    carrier_type = jp.aval_to_ir_type(ctx.module_context, tokens_lib.CARRIER_AVAL)
    links = [] if link is None else [link]
    ranks = [0] * len(links) + [len(jp.physical_aval(a).shape) for a in avals]

    def replicated(ndims: Sequence[int]) -> Any:
        return jp.TensorShardingPerValueAttr.get(
            [annotate.sdy_sharding_attr(n, REPLICATED, symbol) for n in ndims]
        )

    # One result at least (XLA's export cannot convert one without): a carrier.
    op = jp.ManualComputationOp(
        [carrier_type],
        [*links, *operands],
        replicated(ranks),
        replicated([0]),
        jp.ManualAxesAttr.get([jp.StringAttr.get(a) for a in free]),
    )
    types = [carrier_type] * len(links) + [jp.aval_to_ir_type(ctx.module_context, a) for a in avals]
    block = jp.Block.create_at_start(op.body, types)
    args = list(block.arguments)
    with jp.InsertionPoint(block):
        inner_link = args[0] if links else None
        _, out = _emit(_fully_manual(ctx), inner_link, on_host, args[len(links) :], avals, [])
        jp.sdy_return([out] if links else [*jp.ir_constants(np.int32(0))])
    return op.results[0] if links else None


def _device_position(ctx: Any) -> Any:
    """In a fully manual ``ctx``: each device's position in the mesh (row-major over its axes).

    Its index among the program's devices, which are the mesh's in order (as jax's
    ``axis_index`` lowering takes them).
    """
    del ctx
    return jp.partition_index()


def manual_call(ctx: Any, args: Sequence[Any], hc: HostCall) -> Sequence[Any]:
    """A ``call`` each device of a fully manual region (a ``pmap`` body) makes on its block.

    Raises:
        ValueError: the region is manual over only some mesh axes (NOTE [taps in
            partially manual regions]).
    """
    axis_ctx = ctx.module_context.axis_context
    mesh = axis_ctx.mesh
    if set(axis_ctx.manual_axes) != set(mesh.axis_names):
        raise ValueError(
            f"host_callback.call({hc.name}) inside a region manual over axes "
            f"{sorted(axis_ctx.manual_axes)} of a mesh with axes {list(mesh.axis_names)} (a "
            "pmap body around a nested pmap, or a shard_map over some axes): its result would "
            "have to reach every device of the other axes; make the call inside the innermost "
            "pmap, or outside the region (id_tap works there)."
        )
    devices = list(mesh.devices.flat)

    def callback(where: Any, *arrays: Any) -> tuple[np.ndarray, ...]:
        return tuple(hc.on_host(arrays, devices[int(where)]))

    threaded = hc.ordered and tap_effect in ctx.tokens_in.effects()
    link = ctx.tokens_in.get(tap_effect) if threaded else None
    results, link = _emit(ctx, link, callback, args, ctx.avals_in, hc.result_avals)
    if threaded:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: link})))
    return results
