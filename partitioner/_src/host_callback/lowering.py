"""Lowering ``id_tap_p`` and ``call_p``: host callbacks in the compiled program.

A tap's callback only copies its operands to host memory and hands them to the
receiver (NOTE [tap back pressure]); the tap function runs on the receiver's
thread. The operands are returned unchanged.

Global taps (the default, ``tap_with_device`` too) run once per execution on the
program's device ``device_index`` with the global value (a MAXIMAL sharding, as
jax's own callbacks), threaded on the ordered-effect token. ``per_shard`` taps run
on every device with its local shard: a *partitioned* callback, whose extra first
operand is an iota laid out one element per device, so each device's callback
reads its own position in the device assignment (XLA refuses ``partition-id`` in
an auto-partitioned program). Such a callback cannot take the token (XLA's
partitioner aborts), so the receiver orders them (NOTE [device tap order]).
Inside a fully manual region (a ``pmap`` body) every device taps its own block
(NOTE [taps in manual regions]). ``call_p`` lowers the same ways, with results.
The while loop's lowering is ours for one case: NOTE [tap in a batched while
condition].
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
from ..sharding.parsed import ParsedPartitionSpec
from .call import CallParams, HostCall, call_p
from .primitive import Tap, TapEffect, TapParams, host_copy, id_tap_p, tap_effect
from .receiver import current

#: The mesh axis of the device-position iota of ``tap_with_device`` callbacks.
_DEVICE_AXIS = "tap_devices"


def _id_tap_lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    p = TapParams.of(kwargs)
    tap, dims = p.tap, p.shown_batch_dims()
    axis_ctx = ctx.module_context.axis_context
    if isinstance(axis_ctx, jp.SPMDAxisContext):
        _emit_manual_tap(ctx, p.tapped(args), p.tapped(ctx.avals_in), p)
        return list(args)
    operands = p.tapped(args)
    avals = p.tapped(ctx.avals_in)
    devices = getattr(axis_ctx, "device_assignment", None)
    num_devices = getattr(axis_ctx, "num_devices", 1)
    index = check_device_index(tap.device_index, num_devices, "id_tap")
    if tap.with_device and tap.per_shard and num_devices > 1:
        site, local, marker_opens = _emit_device_tap(
            ctx, operands, avals, tap, p.transforms, dims, devices
        )

        def open_round() -> None:  # the round's place in program order (NOTE [device tap order])
            if marker_opens:
                current().sequencer.open_round(site, local)

        _emit_global(ctx, [], [], open_round, index)
        return list(args)

    device = devices[index] if devices else None

    def on_host(*arrays: Any) -> None:
        copies = [host_copy(a) for a in arrays]
        current().sequencer.put(tap.item(copies, p.transforms, dims, device))

    _emit_global(ctx, operands, avals, on_host, index)
    return list(args)


def _emit_manual_tap(ctx: Any, operands: Sequence[Any], avals: Sequence[Any], p: TapParams) -> None:
    """A tap in a region each device runs on its own block (a ``pmap`` body).

    NOTE [taps in manual regions]: the program has per-device semantics there, so
    each device taps its block, with ``device=`` its own device (found from its
    position along the region's axes), in program order on that device: the
    region threads the tap token through its body. Devices run concurrently;
    their taps interleave as they arrive (the module's did too).
    """
    tap, dims = p.tap, p.shown_batch_dims()
    pos, devices = _device_position(ctx, "id_tap")

    def on_host(where: Any, *arrays: Any) -> tuple[()]:
        copies = [host_copy(a) for a in arrays]
        current().sequencer.put(tap.item(copies, p.transforms, dims, devices[int(where)]))
        return ()

    in_avals = [_POSITION, *avals]
    has_token = tap_effect in ctx.tokens_in.effects()
    _, token, _ = jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=in_avals, avals_out=[]),
        on_host,
        ctx.tokens_in.get(tap_effect) if has_token else None,
        [pos, *operands],
        in_avals,
        [],
        has_side_effect=True,
        sharding=jp.manual_callback_sharding([]),
    )
    if has_token:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))


_POSITION = jp.ShapedArray((), np.int32)


def _device_position(ctx: Any, api: str) -> tuple[Any, list[Any]]:
    """In a fully manual region: each device's position in the mesh, and the mesh's devices."""
    axis_ctx = ctx.module_context.axis_context
    mesh = axis_ctx.mesh
    if set(axis_ctx.manual_axes) != set(mesh.axis_names):
        raise ValueError(
            f"{api} inside a region manual over axes {sorted(axis_ctx.manual_axes)} of a mesh "
            f"with axes {list(mesh.axis_names)} (a pmap body around a nested pmap, or a "
            f"shard_map over some axes): call {api} inside the innermost pmap, or outside "
            "the region."
        )
    names, shape = tuple(mesh.axis_names), tuple(mesh.shape.values())

    def position() -> Any:
        index = jax.numpy.int32(0)
        for name, size in zip(names, shape, strict=True):
            index = index * size + jax.lax.axis_index(name)
        return index

    (pos,) = jp.lower_fun(position, multiple_results=False)(
        ctx.replace(primitive=None, avals_in=[], avals_out=[_POSITION])
    )
    return pos, list(mesh.devices.flat)


def check_device_index(index: int, num_devices: int, api: str) -> int:
    """``index``, checked against the program's device count."""
    if index >= num_devices:
        raise ValueError(
            f"{api}: device_index={index} but the program runs on {num_devices} device(s); "
            f"pass a device_index below {num_devices}."
        )
    return index


jp.register_lowering(id_tap_p, _id_tap_lowering)
# jax.jit then gives the lowering its device assignment (for ``device=``).
jp.requires_devices_during_lowering(id_tap_p)


def _emit_global(
    ctx: Any,
    operands: Sequence[Any],
    avals: Sequence[Any],
    on_host: Callable[..., None],
    device_index: int = 0,
) -> None:
    """A callback run once per execution on one device, threaded on the tap token."""

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
        sharding=device_sharding(device_index) if num_devices > 1 else None,
    )
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))


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


