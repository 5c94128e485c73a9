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
Inside a manual region (a ``pmap`` body) every device taps its own block
(``manual.py``: NOTE [taps in manual regions]). ``call_p`` lowers the same ways, with results.
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
from ..lower import tokens as tokens_lib
from ..sharding.parsed import ParsedPartitionSpec
from . import manual
from .call import CallParams
from .primitive import Tap, TapEffect, TapParams, host_copy, tap_effect
from .receiver import current

#: The mesh axis of the device-position iota of ``tap_with_device`` callbacks.
_DEVICE_AXIS = "tap_devices"


def id_tap_lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    p = TapParams.of(kwargs)
    tap, dims = p.tap, p.shown_batch_dims()
    if manual.is_manual(ctx):
        manual.emit_tap(ctx, p.tapped(args), p.tapped(ctx.avals_in), p)
        return list(args)
    axis_ctx = ctx.module_context.axis_context
    operands = p.tapped(args)
    avals = p.tapped(ctx.avals_in)
    devices = getattr(axis_ctx, "device_assignment", None)
    num_devices = getattr(axis_ctx, "num_devices", 1)
    index = check_device_index(tap.device_index, num_devices, "id_tap")
    if tap.with_device and tap.per_shard and num_devices > 1:
        site, local, marker_opens = _emit_device_tap(
            ctx, operands, avals, tap, p.transforms, dims, devices
        )

        def open_round() -> tuple[
            ()
        ]:  # the round's place in program order (NOTE [device tap order])
            if marker_opens:
                current().sequencer.open_round(site, local)
            return ()

        _emit_global(ctx, [], [], open_round, index)
        return list(args)

    make = tap.site(p.transforms, dims, devices[index] if devices else None)

    def on_host(*arrays: Any) -> tuple[()]:  # NOTE [tap speed] in receiver.py
        current().sequencer.put(make([host_copy(a) for a in arrays]))
        return ()

    _emit_global(ctx, operands, avals, on_host, index)
    return list(args)


def check_device_index(index: int, num_devices: int, api: str) -> int:
    """``index``, checked against the program's device count."""
    if index >= num_devices:
        raise ValueError(
            f"{api}: device_index={index} but the program runs on {num_devices} device(s); "
            f"pass a device_index below {num_devices}."
        )
    return index


def _emit_global(
    ctx: Any,
    operands: Sequence[Any],
    avals: Sequence[Any],
    on_host: Callable[..., tuple[()]],
    device_index: int = 0,
) -> None:
    """A callback ``on_host(*arrays) -> ()`` run once per execution on one device, threaded
    on the tap token."""
    num_devices = getattr(ctx.module_context.axis_context, "num_devices", 1)
    _, token, _ = jp.emit_python_callback(
        dataclasses.replace(ctx, avals_in=list(avals), avals_out=[]),
        on_host,
        ctx.tokens_in.get(tap_effect),
        list(operands),
        list(avals),
        [],
        has_side_effect=True,
        sharding=tokens_lib.device_sharding(device_index) if num_devices > 1 else None,
    )
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))


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
    makers = [tap.site(transforms, batch_dims, device) for device in named]

    def on_host(position: Any, *arrays: Any) -> tuple[()]:
        p = int(position[0])
        copies = [host_copy(a) for a in arrays]
        sequencer = current().sequencer
        if p == local[0] and not marker_opens:
            sequencer.open_round(site, local)
        sequencer.put_shard(site, p, makers[p](copies))
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


def call_lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    hc = CallParams.of(kwargs).call
    if manual.is_manual(ctx):
        return manual.manual_call(ctx, args, hc)
    axis_ctx = ctx.module_context.axis_context
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
        sharding=tokens_lib.device_sharding(index, len(hc.result_avals))
        if num_devices > 1
        else None,
    )
    if hc.ordered:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet({tap_effect: token})))
    return list(results)


# --- while loops with a tap in a batched condition ---

# jax's own, read when this module is imported: ``registry.py`` imports it before it
# installs :func:`while_lowering` in its place.
_jax_while_lowering = jp.registered_lowering(jp.while_p)


def while_lowering(
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
