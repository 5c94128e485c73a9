"""``id_tap_p``: the identity on its operands, with a tap on the way (seed 003).

The primitive carries a :class:`Tap` (the tap function and its Python kwargs,
compared by identity so any objects may ride along) and the transformations
applied so far. Its effect is *ordered* and *shardable*: XLA may partition the
program around it, and taps keep program and call order (the ordered-effect
token, NOTE [device tap order] in ``receiver.py``).

Transformation rules (the seed's, names kept): ``vmap`` taps the batched value
with ``'batch'`` appended and ``batch_dims=``; ``jvp`` taps the primals as before
and the tangents with ``'jvp'``; transposing a tangent tap taps the cotangents
with ``'transpose'`` appended, so ``grad`` shows ``('jvp', 'transpose')``.

NOTE [taps under checkpoint]: jax's partial evaluation runs an effectful
equation whose inputs are known in the forward (known) pass and saves its
outputs; ``jax.checkpoint`` therefore never re-runs a forward tap in the backward
pass, whatever the policy. Only the cotangent taps run there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .. import jax_private as jp
from . import receiver


class TapEffect(jp.Effect):
    """The ordered, shardable effect of a tap."""

    def __str__(self) -> str:
        return "Tap"


tap_effect = TapEffect()
for _registry in (
    jp.ordered_effects,
    jp.shardable_ordered_effects,
    jp.lowerable_effects,
    jp.control_flow_allowed_effects,
    jp.remat_allowed_effects,
    jp.custom_derivatives_allowed_effects,
    jp.partial_eval_kept_effects,
):
    _registry.add_type(TapEffect)


@dataclass(frozen=True, eq=False)
class Tap:
    """What to call on the host: ``func(arg, transforms=..., **kwargs)``.

    Compared by identity (``eq=False``): kwargs may hold any Python objects,
    hashable or not, and two ``id_tap`` calls are two taps.
    """

    func: Callable[..., Any]
    kwargs: dict[str, Any]
    arg_treedef: Any
    with_device: bool

    def item(
        self,
        arrays: Sequence[np.ndarray],
        transforms: tuple[str, ...],
        batch_dims: tuple[int | None, ...] | None,
        device: Any = None,
    ) -> receiver.TapItem:
        """The queue item calling the tap function on host copies ``arrays``."""
        extra: dict[str, Any] = {"transforms": transforms}
        if batch_dims is not None:
            extra["batch_dims"] = batch_dims
        if self.with_device:
            extra["device"] = device
        arg = self.arg_treedef.unflatten(arrays)

        def run() -> None:
            self.func(arg, **extra, **self.kwargs)

        return receiver.TapItem(run, sum(a.nbytes for a in arrays))

    def __repr__(self) -> str:
        name = getattr(self.func, "__qualname__", repr(self.func))
        return f"Tap({name}{', with_device' if self.with_device else ''})"


id_tap_p = jp.Primitive("id_tap")
id_tap_p.multiple_results = True


def host_copy(x: Any) -> np.ndarray:
    """A host array the tap owns (device buffers may be reused or donated after the call).

    jaxlib hands host callbacks fresh numpy arrays that own their memory: those are
    kept as they are, which saves a copy per tap (a third of a 1 MiB tap's time).
    """
    if isinstance(x, np.ndarray) and x.flags.owndata:
        return x
    return np.array(x, copy=True)


def tapped(args: Sequence[Any], nr_untapped: int) -> Sequence[Any]:
    """The operands passed to the tap function (the last ``nr_untapped`` are not)."""
    return args[: len(args) - nr_untapped]


# --- evaluation ---


def _id_tap_impl(
    *args: Any,
    tap: Tap,
    nr_untapped: int,
    transforms: tuple[str, ...],
    batch_dims: tuple[int | None, ...] | None,
) -> Sequence[Any]:
    # An eager tap comes after the taps of every program launched before it.
    rec = receiver.current()
    if not rec.in_consumer():
        jax.effects_barrier()
    values = tapped(args, nr_untapped)
    if not tap.with_device:
        rec.sequencer.put(tap.item([host_copy(v) for v in values], transforms, batch_dims))
        return args
    for device, shards in _shards_by_device(values):
        rec.sequencer.put(tap.item(shards, transforms, batch_dims, device))
    return args


def _shards_by_device(values: Sequence[Any]) -> list[tuple[Any, list[np.ndarray]]]:
    """``(device, each value's shard there)`` for every device holding one of ``values``.

    A value not on a device (a numpy array, a Python scalar) is whole on each.
    """
    on_device = [v for v in values if isinstance(v, jax.Array)]
    devices = sorted(
        {s.device for v in on_device for s in v.addressable_shards}, key=lambda d: d.id
    )
    if not devices:
        return [(None, [host_copy(v) for v in values])]
    found = []
    for device in devices:
        shards = []
        for v in values:
            local = (
                [s.data for s in v.addressable_shards if s.device == device]
                if isinstance(v, jax.Array)
                else []
            )
            shards.append(host_copy(local[0] if local else v))
        found.append((device, shards))
    return found


id_tap_p.def_impl(_id_tap_impl)


def _id_tap_abstract_eval(*avals: Any, **params: Any) -> tuple[list[Any], set[Any]]:
    del params
    return list(avals), {tap_effect}


id_tap_p.def_effectful_abstract_eval(_id_tap_abstract_eval)


# --- batching ---


def _id_tap_batcher(
    args: Sequence[Any], dims: Sequence[int | None], *, nr_untapped: int, **params: Any
) -> tuple[Sequence[Any], Sequence[int | None]]:
    batch_dims = tuple(dims)  # None: that operand is not batched
    params = dict(params, transforms=(*params["transforms"], "batch"))
    params["batch_dims"] = tuple(tapped(batch_dims, nr_untapped))
    return id_tap_p.bind(*args, nr_untapped=nr_untapped, **params), dims


jp.primitive_batchers[id_tap_p] = _id_tap_batcher


# --- jvp ---


def _id_tap_jvp(
    primals: Sequence[Any], tangents: Sequence[Any], *, nr_untapped: int, **params: Any
) -> tuple[Sequence[Any], Sequence[Any]]:
    # Two taps, so partial evaluation keeps the primal one in the forward pass and
    # stages the tangent one (its transpose taps the cotangents). The tangents of
    # untapped operands (``result=``) pass by: they may be float0 (PRNG keys).
    primals_out = id_tap_p.bind(*primals, nr_untapped=nr_untapped, **params)
    n = len(primals) - nr_untapped
    tapped_tangents = [jp.instantiate_zeros(t) for t in tangents[:n]]
    tangents_out = id_tap_p.bind(*tapped_tangents, nr_untapped=0, **_with_transform(params, "jvp"))
    return primals_out, [*tangents_out, *tangents[n:]]


jp.primitive_jvps[id_tap_p] = _id_tap_jvp


def _with_transform(params: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(params, transforms=(*params["transforms"], name))


# --- transpose ---


def _id_tap_transpose(cts: Sequence[Any], *args: Any, **params: Any) -> Sequence[Any]:
    # Every operand of a tangent tap is linear: the identity's transpose is the
    # identity, tapped.
    del args
    cts = [jp.instantiate_zeros(ct) for ct in cts]
    return id_tap_p.bind(*cts, **_with_transform(params, "transpose"))


jp.primitive_transposes[id_tap_p] = _id_tap_transpose
