"""Lowering ``id_tap_p``: a host callback in the compiled program.

The callback only copies its operands to host memory and hands them to the
receiver (NOTE [tap back pressure]); the tap function runs on the receiver's
thread. The operands are returned unchanged.

Global taps (the default) run once per execution on the program's first device,
with the global value (a MAXIMAL sharding, as jax's own callbacks), threaded on
the ordered-effect token. ``tap_with_device`` taps run on every device with its
local shard: a *partitioned* callback, whose extra first operand is an iota laid
out one element per device, so each device's callback reads its own position in
the device assignment (XLA refuses ``partition-id`` in an auto-partitioned
program). Such a callback cannot take the token (XLA's partitioner aborts), so
the receiver orders them (NOTE [device tap order]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .. import jax_private as jp
from ..lower import annotate
from ..spec.parsed import ParsedPartitionSpec
from .primitive import Tap, host_copy, id_tap_p, tap_effect, tapped
from .receiver import current

#: The mesh axis of the device-position iota of ``tap_with_device`` callbacks.
_DEVICE_AXIS = "tap_devices"


def _id_tap_lowering(
    ctx: Any,
    *args: Any,
    tap: Tap,
    nr_untapped: int,
    transforms: tuple[str, ...],
    batch_dims: tuple[int | None, ...] | None,
) -> Sequence[Any]:
    axis_ctx = ctx.module_context.axis_context
    if isinstance(axis_ctx, jp.SPMDAxisContext):
        raise ValueError(
            f"id_tap cannot be lowered inside {type(axis_ctx).__name__} (a shard_map body): "
            "tap the values outside the shard_map."
        )
    operands = tapped(args, nr_untapped)
    avals = tapped(ctx.avals_in, nr_untapped)
    devices = getattr(axis_ctx, "device_assignment", None)
    num_devices = getattr(axis_ctx, "num_devices", 1)
    if tap.with_device and num_devices > 1:
        site, local, marker_opens = _emit_device_tap(
            ctx, operands, avals, tap, transforms, batch_dims, devices
        )

        def open_round() -> None:  # the round's place in program order (NOTE [device tap order])
            if marker_opens:
                current().sequencer.open_round(site, local)

        _emit_global(ctx, [], [], open_round)
        return list(args)

    device = devices[0] if devices else None

    def on_host(*arrays: Any) -> None:
        copies = [host_copy(a) for a in arrays]
        current().sequencer.put(tap.item(copies, transforms, batch_dims, device))

    _emit_global(ctx, operands, avals, on_host)
    return list(args)


jp.register_lowering(id_tap_p, _id_tap_lowering)
# jax.jit then gives the lowering its device assignment (for ``device=``).
jp.requires_devices_during_lowering(id_tap_p)


def _emit_global(
    ctx: Any, operands: Sequence[Any], avals: Sequence[Any], on_host: Callable[..., None]
) -> None:
    """A callback run once per execution on the first device, threaded on the tap token."""

    def callback(*arrays: Any) -> tuple[()]:
        on_host(*arrays)
        return ()

    num_devices = getattr(ctx.module_context.axis_context, "num_devices", 1)
    _, token, _ = jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=list(avals), avals_out=[]),
        callback,
        ctx.tokens_in.get(tap_effect),
        list(operands),
        list(avals),
        [],
        has_side_effect=True,
        sharding=_first_device_sharding() if num_devices > 1 else None,
    )
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))


def _first_device_sharding() -> Any:
    if jp.jax_uses_shardy():
        return jp.SdyArrayList(
            (jp.SdyArray(mesh_shape=(), dim_shardings=(), logical_device_ids=(0,)),)
        )
    sharding = jp.OpSharding()
    sharding.type = jp.OpSharding.Type.MAXIMAL
    sharding.tile_assignment_dimensions = [1]
    sharding.tile_assignment_devices = [0]
    return sharding


def _emit_device_tap(
    ctx: Any,
    operands: Sequence[Any],
    avals: Sequence[Any],
    tap: Tap,
    transforms: tuple[str, ...],
    batch_dims: tuple[int | None, ...] | None,
    devices: Sequence[Any] | None,
) -> tuple[object, tuple[int, ...], bool]:
    """The partitioned callback of a ``tap_with_device`` tap.

    Returns:
        ``(site, local, marker_opens)``: the site for the sequencer, the positions of
        this process's devices, and whether the marker (which runs with the first
        device) opens the rounds here; else this process's first device does.
    """
    n = ctx.module_context.axis_context.num_devices
    # The iota's layout needs only the device count: module positions are the
    # identity (NOTE [device positions]). A lowering not told its devices (none
    # known today) still runs, with ``device=None``.
    mesh = Mesh(np.array(jax.devices()[:n] if devices is None else devices), (_DEVICE_AXIS,))
    named = [None] * n if devices is None else list(devices)
    me = jax.process_index()
    local = tuple(p for p in range(n) if devices is None or devices[p].process_index == me)
    marker_opens = 0 in local
    position_aval = jp.ShapedArray((n,), np.int32)
    positions = annotate.constrain(
        ctx,
        jp.iota(ctx, position_aval, dimension=0),
        position_aval,
        ParsedPartitionSpec.from_user_input(PartitionSpec(_DEVICE_AXIS), "id_tap"),
        mesh,
        jp.jax_uses_shardy(),
    )
    site = object()  # this callback's identity for the sequencer

    def on_host(position: Any, *arrays: Any) -> tuple[()]:
        p = int(position[0])
        copies = [host_copy(a) for a in arrays]
        sequencer = current().sequencer
        if p == local[0] and not marker_opens:
            sequencer.open_round(site, local)
        sequencer.put_shard(site, p, tap.item(copies, transforms, batch_dims, named[p]))
        return ()

    in_avals = [position_aval, *avals]
    jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=in_avals, avals_out=[]),
        on_host,
        None,
        [positions, *operands],
        in_avals,
        [],
        has_side_effect=True,
        partitioned=True,
    )
    return site, local, marker_opens
