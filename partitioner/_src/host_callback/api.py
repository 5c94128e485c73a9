"""The user's entry points: ``id_tap``, ``id_print``, the receiver's controls.

``id_tap`` checks its arguments (the errors name the pytree path), binds
``id_tap_p`` and rebuilds the caller's pytree; everything else about a tap lives
in ``primitive.py`` (rules), ``lowering.py`` (the compiled callback) and
``receiver.py`` (the queue and its thread).
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import jax_private as jp
from . import receiver
from .call import CallParams, HostCall
from .primitive import Tap, TapParams, calling_convention

logger = logging.getLogger("partitioner.host_callback")

#: Keywords the tap function receives from the library, not from ``**kwargs``.
_RESERVED = ("transforms", "batch_dims", "device")


class CallbackFlavor(enum.Enum):
    """How a callback is staged (the 2024 module's names; NOTE [callback flavors]).

    NOTE [callback flavors]: ``IO_CALLBACK`` (the default) and ``DEBUG`` are
    ordered: in program and call order with every other tap, never dropped.
    ``PURE`` declares the function free of side effects: a ``call`` may then be
    dropped when its result is unused, and runs unordered; an ``id_tap`` is the
    same whatever the flavour (a tap is its side effect).
    """

    IO_CALLBACK = 1
    PURE = 2
    DEBUG = 3


def id_tap(
    tap_func: Callable[..., Any],
    arg: Any,
    *,
    result: Any = None,
    tap_with_device: bool = False,
    device_index: int = 0,
    callback_flavor: CallbackFlavor | None = CallbackFlavor.IO_CALLBACK,
    per_shard: bool = False,
    **kwargs: Any,
) -> Any:
    """The identity on ``arg`` (or returns ``result``), calling ``tap_func`` on the host.

    ``tap_func`` runs on the receiver's thread with numpy copies of ``arg``'s
    arrays (typed PRNG keys come back as key arrays), once per execution of its
    place in the program, with the global value. Its signature picks how it is
    called (NOTE [calling conventions]). With ``tap_with_device=True`` it also gets
    ``device=``: the program's device ``device_index`` (the one the tap runs on);
    adding ``per_shard=True`` taps each device's shard on its own, once per device.
    ``kwargs`` stay in Python (any objects). Taps arrive in program order, and in
    call order across calls; :func:`barrier_wait` waits for them.

    NOTE [calling conventions]: two generations of host_callback called the tap
    function differently, and code written for either must keep working. A
    function taking a second positional argument without a default (``def
    tap(arg, transforms)``, ``def tap(arg, _)``, ``def tap(*args)``) is called as
    the 2021-2024 module did: ``tap_func(arg, transforms, **kwargs)`` (and
    ``device=``), where ``transforms`` lists the transformations, a ``vmap`` as
    ``('batch', {'batch_dims': dims})`` with one entry per tapped leaf. Any other
    function is called as the seed did: ``tap_func(arg, **kwargs)``, with
    ``transforms=`` (a tuple of names) and ``batch_dims=`` (one entry per tapped
    leaf, the outermost ``vmap``'s) when a transformation applied and the function
    takes them (by name or ``**kwargs``); a function naming ``transforms`` always
    gets it.

    Raises:
        TypeError: ``tap_func`` is not callable, a leaf of ``arg``/``result`` is not
            an array or a scalar of a jax type (the error names its path), a keyword
            is one the library passes itself, or a bad option value.
        ValueError: ``device_index`` negative or ``per_shard`` without
            ``tap_with_device``.
    """
    if not callable(tap_func):
        raise TypeError(f"id_tap: tap_func must be callable, got {tap_func!r}")
    if not isinstance(tap_with_device, bool):
        raise TypeError(f"id_tap: tap_with_device must be a bool, got {tap_with_device!r}")
    if not isinstance(per_shard, bool):
        raise TypeError(f"id_tap: per_shard must be a bool, got {per_shard!r}")
    if per_shard and not tap_with_device:
        raise ValueError(
            "id_tap: per_shard=True taps each device's shard; add tap_with_device=True"
        )
    _check_flavor(callback_flavor, "id_tap")
    _check_device_index(device_index, "id_tap")
    reserved = sorted(set(kwargs) & set(_RESERVED))
    if reserved:
        raise TypeError(
            f"id_tap: keyword(s) {reserved} are passed to the tap function by id_tap itself; "
            "rename them."
        )
    flat_args, arg_treedef = _flatten_checked(arg, "arg", "id_tap")
    key_impls = tuple(jax.random.key_impl(a) if jp.is_extended(a) else None for a in flat_args)
    operands = [jax.random.key_data(a) if jp.is_extended(a) else a for a in flat_args]
    flat_results: list[Any] = []
    result_treedef = None
    if result is not None:  # passed through, never copied
        flat_results, result_treedef = _flatten_checked(result, "result", "id_tap")
    convention, named = calling_convention(tap_func)
    tap = Tap(
        tap_func,
        kwargs,
        arg_treedef,
        with_device=tap_with_device,
        per_shard=per_shard,
        device_index=device_index,
        key_impls=key_impls,
        convention=convention,
        named=named,
    )
    outs = TapParams(tap, nr_untapped=len(flat_results)).bind(*operands, *flat_results)
    if result_treedef is not None:
        return result_treedef.unflatten(outs[len(flat_args) :])
    # A key leaf's tap saw its key data; the identity gives the key back.
    tapped = [a if impl is not None else o for a, o, impl in zip(flat_args, outs, key_impls)]
    return arg_treedef.unflatten(tapped)


def _check_flavor(flavor: Any, api: str) -> None:
    if flavor is not None and not isinstance(flavor, CallbackFlavor):
        raise TypeError(
            f"{api}: callback_flavor must be a host_callback.CallbackFlavor, got {flavor!r}"
        )


def _check_device_index(index: Any, api: str) -> None:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"{api}: device_index must be an int >= 0, got {index!r}")


def _is_jax_dtype(dtype: Any) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, np.number) or jnp.issubdtype(dtype, np.bool_))
    except TypeError:
        return False


def _flatten_checked(tree: Any, name: str, api: str) -> tuple[list[Any], Any]:
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves_with_paths:
        if jp.is_extended(leaf) or isinstance(leaf, (bool, int, float, complex)):
            continue  # typed PRNG keys, Python scalars (and jax's typed scalars)
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and hasattr(leaf, "shape") and _is_jax_dtype(dtype):
            continue
        raise TypeError(
            f"{api}: {name}{jax.tree_util.keystr(path)} must be an array or a scalar of a jax "
            f"type, got {type(leaf).__name__} {leaf!r:.80}"
        )
    return [leaf for _, leaf in leaves_with_paths], treedef


def call(
    callback_func: Callable[..., Any],
    arg: Any,
    *,
    result_shape: Any = None,
    call_with_device: bool = False,
    device_index: int = 0,
    callback_flavor: CallbackFlavor | None = CallbackFlavor.IO_CALLBACK,
) -> Any:
    """Call ``callback_func(arg)`` on the host; its result comes back into the computation.

    ``arg`` is a pytree of arrays and scalars; ``callback_func`` gets numpy copies
    (and ``device=`` with ``call_with_device=True``: the program's device
    ``device_index``, where the call runs) and returns a pytree matching
    ``result_shape`` (a pytree of ``jax.ShapeDtypeStruct``, arrays or numeric
    scalars; None: the function returns nothing and ``call`` returns None); its
    leaves may be anything jax canonicalizes to the declared dtypes (Python
    scalars, float64 for float32 with x64 off: NOTE [call results]).
    Works eagerly, under ``jax.jit`` and ``pjit``, in control flow and under
    ``vmap`` (one host call per batch element, in order). An ordered call (the
    default flavour) runs on the receiver's thread after every earlier tap
    (NOTE [callback flavors]). An error of the host function, or a result of the
    wrong structure, shape or dtype, fails the computation with a ``RuntimeError``
    (``jax.errors.JaxRuntimeError``, eagerly with the error as its ``__cause__``)
    and is raised again, as ``CallbackException``, by the next ``barrier_wait()``
    (NOTE [call errors] in ``call.py``).

    Raises:
        ValueError: a ``result_shape`` leaf without a shape and a dtype; a bad
            ``device_index``.
        TypeError: ``callback_func`` not callable; a bad ``arg`` leaf;
            ``callback_flavor=DEBUG`` (it cannot return values).
    """
    if not callable(callback_func):
        raise TypeError(
            f"host_callback.call: callback_func must be callable, got {callback_func!r}"
        )
    _check_flavor(callback_flavor, "host_callback.call")
    if callback_flavor is CallbackFlavor.DEBUG:
        raise TypeError(
            "host_callback.call: callback_flavor=DEBUG cannot return values; use IO_CALLBACK "
            "(ordered) or PURE."
        )
    _check_device_index(device_index, "host_callback.call")
    name = getattr(callback_func, "__qualname__", repr(callback_func))
    flat_args, arg_treedef = _flatten_checked(arg, "arg", f"host_callback.call({name})")
    if any(jp.is_extended(a) for a in flat_args):
        raise TypeError(
            f"host_callback.call({name}): arg holds a typed PRNG key; pass "
            "jax.random.key_data(key)."
        )
    result_leaves, result_treedef = jax.tree_util.tree_flatten(result_shape)
    result_avals = tuple(_result_aval(leaf, name) for leaf in result_leaves)

    def run(arrays: list[np.ndarray], device: Any) -> list[np.ndarray]:
        value = arg_treedef.unflatten(arrays)
        try:
            out = callback_func(value, device=device) if call_with_device else callback_func(value)
        except Exception as e:
            e.add_note(f"(raised by the host function of host_callback.call({name}))")
            raise
        return _check_results(out, result_treedef, result_avals, name)

    ordered = callback_flavor is not CallbackFlavor.PURE  # None: the default, IO_CALLBACK
    host_call = HostCall(run, result_avals, name, ordered, device_index)
    outs = CallParams(host_call).bind(*flat_args)
    return None if result_shape is None else jax.tree_util.tree_unflatten(result_treedef, outs)


def _result_aval(leaf: Any, name: str) -> Any:
    if isinstance(leaf, (bool, int, float, complex, np.number, np.bool_)):
        leaf = np.asarray(leaf)
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None or not _is_jax_dtype(dtype):
        raise ValueError(
            f"host_callback.call({name}): result_shape leaf {leaf!r:.80} is not valid. The "
            "values must be either numeric scalars, or must have 'shape' and 'dtype' "
            "attributes (e.g. jax.ShapeDtypeStruct(shape, dtype))."
        )
    return jp.ShapedArray(tuple(shape), jax.dtypes.canonicalize_dtype(dtype))


def _check_results(out: Any, treedef: Any, avals: tuple[Any, ...], name: str) -> list[np.ndarray]:
    """The host function's result as flat arrays of the declared shapes and dtypes.

    NOTE [call results]: as jax's module did, each leaf is first put in jax's
    canonical form (``jax.dtypes.canonicalize_dtype``; Python scalars take their
    jax type): with x64 off a float64 result is float32, an int64 one int32, a
    Python float float32. What is then unlike ``result_shape`` (the tree, a shape,
    a dtype that is not the canonical form of the declared one) is a real mismatch.
    """
    if not avals and out is None:
        return []
    leaves, got_tree = jax.tree_util.tree_flatten(out)
    if got_tree != treedef:
        raise TypeError(
            f"Callback func {name} of host_callback.call should have returned a result with "
            f"pytree {treedef} (as result_shape declares) but returned {got_tree}."
        )
    results = [_canonical(leaf, name, i) for i, leaf in enumerate(leaves)]
    for i, (value, aval) in enumerate(zip(results, avals, strict=True)):
        if value.shape != aval.shape or value.dtype != aval.dtype:
            raise TypeError(
                f"Callback func {name} of host_callback.call should have returned a result "
                f"with abstract values {aval.dtype}{list(aval.shape)} at result leaf {i} (as "
                f"result_shape declares) but returned {value.dtype}{list(value.shape)} (in "
                f"canonical form); return that shape and a dtype whose canonical form is "
                f"{aval.dtype} (e.g. np.asarray(x, jnp.{aval.dtype})) or fix result_shape."
            )
    return results


def _canonical(leaf: Any, name: str, i: int) -> np.ndarray:
    """``leaf`` as a numpy array of its canonical jax dtype (NOTE [call results])."""
    try:
        value = np.asarray(leaf)  # a Python scalar takes numpy's 64-bit type, as in jax
        dtype = jax.dtypes.canonicalize_dtype(value.dtype)
        return value if value.dtype == dtype else value.astype(dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(
            f"Callback func {name} of host_callback.call returned {type(leaf).__name__} "
            f"{leaf!r:.80} as result leaf {i}, which is not an array or a scalar of a jax "
            f"type ({e})."
        ) from e


def id_print(
    arg: Any,
    *,
    result: Any = None,
    output_stream: Any = None,
    threshold: int | None = 1024,
    tap_with_device: bool = False,
    device_index: int = 0,
    callback_flavor: CallbackFlavor | None = CallbackFlavor.IO_CALLBACK,
    per_shard: bool = False,
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
        device_index=device_index,
        callback_flavor=callback_flavor,
        per_shard=per_shard,
        output_stream=output_stream,
        threshold=1024 if threshold is None else threshold,
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
        CallbackException: (also named ``TapFunctionException``) a tap function or a
            ``call``'s host function raised since the last barrier (the first error
            is the cause, the last one is in the message; all were logged).
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
    backends: Sequence[str] | None = None,
    devices: Sequence[Any] | None = None,
    max_queue_bytes: int = receiver.DEFAULT_MAX_QUEUE_BYTES,
) -> Iterator[None]:
    """A receiver for the block: taps inside run through it; at exit it drains and stops.

    Not needed (the first tap starts a receiver), but gives a queue cap and a
    timeout for the block, and a point where every tap of the block has run. After
    it, the next tap starts a receiver with the defaults again.

    ``backends`` / ``devices`` (the seed's): accepted and checked; taps from every
    device reach the one receiver whatever they say (there is no per-device outfeed
    to listen to).

    Raises:
        TypeError, ValueError: a bad ``max_queue_bytes`` / ``timeout_sec`` /
            ``backends`` / ``devices``, or a nested ``outfeed_receiver()``.
        CallbackException: at exit, a tap or call function raised.
    """
    global _in_context
    if _in_context:
        raise ValueError("outfeed_receiver(): already inside an outfeed_receiver() block")
    if not isinstance(receiver_name, str):
        raise TypeError(f"outfeed_receiver: receiver_name must be a str, got {receiver_name!r}")
    _check_listen_to(backends, devices)
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
        except receiver.CallbackException as e:  # do not mask the block's own error
            logger.error("outfeed_receiver: at exit: %s (cause: %r)", e, e.__cause__)
        raise
    _in_context = False
    receiver.stop()


def _check_listen_to(backends: Sequence[str] | None, devices: Sequence[Any] | None) -> None:
    if backends and devices:
        raise ValueError("outfeed_receiver: at most one of `devices` or `backends` must be given.")
    for backend in backends or ():
        try:
            jax.devices(backend)
        except RuntimeError as e:
            raise ValueError(
                f"outfeed_receiver: backends: unknown backend {backend!r} ({e})"
            ) from e
    for device in devices or ():
        if not isinstance(device, jax.Device):
            raise TypeError(f"outfeed_receiver: devices must be jax.Device objects, got {device!r}")


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
