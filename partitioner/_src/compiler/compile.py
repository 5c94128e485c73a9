"""Compile an annotated module with XLA's SPMD partitioner, inside jax's compilation machinery.

The ``CompileOptions`` start from jax's own (``compiler.get_compile_options``:
the optimization effort and level flags, remat, the XLA caches the persistent
cache enables, and the user's ``compiler_options``); partitioner then sets one
replica, one partition per mesh device, the mesh's devices as the assignment,
its partitioner choice, and sharding propagation allowed only where a spec was
left open (``None``), so XLA keeps every layout the user asked for and chooses
the rest.

NOTE [persistent compilation cache]: compilation goes through jax's
``compile_or_get_cached``, so ``jax_compilation_cache_dir`` and its companion
settings (``jax_enable_compilation_cache``,
``jax_persistent_cache_min_compile_time_secs``,
``jax_persistent_cache_min_entry_size_bytes``) apply to pjit and pmap as they
do to jax.jit. jax's key hashes the module (our sharding annotations and
argument names included), the serialized compile options (partitioner choice,
propagation flags, device assignment, compiler options), the devices, jaxlib,
the backend and XLA flags: anything that changes the executable changes the
key. An entry that cannot be read back (truncated, corrupt) is reported by jax
with a warning and compiled again, never run. Modules with host callbacks are
not written, as under jax.jit (their callbacks are baked into the program).
With no cache directory set, the compile goes straight to jax's
``backend_compile_and_load``: jax.jit would still hash every module into a key
for a cache that does not exist.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .. import jax_private as jp
from ..events import emit
from ..lower.module import LoweredModule
from ..sharding.op_sharding import parse_op_sharding_parsed
from ..sharding.parsed import REPLICATED, ParsedPartitionSpec

logger = logging.getLogger(__name__)


CompilerOptions = dict[str, Any]


def compile_options(
    lowered: LoweredModule, compiler_options: CompilerOptions | None = None, backend: Any = None
) -> Any:
    """The XLA options for ``lowered``: jax's, then SPMD over the mesh, Shardy or GSPMD.

    Args:
        lowered: the annotated module.
        compiler_options: XLA options by name, as ``jax.jit``'s ``compiler_options``
            (an unknown name or a bad value raises jax's ``JaxRuntimeError`` when
            compiling, as under jax.jit).
        backend: the backend compiling it (jax reads its profile version).
    """
    devices = list(lowered.mesh.devices.flat)
    overrides = dict(compiler_options or {})
    fdo_profile = overrides.pop("fdo_profile", None)
    opts = jp.get_compile_options(
        num_replicas=1,
        num_partitions=len(devices),
        device_assignment=np.array([[d.id for d in devices]]),
        env_options_overrides=overrides,
        fdo_profile=fdo_profile,
        detailed_logging=jp.use_detailed_logging(lowered.module),
        backend=backend,
    )
    build = opts.executable_build_options
    build.use_shardy_partitioner = lowered.shardy
    tokens = [False] * len(lowered.ordered_effects)  # main's leading token arguments/results
    build.allow_spmd_sharding_propagation_to_output = [
        *tokens,
        *(s is None for s in lowered.out_specs),
    ] or [False]
    build.allow_spmd_sharding_propagation_to_parameters = [
        *tokens,
        *(s is None for s in lowered.in_specs),
    ] or [False]
    return opts


def _logical(spec: ParsedPartitionSpec | None, aval: Any) -> ParsedPartitionSpec | None:
    """The spec of a value of ``aval`` whose *physical* array XLA laid out as ``spec``.

    A typed PRNG key's physical array has trailing key dims; a layout that
    partitions them has no logical spec (None), else they are dropped.
    """
    if spec is None or len(spec.partitions) <= len(aval.shape):
        return spec
    if any(spec.partitions[len(aval.shape) :]):
        return None
    return ParsedPartitionSpec(None, spec.partitions[: len(aval.shape)])


def _chosen_specs(shardings: Any, avals: Any, mesh: Any) -> list[ParsedPartitionSpec | None]:
    """Specs for the executable's OpShardings; None where no spec can express one."""
    n = len(avals)
    if shardings is None:  # a 1-device executable reports nothing: replicated
        return [REPLICATED] * n
    parsed: list[ParsedPartitionSpec | None] = []
    # Values mostly share a few layouts (every weight of a layer stack): each
    # distinct one is parsed once.
    seen: dict[bytes, list[ParsedPartitionSpec | None]] = {}
    for s in shardings:
        key = s.SerializeToString()
        if key not in seen:
            try:
                p = parse_op_sharding_parsed(s, mesh)
                seen[key] = p if isinstance(p, list) else [p]
            except ValueError:
                seen[key] = [None]
        parsed.extend(seen[key])
    if len(parsed) == 1 and n != 1:  # XLA may report one sharding for all values
        parsed = parsed * n
    return [
        REPLICATED if jp.is_token(a) else _logical(p, a)  # a token: no data, no layout
        for p, a in zip(parsed, avals, strict=True)
    ]