def _call_lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    hc = CallParams.of(kwargs).call
    axis_ctx = ctx.module_context.axis_context
    if isinstance(axis_ctx, jp.SPMDAxisContext):
        return _manual_call(ctx, args, hc)
    devices = getattr(axis_ctx, "device_assignment", None)
    num_devices = getattr(axis_ctx, "num_devices", 1)
    index = check_device_index(hc.device_index, num_devices, f"host_callback.call({hc.name})")
    device = devices[index] if devices else None

    def callback(*arrays: Any) -> tuple[np.ndarray, ...]:
        return tuple(hc.on_host(arrays, device))

    results, token, _ = jp.emit_python_callback(
        ctx,
        callback,
        ctx.tokens_in.get(tap_effect) if hc.ordered else None,
        list(args),
        list(ctx.avals_in),
        list(hc.result_avals),
        has_side_effect=hc.ordered,
        sharding=device_sharding(index, len(hc.result_avals)) if num_devices > 1 else None,
    )
    if hc.ordered:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))
    return list(results)


jp.register_lowering(call_p, _call_lowering)
jp.requires_devices_during_lowering(call_p)


# --- while loops with a tap in a batched condition ---

_jax_while_lowering = jp.registered_lowering(jp.while_p)


def _while_lowering(
    ctx: Any,
    *args: Any,
    cond_jaxpr: Any,
    body_jaxpr: Any,
    cond_nconsts: int,
    body_nconsts: int,
) -> Sequence[Any]:
    """jax's while lowering, except for a tap in the condition of a ``vmap``-ed loop.

    NOTE [tap in a batched while condition]: under ``vmap`` a loop whose condition
    is batched runs until no element's condition holds, and each iteration keeps
    the carry of the elements already done (a select on the per-element
    condition). jax 0.10.2 lowers a condition with an ordered effect into the body,
    and there drops that select: every element runs every iteration, a silently
    wrong result. This lowering keeps the select (the taps then see what the seed's
    showed: the condition once per iteration, the body on every element).
    """
    pred_aval = cond_jaxpr.out_avals[0]
    if not pred_aval.shape or not any(isinstance(e, TapEffect) for e in cond_jaxpr.effects):
        return _jax_while_lowering(
            ctx,
            *args,
            cond_jaxpr=cond_jaxpr,
            body_jaxpr=body_jaxpr,
            cond_nconsts=cond_nconsts,
            body_nconsts=body_nconsts,
        )
    cond_consts = list(args[:cond_nconsts])
    body_consts = list(args[cond_nconsts : cond_nconsts + body_nconsts])

    def loop(*values: Any) -> list[Any]:
        c_consts, b_consts = values[:cond_nconsts], values[cond_nconsts : len(consts)]
        carry = list(values[len(consts) :])

        def pred_of(carry: list[Any]) -> Any:
            return jp.eval_closed_jaxpr(cond_jaxpr, *c_consts, *carry)[0]

        def step(state: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
            pred, old = state
            new = jp.eval_closed_jaxpr(body_jaxpr, *b_consts, *old)
            kept = [_select_batched(pred, n, o) for n, o in zip(new, old, strict=True)]
            return pred_of(kept), kept

        _, out = jax.lax.while_loop(lambda s: s[0].any(), step, (pred_of(carry), carry))
        return out

    consts = cond_consts + body_consts
    return jp.lower_fun(loop, multiple_results=True)(ctx, *args)


def _select_batched(pred: Any, new: Any, old: Any) -> Any:
    """``new`` where the (leading-dims) ``pred`` holds, else ``old``."""
    mask = jax.lax.broadcast_in_dim(pred, new.shape, tuple(range(pred.ndim)))
    return jax.lax.select(mask, new, old)


jp.register_lowering(jp.while_p, _while_lowering)


def _manual_call(ctx: Any, args: Sequence[Any], hc: HostCall) -> Sequence[Any]:
    """A ``call`` each device of a fully manual region (a ``pmap`` body) makes on its block."""
    pos, devices = _device_position(ctx, f"host_callback.call({hc.name})")

    def callback(where: Any, *arrays: Any) -> tuple[np.ndarray, ...]:
        return tuple(hc.on_host(arrays, devices[int(where)]))

    in_avals = [_POSITION, *ctx.avals_in]
    threaded = hc.ordered and tap_effect in ctx.tokens_in.effects()
    results, token, _ = jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=in_avals),
        callback,
        ctx.tokens_in.get(tap_effect) if threaded else None,
        [pos, *args],
        in_avals,
        list(hc.result_avals),
        has_side_effect=hc.ordered,
        sharding=jp.manual_callback_sharding(list(hc.result_avals)),
    )
    if threaded:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))
    return list(results)
