"""Every private jax entry point partitioner uses, in one place.

Why: ``jax._src`` moves between releases. Keeping each use behind a small
function here means a jax upgrade touches one module. Nothing outside this file
imports from ``jax._src``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from jax._src import api_util, core, effects, sharding_impls, source_info_util, xla_bridge
from jax._src import array as _array
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import dtypes as _dtypes
from jax._src import linear_util as lu
from jax._src import mesh as _mesh_lib
from jax._src import stages as _stages
from jax._src import tree_util as _tree_util
from jax._src.interpreters import ad, batching, mlir, pxla
from jax._src.interpreters import partial_eval as pe
from jax._src.lib import (
    _jax,
    xla_client,  # jaxlib's OpSharding/HloSharding/CompileOptions
)
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import sdy
from jax.sharding import Mesh as _Mesh
from jax.sharding import NamedSharding as _NamedSharding
from jax.sharding import PartitionSpec as _P

# Re-exported modules: the complete list of private jax modules partitioner
# reaches into (each use elsewhere goes through this name).
__all__ = [
    "ad",
    "api_util",
    "batching",
    "core",
    "effects",
    "ir",
    "lu",
    "mlir",
    "pe",
    "pxla",
    "sdy",
    "sharding_impls",
    "source_info_util",
    "xla_bridge",
    "xla_client",
]


# Source locations jax records for equations (and XLA keeps in op metadata) name the
# user's line, not partitioner's: jax skips its own files the same way.
source_info_util.register_exclusion(os.path.dirname(__file__))


# --- the ambient mesh (shared with `with jax.sharding.Mesh(...)`) ---


def _sync_mesh_config() -> None:
    # jax keys its own caches on this config value; keep it in step exactly as
    # `Mesh.__enter__` does so jax.jit sees our mesh the way it sees its own.
    stack = _mesh_lib.thread_resources.stack
    _config.mesh_context_manager.set_local(
        tuple(t.physical_mesh for t in stack if not t.physical_mesh.empty)
    )


def push_mesh(mesh: Any) -> None:
    """Enter ``mesh`` on jax's thread-local resource stack (no deprecation warning)."""
    res = _mesh_lib.thread_resources
    env = res.stack[-1].with_mesh(mesh)
    res.stack.append(env)
    res.env = env
    _sync_mesh_config()


def pop_mesh() -> None:
    """Leave the innermost mesh pushed by :func:`push_mesh` or ``with Mesh``."""
    res = _mesh_lib.thread_resources
    res.stack.pop()
    res.env = res.stack[-1]
    _sync_mesh_config()


def ambient_mesh() -> Any | None:
    """The innermost mesh in context, or None.

    `with Mesh` and `partitioner.mesh` share jax's resource stack, so they nest in
    either order; a mesh set with ``jax.set_mesh`` is used when neither is active.
    """
    physical = _mesh_lib.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    concrete = _mesh_lib.get_concrete_mesh()
    if concrete is not None and not concrete.empty:
        return concrete
    return None


def trace_context() -> Any:
    """jax's hashable trace-affecting configuration (x64, etc.) for cache keys."""
    return _config.trace_context()


def shardy_config(enabled: bool) -> Any:
    """Context manager setting jax's ``jax_use_shardy_partitioner`` for this thread."""
    return _config.use_shardy_partitioner(enabled)


def jax_uses_shardy() -> bool:
    return bool(_config.use_shardy_partitioner.value)


def shaped_abstractify(x: Any) -> Any:
    """The ShapedArray partitioner traces ``x`` as: shape, dtype and weak type only.

    jax 0.10.2 avals of committed arrays also carry their mesh; the layout is
    partitioner's business (the specs), so it is dropped and equal shapes share
    one trace whatever their current layout.
    """
    a = core.shaped_abstractify(x)
    return core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)


# --- how an enclosing jax.jit picks its devices ---


def report_intermediate_shardings(find: Callable[[Any], Iterable[tuple[Any, Any, str]]]) -> None:
    """Let ``jax.jit`` see the shardings our primitives name inside its jaxpr.

    NOTE [device assignment under jax.jit]: jax.jit picks the devices of the
    program it builds from its arguments, its out_shardings and the shardings
    ``dispatch.get_intermediate_shardings`` finds in the jaxpr, which knows only
    jax's own primitives (there is no registry). With uncommitted (numpy)
    arguments a pjit inside jax.jit would then run on one device. So that
    function is wrapped: ``find(jaxpr)`` yields ``(sharding, source_info,
    primitive name)`` for our equations *at that level*; jax's own recursion into
    sub-jaxprs goes through the module attribute, hence through the wrapper too.
    Installing twice is a no-op.
    """
    original = _dispatch.get_intermediate_shardings
    if getattr(original, "_partitioner_find", None) is not None:
        return

    def get_intermediate_shardings(jaxpr: Any) -> list[Any]:
        found = list(original(jaxpr))
        found.extend((s, _stages.SourceInfo(src, name)) for s, src, name in find(jaxpr))
        return found

    get_intermediate_shardings._partitioner_find = find  # type: ignore[attr-defined]
    _dispatch.get_intermediate_shardings = get_intermediate_shardings  # type: ignore[assignment]


# --- extended dtypes (typed PRNG keys): logical vs physical arrays ---


def physical_aval(aval: Any) -> Any:
    """The aval XLA sees: a ``key<fry>[8]`` is ``u32[8, 2]``; other avals unchanged."""
    return core.physical_aval(aval)