def _log_compile(lowered: LoweredModule) -> None:
    """jax.jit's "Compiling ..." line (WARNING under ``jax_log_compiles``), plus the call site."""
    priority = logging.WARNING if jp.log_compiles.value else logging.DEBUG
    if logger.isEnabledFor(priority):
        logger.log(
            priority,
            "Compiling %s with global shapes and types %s. Argument mapping: %s. "
            "Partitioner: %s, mesh %s. Called from %s.",
            lowered.module_name,
            list(lowered.in_avals),
            [None if s is None else s.to_partition_spec() for s in lowered.in_specs],
            "Shardy" if lowered.shardy else "GSPMD",
            dict(lowered.mesh.shape),
            jp.user_call_site(),
        )


def _compile_once(lowered: LoweredModule, compiler_options: CompilerOptions | None) -> Any:
    """Compile, or load from jax's persistent cache (NOTE [persistent compilation cache])."""
    emit("compile", name=lowered.name)
    devices = lowered.mesh.devices.flat
    backend = jp.get_device_backend(devices[0])
    device_array = np.empty(lowered.mesh.size, dtype=object)
    device_array[:] = list(devices)
    _log_compile(lowered)
    opts = compile_options(lowered, compiler_options, backend)
    with jp.log_elapsed_time(
        "Finished XLA compilation of {fun_name} in {elapsed_time:.9f} sec",
        fun_name=lowered.module_name,
        event=jp.BACKEND_COMPILE_EVENT,
    ):
        executable_devices = jp.DeviceList(tuple(device_array))
        callbacks = list(lowered.host_callbacks)
        if not jp.persistent_cache_in_play():
            jp.dump_module_to_file(lowered.module, "compile")  # as compile_or_get_cached does
            return jp.backend_compile_and_load(
                backend, lowered.module, executable_devices, opts, callbacks
            )
        return jp.compile_or_get_cached(
            backend, lowered.module, device_array, opts, callbacks, executable_devices
        )


def compile_module(
    lowered: LoweredModule, compiler_options: CompilerOptions | None = None
) -> tuple[Any, list[ParsedPartitionSpec | None], list[ParsedPartitionSpec | None]]:
    """Compile with XLA (or load from the persistent cache); read back the layouts, as specs.

    Returns:
        ``(loaded executable, input specs, output specs)``; a spec is None where
        XLA, free to choose, chose a layout no partition spec can express (the
        build pipeline then pins it, ``compiler/executable.py``).
    """
    exe = _compile_once(lowered, compiler_options)
    n_tokens = len(lowered.ordered_effects)
    in_specs = _chosen_specs(
        _without_tokens(exe.get_parameter_shardings(), n_tokens, len(lowered.in_avals)),
        lowered.in_avals,
        lowered.mesh,
    )
    out_specs = _chosen_specs(
        _without_tokens(exe.get_output_shardings(), n_tokens, len(lowered.out_avals)),
        lowered.out_avals,
        lowered.mesh,
    )
    return exe, in_specs, out_specs


def _without_tokens(shardings: Any, n_tokens: int, n_values: int) -> Any:
    """Drop the shardings of main's leading tokens (ordered effects), when listed one by one."""
    if shardings is None or not n_tokens or len(shardings) != n_tokens + n_values:
        return shardings
    return shardings[n_tokens:]
