"""Running executables: jaxlib's C++ jit dispatcher, the results handler, ordered
effects' tokens across launches, the multi-process client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax._src import array as _array
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import tree_util as _tree_util
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import _jax
from jax.sharding import Mesh as _Mesh
from jax.sharding import NamedSharding as _NamedSharding
from jax.sharding import PartitionSpec as _P

# --- jaxlib's C++ jit dispatcher, driven by our executables ---


def cpp_dispatch_cache(capacity: int) -> Any:
    """A bounded cache for :func:`cpp_dispatcher` (``.clear()`` empties it)."""
    return _jax.PjitFunctionCache(capacity=capacity)


def cpp_dispatcher(
    name: str,
    fun: Any,
    cache_miss: Any,
    static_argnums: Any,
    static_argnames: Any,
    key: Any,
    cache: Any,
) -> Any:
    """A C++ callable that runs cached executables itself and calls ``cache_miss`` otherwise.

    ``cache_miss(*args, **kwargs)`` returns ``(outputs, fastpath_data | None, False)``.
    Each dispatcher gets its own cache, so dropping it frees its entries.
    """
    return _jax.pjit(
        name,
        fun,
        cache_miss,
        list(static_argnums),
        list(static_argnames),
        key,
        _tree_util.dispatch_registry,
        _pxla.cc_shard_arg,
        cache,
    )


def fastpath_data(
    executable: Any,
    out_tree: Any,
    in_shardings: Any,
    out_shardings: Any,
    out_avals: Any,
    committed: bool = True,
    kept: Sequence[bool] | None = None,
) -> Any:
    """What the C++ dispatcher needs to run ``executable`` without Python.

    ``in_shardings``: of the inputs the executable takes; ``kept``: one flag per
    argument of the call, whether the executable takes it (all, if None).
    """
    n = len(in_shardings)
    return _pxla.MeshExecutableFastpathData(
        executable,
        out_tree,
        list(in_shardings),
        list(out_shardings),
        list(out_avals),
        [committed] * len(out_avals),
        [True] * n if kept is None else list(kept),
        [None] * n,
        [],
    )


def dispatch_flatten(tree: Any) -> tuple[list[Any], Any]:
    """Flatten with the registry jaxlib's C++ dispatcher uses for outputs."""
    return _tree_util.dispatch_registry.flatten(tree, None)


def results_handler(avals: Any, shardings: Any, committed: bool = True) -> Any:
    """Turns an executable's per-device output buffers into jax.Arrays (committed or not)."""
    return _pxla.global_avals_to_results_handler(avals, shardings, committed=committed)


# --- runtime tokens: ordered effects across executions ---


def token_inputs(effects: Any, devices: Any) -> list[Any]:
    """The input token buffer of each ordered effect, for a launch on ``devices``.

    jax keeps, per effect, the token the last launch returned (``dispatch.runtime_tokens``),
    so launches of any program with the effect run their effects in launch order, and
    ``jax.effects_barrier()`` waits for them.
    """
    return [_dispatch.runtime_tokens.get_token_input(e, list(devices))._buf for e in effects]


def record_tokens(effects: Any, results: Any, devices: Any) -> None:
    """Take a launch's output tokens out of ``results`` (first) and make them current."""
    token_bufs = results.consume_with_handlers([lambda xs: xs] * len(effects), strict=False)
    runtime_token = results.consume_token()
    for i, device in enumerate(devices):
        _dispatch.runtime_tokens.set_output_runtime_token(device, runtime_token.get_token(i))
    for effect, bufs in zip(effects, token_bufs, strict=True):
        if len(bufs) == 1:
            token = bufs[0]
        else:
            owners = [next(iter(b.sharding.device_set)) for b in bufs]
            sharding = _NamedSharding(_Mesh(owners, "x"), _P("x"))
            token = _array.make_array_from_single_device_arrays((0,), sharding, bufs)
        _dispatch.runtime_tokens.set_token_result(effect, _core.Token(token))


# --- multi-process jobs (partitioner.distributed) ---


def distributed_client() -> Any:
    """The coordination-service client ``jax.distributed.initialize`` connected (key-value store)."""
    return _distributed.global_state.client
