"""jax's settings that partitioner reads or sets: the flags, and what its caches key on."""

from __future__ import annotations

import operator as _operator
from typing import Any

from jax._src import compilation_cache as _compilation_cache
from jax._src import compiler as _compiler
from jax._src import config as _config

# --- flags partitioner reads or sets ---


def shardy_config(enabled: bool) -> Any:
    """Context manager setting jax's ``jax_use_shardy_partitioner`` for this thread."""
    return _config.use_shardy_partitioner(enabled)


def jax_uses_shardy() -> bool:
    """Whether jax's ``jax_use_shardy_partitioner`` is on (in this thread's context)."""
    return bool(_config.use_shardy_partitioner.value)


def no_tracing() -> bool:
    """``jax.no_tracing()`` is on: a call that would trace must raise, as jax.jit's does."""
    return bool(_config.no_tracing.value)


def no_execution() -> bool:
    """``jax.no_execution()`` is on: running a program must raise, as jax.jit's does."""
    return bool(_config.no_execution.value)


# --- the settings a cache key holds ---


def trace_context() -> Any:
    """jax's hashable trace-affecting configuration (x64, etc.) for cache keys."""
    return _config.trace_context()


def trace_context_names() -> tuple[str, ...]:
    """The names of the :func:`trace_context` entries, in order (for cache-miss explanations)."""
    return tuple(_config.trace_context_names())


#: Trace-context entries that say where a call is made (the ambient mesh, the axis
#: environment) or what partitioner keys on itself (the partitioner choice, taken
#: from the program): left out of :func:`lowering_settings`.
_CALL_SITE_CONTEXT = frozenset(
    {
        "mesh_context_manager",
        "abstract_mesh_context_manager",
        "axis_env_state",
        "jax_use_shardy_partitioner",
    }
)
_lowering_entries = _operator.itemgetter(
    *(i for i, name in enumerate(_config.trace_context_names()) if name not in _CALL_SITE_CONTEXT)
)


def lowering_settings() -> tuple[Any, ...]:
    """The jax settings a jaxpr is lowered under (``jax_default_matmul_precision``, x64,
    the threefry implementation, ...), for the executable cache's key.

    jax.jit's own compile caches key on its whole trace context (they are jax's
    ``weakref_lru_cache``s); this is that context less the entries that name where a
    call is made, which the program's own mesh already says.
    """
    return _lowering_entries(_config.trace_context())


#: The names of the :func:`compile_settings` entries, in order (for cache-miss explanations).
COMPILE_SETTING_NAMES = (
    "jax_exec_time_optimization_effort",
    "jax_memory_fitting_effort",
    "jax_optimization_level",
    "jax_memory_fitting_level",
    "jax_compiler_enable_remat_pass",
    "jax_disable_most_optimizations",
)


def compile_settings() -> tuple[Any, ...]:
    """The jax settings ``compiler.get_compile_options`` builds a program's XLA options
    from (optimization effort and levels, memory fitting, remat, jax's
    ``jax_disable_most_optimizations``), for the executable cache's key.

    jax.jit keys its persistent cache on them (the serialized options) but not its
    in-memory one, so changing ``jax_optimization_level`` mid-process keeps serving
    the program compiled before; partitioner compiles again.
    """
    return (
        _config.exec_time_optimization_effort.value,
        _config.memory_fitting_effort.value,
        _config.optimization_level.value,
        _config.memory_fitting_level.value,
        _config.enable_remat_opt_pass.value,
        _compiler._DISABLE_MOST_OPTIMIZATIONS.value,
    )


# --- the persistent compilation cache ---


def persistent_cache_in_play() -> bool:
    """Whether ``compile_or_get_cached`` would read, write or share anything.

    With no cache directory (and no binary sharing between hosts), jax still
    hashes the module into a cache key on every compile, then finds no cache:
    skipping that keeps a cold compile as lean as before the cache was wired in.
    """
    return bool(
        _compilation_cache.is_persistent_cache_enabled() or _config.share_binary_between_hosts.value
    )
