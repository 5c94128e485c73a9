"""The user's entry points: ``id_tap``, ``id_print``, the receiver's controls.

``id_tap`` checks its arguments (the errors name the pytree path), binds
``id_tap_p`` and rebuilds the caller's pytree; everything else about a tap lives
in ``primitive.py`` (rules), ``lowering.py`` (the compiled callback) and
``receiver.py`` (the queue and its thread).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .. import jax_private as jp
from . import lowering as _lowering  # noqa: F401  (registers the MLIR lowering)
from . import receiver
from .primitive import Tap, id_tap_p

logger = logging.getLogger("partitioner.host_callback")

#: Keywords the tap function receives from the library, not from ``**kwargs``.
_RESERVED = ("transforms", "batch_dims", "device")


def id_tap(
    tap_func: Callable[..., Any],
    arg: Any,
    *,
    result: Any = None,
    tap_with_device: bool = False,
    **kwargs: Any,
) -> Any:
    """The identity on ``arg`` (or returns ``result``), calling ``tap_func`` on the host.

    ``tap_func(arg, transforms=(...), **kwargs)`` runs on the receiver's thread
    with numpy copies of ``arg``'s arrays: once per execution with the global value,
    or, with ``tap_with_device=True``, once per device with that device's shard and
    ``device=``. Under ``vmap`` it also gets ``batch_dims=``. ``kwargs`` stay in
    Python (any objects). Taps arrive in program order, and in call order across
    calls; :func:`barrier_wait` waits for them.

    Raises:
        TypeError: ``tap_func`` is not callable, a leaf of ``arg``/``result`` is not
            an array or a scalar (the error names its path), or a keyword is one the
            library passes itself.
    """
    if not callable(tap_func):
        raise TypeError(f"id_tap: tap_func must be callable, got {tap_func!r}")
    if not isinstance(tap_with_device, bool):
        raise TypeError(f"id_tap: tap_with_device must be a bool, got {tap_with_device!r}")
    reserved = sorted(set(kwargs) & set(_RESERVED))
    if reserved:
        raise TypeError(
            f"id_tap: keyword(s) {reserved} are passed to the tap function by id_tap itself; "
            "rename them."
        )
    flat_args, arg_treedef = _flatten_checked(arg, "arg", keys_allowed=False)
    flat_results: list[Any] = []
    result_treedef = None
    if result is not None:  # passed through, never copied: PRNG keys are fine
        flat_results, result_treedef = _flatten_checked(result, "result", keys_allowed=True)
    tap = Tap(tap_func, kwargs, arg_treedef, tap_with_device)
    outs = id_tap_p.bind(
        *flat_args,
        *flat_results,
        tap=tap,
        nr_untapped=len(flat_results),
        transforms=(),
        batch_dims=None,
    )
    if result_treedef is not None:
        return result_treedef.unflatten(outs[len(flat_args) :])
    return arg_treedef.unflatten(outs)


def _flatten_checked(tree: Any, name: str, *, keys_allowed: bool) -> tuple[list[Any], Any]:
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves_with_paths:
        where = f"{name}{jax.tree_util.keystr(path)}"
        dtype = getattr(leaf, "dtype", None)
        if jp.is_extended(leaf):
            if keys_allowed:
                continue
            raise TypeError(
                f"id_tap: {where} is a typed PRNG key array ({dtype}); tap "
                "jax.random.key_data(key) instead."
            )
        if isinstance(leaf, (bool, int, float, complex, np.generic)) and dtype is None:
            continue
        if dtype is None or not hasattr(leaf, "shape") or np.dtype(dtype).kind in "OSUV":
            raise TypeError(
                f"id_tap: {where} must be an array or a scalar, got {type(leaf).__name__} "
                f"{leaf!r:.80}"
            )
    return [leaf for _, leaf in leaves_with_paths], treedef


def id_print(
    arg: Any,
    *,
    result: Any = None,
    output_stream: Any = None,
    threshold: int = 1024,
    tap_with_device: bool = False,
    **kwargs: Any,
) -> Any:
    """Like :func:`id_tap` with a tap function that prints.

    Prints ``kwargs`` sorted by key (with ``transforms``, ``batch_dims`` and ``device``
    when there are any), then ``arg``, arrays through ``numpy.array2string(threshold=)``,
    to ``output_stream.write`` or stdout.

    Raises:
        TypeError: as :func:`id_tap`; also ``output_stream`` without a ``write``.
    """
    if output_stream is not None and not callable(getattr(output_stream, "write", None)):
        raise TypeError(
            f"id_print: output_stream must have a write(str) method, got {output_stream!r}"
        )
    return id_tap(
        _print_tap,
        arg,
        result=result,
        tap_with_device=tap_with_device,
        output_stream=output_stream,
        threshold=threshold,
        **kwargs,
    )


def _print_tap(
    arg: Any,
    *,
    transforms: tuple[str, ...],
    output_stream: Any = None,
    threshold: int = 1024,
    **kwargs: Any,
) -> None:
    if transforms:
        kwargs["transforms"] = transforms
    lines = []
    if kwargs:
        lines.append(" ".join(f"{k}: {v}" for k, v in sorted(kwargs.items())))
    lines.append(_format(arg, threshold))
    text = "\n".join(lines) + "\n"
    if output_stream is None:
        print(text, end="", flush=True)
    else:
        output_stream.write(text)


def _format(value: Any, threshold: int) -> str:
    if isinstance(value, dict):
        inner = "\n".join(f"{k}={_format(v, threshold)}" for k, v in sorted(value.items()))
        return "{ " + inner + " }"
    if isinstance(value, (tuple, list)):
        return "[ " + "\n".join(_format(v, threshold) for v in value) + " ]"
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=threshold)
    return str(value)


# --- the receiver ---


def barrier_wait(logging_name: str | None = None) -> None:
    """Return once every tap launched before the call has run.

    Raises:
        TapFunctionException: a tap function raised since the last barrier (the
            first error is the cause; all were logged).
        RuntimeError: called from inside a tap function.
    """
    name = logging_name or "barrier_wait"
    logger.debug("%s: waiting for pending taps", name)
    receiver.current().barrier()
    logger.debug("%s: done", name)


_in_context = False


@contextlib.contextmanager
def outfeed_receiver(
    *,
    receiver_name: str = "",
    timeout_sec: float = receiver.DEFAULT_TIMEOUT_SEC,
    max_queue_bytes: int = receiver.DEFAULT_MAX_QUEUE_BYTES,
) -> Iterator[None]:
    """A receiver for the block: taps inside run through it; at exit it drains and stops.

    Not needed (the first tap starts a receiver), but gives a queue cap and a
    timeout for the block, and a point where every tap of the block has run. After
    it, the next tap starts a receiver with the defaults again.

    Raises:
        TypeError, ValueError: a bad ``max_queue_bytes`` / ``timeout_sec``, or a
            nested ``outfeed_receiver()``.
        TapFunctionException: at exit, a tap function raised.
    """
    global _in_context
    if _in_context:
        raise ValueError("outfeed_receiver(): already inside an outfeed_receiver() block")
    if not isinstance(receiver_name, str):
        raise TypeError(f"outfeed_receiver: receiver_name must be a str, got {receiver_name!r}")
    receiver.restart(
        persist=False,
        name=receiver_name,
        max_queue_bytes=max_queue_bytes,
        timeout_sec=timeout_sec,
    )
    _in_context = True
    try:
        yield
    except BaseException:
        _in_context = False
        try:
            receiver.stop()
        except receiver.TapFunctionException as e:  # do not mask the block's own error
            logger.error("outfeed_receiver: at exit: %s (cause: %r)", e, e.__cause__)
        raise
    _in_context = False
    receiver.stop()


def configure_receiver(
    *, max_queue_bytes: int | None = None, timeout_sec: float | None = None
) -> None:
    """Settings for receivers started from now on (the running one is drained and replaced).

    Raises:
        TypeError, ValueError: a bad ``max_queue_bytes`` / ``timeout_sec``.
    """
    settings: dict[str, Any] = {}
    if max_queue_bytes is not None:
        settings["max_queue_bytes"] = max_queue_bytes
    if timeout_sec is not None:
        settings["timeout_sec"] = timeout_sec
    receiver.restart(persist=True, **settings)


def receiver_stats() -> dict[str, int]:
    """``taps_delivered``, ``queued_bytes``, ``peak_queued_bytes``, ``tap_exceptions``.

    Of the running receiver (all zero before the first tap starts one).
    """
    running = receiver.running()
    if running is None:
        return {"taps_delivered": 0, "queued_bytes": 0, "peak_queued_bytes": 0, "tap_exceptions": 0}
    return running.stats()
