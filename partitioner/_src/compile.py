"""Compile an annotated module with XLA's SPMD partitioner.

partitioner builds the ``CompileOptions`` itself: one replica, one partition
per mesh device, the mesh's devices as the assignment, and sharding
propagation allowed only where a spec was left open (``None``), so XLA keeps
every layout the user asked for and chooses the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import jax_private as jp
from .events import emit
from .lower.module import LoweredModule
from .spec.op_sharding import parse_op_sharding_parsed
from .spec.parsed import REPLICATED, ParsedPartitionSpec


def compile_options(lowered: LoweredModule) -> Any:
    """The XLA options for ``lowered``: SPMD over the mesh, Shardy or GSPMD."""
    devices = list(lowered.mesh.devices.flat)
    opts = jp.CompileOptions()
    opts.num_replicas = 1
    opts.num_partitions = len(devices)
    opts.device_assignment = jp.DeviceAssignment.create(np.array([[d.id for d in devices]]))
    build = opts.executable_build_options
    build.use_spmd_partitioning = True
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
    for s in shardings:
        try:
            p = parse_op_sharding_parsed(s, mesh)
        except ValueError:
            parsed.append(None)
            continue
        parsed.extend(p if isinstance(p, list) else [p])
    if len(parsed) == 1 and n != 1:  # XLA may report one sharding for all values
        parsed = parsed * n
    return [_logical(p, a) for p, a in zip(parsed, avals, strict=True)]


def _compile_once(lowered: LoweredModule) -> Any:
    emit("compile", name=lowered.name)
    devices = tuple(lowered.mesh.devices.flat)
    backend = jp.get_device_backend(devices[0])
    return backend.compile_and_load(
        lowered.module,
        executable_devices=jp.DeviceList(devices),
        compile_options=compile_options(lowered),
        host_callbacks=list(lowered.host_callbacks),
    )


def compile_module(
    lowered: LoweredModule,
) -> tuple[Any, list[ParsedPartitionSpec | None], list[ParsedPartitionSpec | None]]:
    """Compile with XLA; read back the layouts XLA settled on, as specs.

    Returns:
        ``(loaded executable, input specs, output specs)``; a spec is None where
        XLA, free to choose, chose a layout no partition spec can express (the
        build pipeline then pins it, ``dispatch/executable.py``).
    """
    exe = _compile_once(lowered)
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
