"""``call_p``: a host function whose result comes back into the computation.

The counterpart of ``id_tap_p`` for :func:`partitioner.host_callback.call`. An
ordered call (the default flavour) carries the tap effect, so it keeps program
and call order with the taps, and runs on the receiver's thread after every tap
before it (``Receiver.call``); a ``PURE`` call has no effect: it runs on the
thread XLA calls it from, and XLA may drop it when its result is unused.

``vmap`` runs the host function once per batch element, in order, and stacks the
results (the 2024 module's ``PURE`` behaviour). There is no derivative: the
host function is opaque (``jax.custom_vjp`` around ``call`` gives one).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from .. import jax_private as jp
from ..trace.params import PrimitiveParams
from . import receiver
from .primitive import host_copy, tap_effect

#: ``(flat host arrays, device) -> flat results``, checked against the declared avals.
HostFunction = Callable[[list[np.ndarray], Any], list[np.ndarray]]


@dataclasses.dataclass(frozen=True, eq=False)
class HostCall:
    """One ``call`` site: the host function and what it returns.

    Compared by identity (``eq=False``), as a :class:`~.primitive.Tap`.

    Attributes:
        run: the host function on flat arrays (it checks the results).
        result_avals: the declared results.
        name: the user's function, for messages.
        ordered: in program order with the taps (else ``PURE``).
        device_index: the program's device that runs it.
    """

    run: HostFunction
    result_avals: tuple[Any, ...]
    name: str
    ordered: bool
    device_index: int

    def on_host(self, arrays: Sequence[Any], device: Any) -> list[np.ndarray]:
        """Run the host function on host copies of ``arrays`` (ordered: on the receiver).

        NOTE [call errors]: the 2021-2024 module's protocol. An error of the host
        function (or a result unlike ``result_shape``) fails the computation, a
        ``RuntimeError`` (``jax.errors.JaxRuntimeError``: XLA's compiled, ours
        eagerly), and is kept for the next ``barrier_wait()``, which raises
        ``CallbackException`` with the error as its cause.
        """
        copies = [host_copy(a) for a in arrays]
        rec = receiver.current()
        try:
            if not self.ordered:
                return self.run(copies, device)
            return rec.call(lambda: self.run(copies, device))
        except Exception as e:
            rec.record_error(e, f"host_callback.call({self.name})")
            raise


call_p = jp.Primitive("outside_call")
call_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class CallParams(PrimitiveParams):
    """The parameters of one ``call_p`` equation: its :class:`HostCall`."""

    primitive: ClassVar[Any] = call_p

    call: HostCall

    def check(self) -> None:
        if not isinstance(self.call, HostCall):
            raise TypeError(f"internal error: call params need a HostCall, got {self.call!r}")


# --- evaluation ---


def impl(*args: Any, **kwargs: Any) -> list[Any]:
    hc = CallParams.of(kwargs).call
    rec = receiver.current()
    if hc.ordered and not rec.in_consumer():
        jax.effects_barrier()  # after the taps of every program launched before it
    devices = (
        sorted(
            {d for a in args if isinstance(a, jax.Array) for d in a.devices()}, key=lambda d: d.id
        )
        or jax.local_devices()[:1]
    )
    device = devices[hc.device_index] if hc.device_index < len(devices) else devices[0]
    try:
        outs = hc.on_host(args, device)
    except Exception as e:  # NOTE [call errors]: what the compiled call raises
        text = "".join(traceback.format_exception_only(e)).strip()
        raise jax.errors.JaxRuntimeError(
            f"host_callback.call({hc.name}) failed: {text} (the __cause__; the next "
            "barrier_wait() raises it again as CallbackException)"
        ) from e
    return [jax.device_put(o, device) for o in outs]


def abstract_eval(*avals: Any, **kwargs: Any) -> tuple[list[Any], set[Any]]:
    del avals
    hc = CallParams.of(kwargs).call
    return list(hc.result_avals), {tap_effect} if hc.ordered else set()


# --- batching ---


def batcher(
    args: Sequence[Any], dims: Sequence[int | None], **kwargs: Any
) -> tuple[Sequence[Any], Sequence[int]]:
    hc = CallParams.of(kwargs).call
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else jax.numpy.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]

    def run(arrays: list[np.ndarray], device: Any) -> list[np.ndarray]:
        rows = [
            hc.run([a[i] if b else a for a, b in zip(arrays, batched, strict=True)], device)
            for i in range(size)
        ]
        return [
            np.stack([row[k] for row in rows]) if rows else np.zeros((0, *aval.shape), aval.dtype)
            for k, aval in enumerate(hc.result_avals)
        ]

    avals = tuple(a.update(shape=(size, *a.shape)) for a in hc.result_avals)
    outs = CallParams(dataclasses.replace(hc, run=run, result_avals=avals)).bind(*moved)
    return outs, [0] * len(outs)


# --- jvp ---


def jvp(primals: Sequence[Any], tangents: Sequence[Any], **kwargs: Any) -> Any:
    del primals, tangents
    name = CallParams.of(kwargs).call.name
    raise TypeError(
        f"host_callback.call({name}): the host function has no derivative. Give it one with "
        "jax.custom_vjp around the call (its backward pass may itself use call)."
    )