def is_extended(aval: Any) -> bool:
    """True for an extended dtype (typed PRNG keys), whose physical shape is longer."""
    return isinstance(getattr(aval, "dtype", None), _dtypes.ExtendedDType)


def physical_array(x: Any) -> Any:
    """The array of physical buffers behind ``x`` (a key array's ``u32`` data); else ``x``."""
    return getattr(x, "_base_array", x) if is_extended(x) else x


def key_impl(dtype: Any) -> Any:
    """The PRNG implementation of a typed key dtype (for ``jax.random.wrap_key_data``)."""
    return dtype._impl


def physical_sharding(aval: Any, sharding: Any) -> Any:
    """The sharding of the physical array behind a value of ``aval`` laid out as ``sharding``."""
    return sharding_impls.physical_sharding(aval, sharding) if is_extended(aval) else sharding


def pp_eqn(eqn: Any, context: Any, settings: Any) -> Any:
    """jax's default pretty-printing of an equation (for a custom ``pp_eqn_rules`` entry)."""
    return core._pp_eqn(eqn, context, settings)


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
        _dispatch.runtime_tokens.set_token_result(effect, core.Token(token))


def results_handler(avals: Any, shardings: Any) -> Any:
    """Turns an executable's per-device output buffers into committed jax.Arrays."""
    return pxla.global_avals_to_results_handler(avals, shardings, committed=True)


def manual_scoped_op_sharding(mesh: Any, spec: Any, manual_axes: Any, ndim: int) -> Any:
    """The OpSharding of ``spec`` inside a manual region over ``manual_axes`` of ``mesh``.

    Why jax's: inside a region already manual over some axes, a sharding over the
    others carries manual subgroups, which only jax's NamedSharding -> HloSharding
    conversion (over a mesh whose manual axes are typed Manual) writes.
    """
    typed = mesh.abstract_mesh.update_axis_types(
        {a: _mesh_lib.AxisType.Manual for a in manual_axes}
    )
    return _NamedSharding(typed, spec)._to_xla_hlo_sharding(ndim).to_proto()


def hlo_computation(module: Any) -> Any:
    """The XlaComputation (HLO) of a StableHLO module, as jax's ``compiler_ir("hlo")``."""
    return _jax.mlir.mlir_module_to_xla_computation(
        mlir.module_to_bytecode(module), use_tuple_args=False
    )


def hlo_sharding_of(sharding: Any, ndim: int) -> Any:
    """The HloSharding a jax Sharding lays an ``ndim`` array out with."""
    return sharding._to_xla_hlo_sharding(ndim)


def device_assignment_of(sharding: Any) -> tuple[Any, ...]:
    """The devices a jax Sharding's HloSharding positions refer to, in order."""
    return tuple(sharding._device_assignment)


def at_top_level() -> bool:
    """True when no jax transformation or trace is active (eager evaluation)."""
    return core.trace_state_clean()


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
        pxla.cc_shard_arg,
        cache,
    )


def fastpath_data(
    executable: Any, out_tree: Any, in_shardings: Any, out_shardings: Any, out_avals: Any
) -> Any:
    """What the C++ dispatcher needs to run ``executable`` without Python."""
    n = len(in_shardings)
    return pxla.MeshExecutableFastpathData(
        executable,
        out_tree,
        list(in_shardings),
        list(out_shardings),
        list(out_avals),
        [True] * len(out_avals),
        [True] * n,
        [None] * n,
        [],
    )


def dispatch_flatten(tree: Any) -> tuple[list[Any], Any]:
    """Flatten with the registry jaxlib's C++ dispatcher uses for outputs."""
    return _tree_util.dispatch_registry.flatten(tree, None)


# --- host callbacks (partitioner.host_callback) ---


def emit_python_callback(
    ctx: Any,
    callback: Callable[..., Any],
    token: Any,
    operands: list[Any],
    operand_avals: list[Any],
    result_avals: list[Any],
    *,
    has_side_effect: bool,
    partitioned: bool = False,
    sharding: Any = None,
) -> tuple[Any, Any, Any]:
    """jax's host-callback custom call: ``(results, token out, callback object)``.

    ``partitioned``: one call per device with its shard; otherwise one call with
    the global value where ``sharding`` puts it (MAXIMAL) or on every replica.
    """
    return _callback.emit_python_callback(
        ctx,
        callback,
        token,
        operands,
        operand_avals,
        result_avals,
        has_side_effect=has_side_effect,
        returns_token=True,
        partitioned=partitioned,
        sharding=sharding,
    )


def requires_devices_during_lowering(primitive: Any) -> None:
    """Make ``jax.jit`` pass its device assignment to lowerings of programs using ``primitive``."""
    _dispatch.prim_requires_devices_during_lowering.add(primitive)


# --- multi-process jobs (partitioner.distributed) ---


def distributed_client() -> Any:
    """The coordination-service client ``jax.distributed.initialize`` connected (key-value store)."""
    return _distributed.global_state.client


# --- memory kinds (NOTE [memory kinds] in lower/memory.py) ---

mem_space_to_kind = core.mem_space_to_kind
mem_kind_to_space = core.mem_kind_to_space
MemorySpace = core.MemorySpace
device_put_p = _dispatch.device_put_p
subjaxprs = core.subjaxprs


def array_layout(x: Any) -> Any:
    """An array's PjRt layout (cheap, hashable; None for typed key arrays).

    It keys the Python dispatch cache, so an argument in another memory layout
    never reuses an executable built for the default one (jaxlib's C++
    dispatcher misses on it the same way).
    """
    return getattr(x, "_pjrt_layout", None)
