"""The one build pipeline: lower -> compile -> (retry) -> an ``Executable``.

Every path that needs a compiled pjit body comes here: dispatch (through the
executable cache), ``Lowered.compile()`` (from a module already lowered) and
``partitioner.inspect``. Lowering and compilation stay single-purpose
(``lower/module.py``, ``compile.py``); the policy that ties them together, the
retry below, lives only here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .. import jax_private as jp
from ..compile import CompilerOptions, compile_module
from ..lower.module import LoweredModule, lower_pjit_body
from ..spec.mesh_env import has_explicit_axes, result_mesh
from ..spec.parsed import REPLICATED, ParsedPartitionSpec
from ..trace.primitive import PjitParams
from . import window
from .agreement import check_same_program


@dataclass(frozen=True)
class Executable:
    """A compiled pjit body with everything a call needs precomputed.

    Invariants: ``in_specs`` / ``out_specs`` are the layouts XLA settled on, each
    exactly expressible as a spec (the build pins any other); ``in_shardings`` and
    ``out_shardings`` are their NamedShardings over the mesh.
    """

    lowered: LoweredModule
    loaded: Any  # the xla_client LoadedExecutable
    in_specs: tuple[ParsedPartitionSpec, ...]
    out_specs: tuple[ParsedPartitionSpec, ...]
    in_shardings: tuple[NamedSharding, ...]
    out_shardings: tuple[Any, ...]  # NamedSharding, or SingleDeviceSharding (single_device)
    out_handler: Any  # jax's results handler: per-device buffers -> jax.Arrays
    windowed: bool  # runs through the CPU collective window (window.py)
    marker: int | None  # the output a windowed launch is tracked by (window.marker_index)
    small_marker: bool  # that output is at most window.SMALL_MARKER_BYTES per device
    aliased: tuple[int, ...]  # positions of the inputs whose buffers outputs reuse
    physical_inputs: bool  # some input is a typed PRNG key, run on its physical array
    # Runs with runtime tokens (ordered effects, host callbacks), on the Python path.
    uses_tokens: bool


def build(params: PjitParams, shardy: bool) -> Executable:
    """Lower and compile the body ``params`` describe, for Shardy or GSPMD."""
    options = dict(params.compiler_options) or None
    return finish(lower_pjit_body(params, shardy), params.jaxpr, options)


def finish(
    lowered: LoweredModule, jaxpr: Any, compiler_options: CompilerOptions | None = None
) -> Executable:
    """Compile ``lowered`` (lowered from ``jaxpr``) into an :class:`Executable`.

    Where XLA was free to choose (a ``None`` spec) and chose a layout no
    partition spec can express, every layout is pinned to what XLA chose (that
    one to replicated) and the body lowered and compiled again: results are only
    ever described by a spec that is exactly their layout.
    """
    check_same_program(lowered)  # NOTE [program agreement]
    loaded, in_specs, out_specs = compile_module(lowered, compiler_options)
    if None in in_specs or None in out_specs:
        pinned = lowered.params(jaxpr).replace(
            in_axis_resources=[s if s is not None else REPLICATED for s in in_specs],
            out_axis_resources=[s if s is not None else REPLICATED for s in out_specs],
        )
        return finish(lower_pjit_body(pinned, lowered.shardy), jaxpr, compiler_options)
    if has_explicit_axes(lowered.mesh):
        # Results are annotated with their specs, which XLA honours; read back, a
        # size-1 mesh axis would vanish from them, but it is part of a typed result's
        # sharding (``P('x', 'z')`` for ``f32[8@x,4@z]``), as in jax.jit's results.
        out_specs = [a if a is not None else c for a, c in zip(lowered.out_specs, out_specs)]
    return _executable(lowered, loaded, tuple(in_specs), tuple(out_specs))  # type: ignore[arg-type]


def named_sharding(mesh: Mesh, spec: ParsedPartitionSpec, ndim: int | None = None) -> NamedSharding:
    """``spec`` over ``mesh``; with ``ndim``, spelled with one entry per dimension.

    Over Explicit axes a result's sharding is spelled as its type is
    (``P('x', None)`` for ``float32[8@x,2]``), as jax.jit's results are.
    """
    closed = spec.to_closed_spec()
    if ndim is not None and len(closed) < ndim:
        closed = PartitionSpec(*closed, *(None,) * (ndim - len(closed)))
    return NamedSharding(mesh, closed)


def _result_sharding(
    mesh: Mesh, aval: Any, spec: ParsedPartitionSpec, asked: ParsedPartitionSpec | None
) -> NamedSharding:
    """A result's sharding; over Explicit axes, over its type's mesh, and spelled as its
    type (one entry per dimension) where the type says it (as jax.jit's results are):
    always on an all-Explicit mesh, and on a mixed one for an unspecified (``asked``
    None) output whose type names an axis."""
    if not has_explicit_axes(mesh):
        return named_sharding(mesh, spec)
    over = result_mesh(mesh, aval)  # NOTE [explicit axes]
    typed = getattr(getattr(aval, "sharding", None), "spec", None)
    from_type = asked is None and typed is not None and any(e is not None for e in typed)
    as_type = over.are_all_axes_explicit or from_type
    return named_sharding(over, spec, aval.ndim if as_type else None)


def bytes_per_device(aval: Any, spec: ParsedPartitionSpec, mesh: Mesh) -> int:
    """Bytes one device holds of a value of ``aval`` laid out with ``spec``."""
    shard = spec.shard_shape(tuple(aval.shape), mesh)
    physical = jp.physical_aval(aval)  # typed PRNG keys: the trailing key dims
    per_element = math.prod(physical.shape[len(shard) :]) * physical.dtype.itemsize
    return math.prod(shard) * per_element


def _executable(
    lowered: LoweredModule,
    loaded: Any,
    in_specs: tuple[ParsedPartitionSpec, ...],
    out_specs: tuple[ParsedPartitionSpec, ...],
) -> Executable:
    mesh = lowered.mesh
    out_sh: tuple[Any, ...] = tuple(
        _result_sharding(mesh, a, s, asked)
        for a, s, asked in zip(lowered.out_avals, out_specs, lowered.out_specs, strict=True)
    )
    if lowered.single_device:  # as jax.jit hands back a one-device call's results
        out_sh = tuple(SingleDeviceSharding(mesh.devices.flat[0]) for _ in out_specs)
    windowed = window.needs_window(loaded, mesh.devices.flat[0].platform, mesh.size)
    out_bytes = [bytes_per_device(a, s, mesh) for a, s in zip(lowered.out_avals, out_specs)]
    marker = window.marker_index(lowered.out_avals, out_bytes) if windowed else None
    return Executable(
        lowered=lowered,
        loaded=loaded,
        in_specs=in_specs,
        out_specs=out_specs,
        in_shardings=tuple(named_sharding(mesh, s) for s in in_specs),
        out_shardings=out_sh,
        out_handler=jp.results_handler(lowered.out_avals, out_sh, lowered.committed),
        windowed=windowed,
        marker=marker,
        small_marker=marker is not None and out_bytes[marker] <= window.SMALL_MARKER_BYTES,
        aliased=tuple(i for i, a in enumerate(lowered.aliased) if a),
        physical_inputs=any(jp.is_extended(a) for a in lowered.in_avals),
        uses_tokens=bool(lowered.ordered_effects or lowered.host_callbacks),
    )
