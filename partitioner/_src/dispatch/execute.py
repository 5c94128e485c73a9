"""Run a compiled pjit body: place the arguments, execute, wrap the results.

Arguments already laid out as their spec asks are passed through untouched (no
copy); everything else (numpy arrays, Python scalars, arrays laid out another
way) is placed with ``jax.device_put`` first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from .. import jax_private as jp
from .. import options
from ..compile import CompiledExecutable, compile_lowered
from ..events import emit
from ..lower.module import lower_pjit_body
from ..spec.op_sharding import parse_op_sharding_parsed
from ..spec.parsed import REPLICATED, ParsedPartitionSpec
from . import window
from .cache import ExecutableCache


@dataclass
class Runnable:
    """A compiled body with everything a call needs precomputed."""

    compiled: CompiledExecutable
    in_shardings: tuple[NamedSharding, ...]
    out_shardings: tuple[NamedSharding, ...]
    out_handler: Any  # jax's results handler
    windowed: bool  # runs through the CPU collective window (window.py)
    marker: int | None  # the output a windowed launch is tracked by (window.marker_index)
    small_marker: bool  # that output is at most window.SMALL_MARKER_BYTES per device
    donated: tuple[int, ...]  # positions of the inputs whose buffers the outputs reuse
    physical_inputs: bool  # some input is a typed PRNG key, run on its physical array


def named_sharding(mesh: Mesh, spec: ParsedPartitionSpec) -> NamedSharding:
    return NamedSharding(mesh, spec.to_closed_spec())


def make_runnable(compiled: CompiledExecutable) -> Runnable:
    lowered = compiled.lowered
    mesh = lowered.mesh
    in_sh = tuple(named_sharding(mesh, s) for s in compiled.in_specs)
    out_sh = tuple(named_sharding(mesh, s) for s in compiled.out_specs)
    handler = jp.results_handler(lowered.out_avals, out_sh)
    platform = mesh.devices.flat[0].platform
    windowed = window.needs_window(compiled.executable, platform, mesh.size)
    out_bytes = [
        bytes_per_device(a, s, mesh) for a, s in zip(lowered.out_avals, compiled.out_specs)
    ]
    marker = window.marker_index(lowered.out_avals, out_bytes) if windowed else None
    small = marker is not None and out_bytes[marker] <= window.SMALL_MARKER_BYTES
    donated = tuple(i for i, d in enumerate(lowered.donated) if d)
    physical = any(jp.is_extended(a) for a in lowered.in_avals)
    return Runnable(compiled, in_sh, out_sh, handler, windowed, marker, small, donated, physical)


def bytes_per_device(aval: Any, spec: ParsedPartitionSpec, mesh: Mesh) -> int:
    """Bytes one device holds of a value of ``aval`` laid out with ``spec``."""
    shard = spec.shard_shape(tuple(aval.shape), mesh)
    physical = jp.physical_aval(aval)  # typed PRNG keys: the trailing key dims
    per_element = math.prod(physical.shape[len(shard) :]) * physical.dtype.itemsize
    return math.prod(shard) * per_element


executables = ExecutableCache()


def get_runnable(
    jaxpr: Any,
    in_axis_resources: tuple[ParsedPartitionSpec | None, ...],
    out_axis_resources: tuple[ParsedPartitionSpec | None, ...],
    mesh: Mesh,
    donated_invars: tuple[bool, ...],
    name: str,
) -> Runnable:
    """The compiled executable for these params (NOTE [executable cache])."""
    shardy = options.use_shardy()

    def build() -> Runnable:
        emit("cache_miss", name=name)
        lowered = lower_pjit_body(
            jaxpr, in_axis_resources, out_axis_resources, mesh, donated_invars, name, shardy
        )
        return make_runnable(compile_lowered(lowered, jaxpr))

    key = (in_axis_resources, out_axis_resources, mesh, donated_invars, shardy)
    runnable, _ = executables.get_or_compile(jaxpr, key, build)
    return runnable


def check_live(x: Any, where: str) -> None:
    """Raise a RuntimeError naming ``where`` if ``x`` is a deleted (e.g. donated) array."""
    if isinstance(x, jax.Array) and not isinstance(x, jp.core.Tracer) and x.is_deleted():
        raise RuntimeError(
            f"{where} is an array that has been deleted, most likely donated to an earlier "
            "call (donate_argnums). Pass a live array, or stop donating it."
        )


def check_usable(x: Any, mesh: Mesh, where: str) -> None:
    """Reject an argument pjit cannot run on: deleted, or committed to other devices.

    Arrays committed to some of the mesh's devices are moved onto the mesh as
    their spec asks; ``jax.jit`` raises for devices outside its computation, and
    so does pjit, rather than copying between device sets behind the user's back.

    Raises:
        RuntimeError: ``x`` was deleted (most likely donated to an earlier call).
        ValueError: ``x`` is committed to a device outside the mesh.
    """
    check_live(x, where)
    if isinstance(x, jax.Array) and not isinstance(x, jp.core.Tracer) and x.committed:
        devices = {d.id for d in x.sharding.device_set}  # type: ignore[attr-defined]
        mesh_ids = {d.id for d in mesh.devices.flat}
        if not devices <= mesh_ids:
            raise ValueError(
                f"{where} is committed to devices {sorted(devices)}, but the mesh "
                f"{dict(mesh.shape)} has devices {sorted(mesh_ids)}. Move it onto the mesh first "
                "(jax.device_put(x, NamedSharding(mesh, spec))), or run under a mesh of its "
                "devices."
            )


def place_args_reporting(
    args: Sequence[Any], shardings: Sequence[NamedSharding]
) -> tuple[list[Any], bool]:
    """Lay each argument out as its sharding asks; pass through those already there.

    Returns:
        ``(placed, moved_committed)``: the arguments, and whether a committed
        jax.Array had to be moved to another layout (such calls stay off the C++
        fast path, which would not move it).

    Raises:
        RuntimeError / ValueError: see :func:`check_usable`.
    """
    placed = []
    moved_committed = False
    for i, (x, sharding) in enumerate(zip(args, shardings, strict=True)):
        if isinstance(x, jax.Array) and not isinstance(x, jp.core.Tracer):
            if not x.is_deleted() and (
                x.sharding == sharding or x.sharding.is_equivalent_to(sharding, x.ndim)
            ):
                placed.append(x)
                continue
            check_usable(x, sharding.mesh, f"pjit: argument {i} (flat)")  # type: ignore[arg-type]
            moved_committed = moved_committed or x.committed
        placed.append(jax.device_put(x, sharding))
    return placed, moved_committed


def execute_placed(runnable: Runnable, placed: Sequence[Any]) -> list[Any]:
    """Run on arguments already laid out as ``runnable.in_shardings``."""
    if runnable.physical_inputs:
        placed = [jp.physical_array(x) for x in placed]
    if runnable.windowed:
        window.make_room()
    results = runnable.compiled.executable.execute_sharded(list(placed))
    outs = results.consume_with_handlers(runnable.out_handler.handlers)
    if runnable.marker is not None:
        window.launched(outs[runnable.marker], runnable.small_marker)
    return outs


def execute(runnable: Runnable, args: Sequence[Any]) -> list[Any]:
    return execute_placed(runnable, place_args_reporting(args, runnable.in_shardings)[0])


def spec_of_arg(x: Any, mesh: Mesh) -> ParsedPartitionSpec:
    """The spec ``x`` is already laid out with over ``mesh`` (REPLICATED if none).

    Used for inputs whose spec is None (residuals, NOTE [residual shardings]):
    they are taken as they arrive instead of being moved.
    """
    if isinstance(x, jax.Array) and not isinstance(x, jp.core.Tracer):
        sharding = x.sharding
        if jp.device_assignment_of(sharding) == tuple(mesh.devices.flat):
            try:
                parsed = parse_op_sharding_parsed(jp.hlo_sharding_of(sharding, x.ndim), mesh)
            except ValueError:
                return REPLICATED
            if isinstance(parsed, ParsedPartitionSpec):
                return parsed
    return REPLICATED


def call_impl(args: Sequence[Any], **params: Any) -> list[Any]:
    """``pjit_p``'s impl: run the body eagerly on concrete arguments."""
    specs = params["in_axis_resources"]
    if None in specs:
        mesh = params["mesh"]
        specs = tuple(
            spec_of_arg(x, mesh) if s is None else s for s, x in zip(specs, args, strict=True)
        )
        params = dict(params, in_axis_resources=specs)
    return execute(get_runnable(**params), args)
