"""The one build pipeline: lower -> compile -> (retry) -> an ``Executable``.

Every path that needs a compiled pjit body comes here: dispatch (through the
executable cache), ``Lowered.compile()`` (from a module already lowered) and
``partitioner.inspect``. Lowering and compilation stay single-purpose
(``lower/module.py``, ``compile.py``); the policy that ties them together, the
retry below, lives only here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import jax_private as jp
from .. import window
from ..lower.module import LoweredModule, lower_pjit_body
from ..lower.prune import prune_unused_inputs
from ..primitives.pjit_call import PjitParams
from ..sharding.leaves import as_reported
from ..sharding.mesh_env import has_explicit_axes, result_mesh
from ..sharding.parsed import REPLICATED, ParsedPartitionSpec, SpecSync
from . import producers
from .agreement import check_same_program
from .compile import CompilerOptions, compile_module


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
    out_shardings: tuple[Any, ...]  # NamedShardings (a one-device mesh's as reported: as_reported)
    out_handler: Any  # jax's results handler: per-device buffers -> jax.Arrays
    windowed: bool  # runs through the CPU collective window (window.py)
    marker: int | None  # the output a windowed launch is tracked by (window.marker_index)
    small_marker: bool  # that output is at most window.SMALL_MARKER_BYTES per device
    aliased: tuple[int, ...]  # positions of the inputs whose buffers outputs reuse
    physical_inputs: bool  # some input is a typed PRNG key, run on its physical array
    # Runs with runtime tokens (ordered effects, host callbacks), on the Python path.
    uses_tokens: bool
    # Per input: the memory layout XLA compiled for where its spec states one
    # (a Layout or Layout.AUTO), else None (XLA's default). Such inputs are
    # placed as ``Format(layout, sharding)``, on the Python path.
    in_layouts: tuple[Any, ...] = ()
    # Positions of the call's flat inputs the program takes (the others were
    # pruned, ``lower/prune.py``); None: every one. Every ``in_*`` field above is
    # about the inputs the program takes.
    kept: tuple[int, ...] | None = None

    def taken(self, values: Sequence[Any]) -> list[Any]:
        """The entries of ``values`` (one per input of the call) the program takes."""
        return list(values) if self.kept is None else [values[i] for i in self.kept]

    def per_input(self, values: Sequence[Any], n: int, pruned: Any = None) -> list[Any]:
        """``values`` (one per input the program takes) spread over the call's ``n``
        inputs, ``pruned`` where the program takes none."""
        if self.kept is None:
            return list(values)
        out = [pruned] * n
        for value, i in zip(values, self.kept, strict=True):
            out[i] = value
        return out

    def in_placements(self) -> tuple[Any, ...]:
        """Where each input goes: its sharding, or a ``Format`` where a layout is stated."""
        if not any(layout is not None for layout in self.in_layouts):
            return self.in_shardings
        return tuple(
            s if layout is None else Format(layout, s)
            for s, layout in zip(self.in_shardings, self.in_layouts, strict=True)
        )


def build(params: PjitParams, shardy: bool) -> Executable:
    """Prune unused inputs (unless ``keep_unused``), lower and compile, for Shardy or GSPMD."""
    options = dict(params.compiler_options) or None
    program, kept = prune_unused_inputs(params)
    return finish(lower_pjit_body(program, shardy), program.jaxpr, options, kept)


def finish(
    lowered: LoweredModule,
    jaxpr: Any,
    compiler_options: CompilerOptions | None = None,
    kept: tuple[int, ...] | None = None,
) -> Executable:
    """Compile ``lowered`` (lowered from ``jaxpr``) into an :class:`Executable`.

    ``kept``: the positions of the call's inputs the (pruned) program takes.

    Where XLA was free to choose (a ``None`` spec) and chose a layout no
    partition spec can express, every layout is pinned to what XLA chose (that
    one to replicated) and the body lowered and compiled again: results are only
    ever described by a spec that is exactly their layout.
    """
    check_same_program(lowered)  # NOTE [program agreement]
    loaded, in_specs, out_specs = compile_module(lowered, compiler_options)
    if None in in_specs or None in out_specs:
        pinned = lowered.params(jaxpr).replace(
            in_axis_resources=_pinned(in_specs, lowered.in_specs),
            out_axis_resources=_pinned(out_specs, lowered.out_specs),
        )
        return finish(lower_pjit_body(pinned, lowered.shardy), jaxpr, compiler_options, kept)
    if has_explicit_axes(lowered.mesh):
        # Results are annotated with their specs, which XLA honours; read back, a
        # size-1 mesh axis would vanish from them, but it is part of a typed result's
        # sharding (``P('x', 'z')`` for ``f32[8@x,4@z]``), as in jax.jit's results.
        out_specs = [a if a is not None else c for a, c in zip(lowered.out_specs, out_specs)]
    executable = _executable(lowered, loaded, tuple(in_specs), tuple(out_specs))  # type: ignore[arg-type]
    names = getattr(jaxpr.jaxpr.debug_info, "result_paths", None) or ()
    producers.note(executable.out_shardings, names, f"{lowered.api} {lowered.name}")
    return executable if kept is None else dataclasses.replace(executable, kept=kept)


def _pinned(
    chosen: list[ParsedPartitionSpec | None], asked: tuple[ParsedPartitionSpec | None, ...]
) -> list[ParsedPartitionSpec]:
    """XLA's layouts (replicated where no spec expresses one), in the memory kinds asked."""
    return [
        (c if c is not None else REPLICATED).with_memory_kind(a.memory_kind if a else None)
        for c, a in zip(chosen, asked, strict=True)
    ]


def named_sharding(
    mesh: Mesh,
    spec: ParsedPartitionSpec,
    memory_kind: str | None = None,
    asked: ParsedPartitionSpec | None = None,
    ndim: int | None = None,
) -> NamedSharding:
    """The NamedSharding of ``spec`` over ``mesh``, in ``memory_kind`` (None: the default).

    Where ``spec`` is the layout the user ``asked`` for, the sharding keeps the
    user's spelling of it (``P('x', None)``, not ``P('x')``), as jax.jit does:
    jax compares shardings' specs as written. With ``ndim`` (a result over
    Explicit axes), it is spelled with one entry per dimension, as its type is.
    """
    closed = spec.to_closed_spec()
    if ndim is not None:
        if len(closed) < ndim:
            closed = PartitionSpec(*closed, *(None,) * (ndim - len(closed)))
    elif (
        asked is not None
        and (written := user_spelling(asked)) is not None
        and _cuts(asked, mesh) == _cuts(spec, mesh)
    ):
        closed = written
    return NamedSharding(mesh, closed, memory_kind=memory_kind)


def user_spelling(asked: Any) -> PartitionSpec | None:
    """The PartitionSpec the user wrote for a given spec, where it still says the spec."""
    if (
        isinstance(asked, ParsedPartitionSpec)
        and asked.sync == SpecSync.IN_SYNC
        and isinstance(asked.unsafe_user_spec, PartitionSpec)
        and not asked.unconstrained_dims
    ):
        return asked.unsafe_user_spec
    return None


def spellings_key(specs: Sequence[Any]) -> tuple[PartitionSpec | None, ...]:
    """Each given spec's spelling where it differs from its layout's own (``P('x', None)``
    against ``P('x')``: distinct shardings to jax), else None: results and Compiled's
    shardings keep the spelling, so it is part of an executable's key."""
    out = []
    for s in specs:
        written = user_spelling(s)
        if written is not None:
            closed = list(s.to_closed_spec())
            while closed and closed[-1] is None:
                closed.pop()
            written = None if written == PartitionSpec(*closed) else written
        out.append(written)
    return tuple(out)


def _cuts(spec: ParsedPartitionSpec, mesh: Mesh) -> tuple[tuple[Any, ...], ...]:
    """The axes that really cut each dimension (size-1 mesh axes cut nothing)."""
    sizes = dict(mesh.shape)
    parts = [tuple(a for a in axes if sizes[a] > 1) for axes in spec.partitions]
    while parts and not parts[-1]:
        parts.pop()
    return tuple(parts)


def _result_sharding(
    mesh: Mesh,
    aval: Any,
    spec: ParsedPartitionSpec,
    asked: ParsedPartitionSpec | None,
    memory_kind: str | None,
) -> NamedSharding:
    """A result's sharding; over Explicit axes, over its type's mesh. As jax.jit's
    results are spelled: a given out-sharding as given (``asked``), an unspecified
    output as its type (one entry per dimension) on an all-Explicit mesh, or on a
    mixed one where its type names an axis."""
    if not has_explicit_axes(mesh):
        return named_sharding(mesh, spec, memory_kind, asked)
    over = result_mesh(mesh, aval)  # NOTE [explicit axes]
    typed = getattr(getattr(aval, "sharding", None), "spec", None)
    from_type = typed is not None and any(e is not None for e in typed)
    if asked is None and (over.are_all_axes_explicit or from_type):
        return named_sharding(over, spec, memory_kind, ndim=aval.ndim)
    return named_sharding(over, spec, memory_kind, asked)


def bytes_per_device(aval: Any, spec: ParsedPartitionSpec, mesh: Mesh) -> int:
    """Bytes one device holds of a value of ``aval`` laid out with ``spec`` (a token: 0)."""
    if jp.is_token(aval):
        return 0
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
        _result_sharding(mesh, a, s, lowered.out_specs[i], lowered.out_memory_kind(i))
        for i, (a, s) in enumerate(zip(lowered.out_avals, out_specs, strict=True))
    )
    windowed = window.needs_window(loaded, mesh.devices.flat[0].platform, mesh.size)
    out_bytes = [bytes_per_device(a, s, mesh) for a, s in zip(lowered.out_avals, out_specs)]
    marker = window.marker_index(lowered.out_avals, out_bytes) if windowed else None
    return Executable(
        lowered=lowered,
        loaded=loaded,
        in_specs=in_specs,
        out_specs=out_specs,
        in_shardings=tuple(
            named_sharding(mesh, s, lowered.in_memory_kind(i), lowered.in_specs[i])
            for i, s in enumerate(in_specs)
        ),
        out_shardings=out_sh,
        out_handler=jp.results_handler(
            lowered.out_avals, tuple(map(as_reported, out_sh)), lowered.committed
        ),
        windowed=windowed,
        marker=marker,
        small_marker=marker is not None and out_bytes[marker] <= window.SMALL_MARKER_BYTES,
        aliased=tuple(i for i, a in enumerate(lowered.aliased) if a),
        physical_inputs=any(jp.is_extended(a) for a in lowered.in_avals),
        uses_tokens=bool(lowered.ordered_effects or lowered.host_callbacks),
        in_layouts=_stated_input_layouts(lowered, loaded),
    )


def xla_layouts(lowered: LoweredModule, loaded: Any) -> tuple[list[Any], list[Any]]:
    """The layouts XLA compiled each input and output for (tokens dropped), as jax Layouts."""
    n_tokens = len(lowered.ordered_effects)
    ins = [Layout.from_pjrt_layout(x) for x in loaded.get_parameter_layouts()[n_tokens:]]
    outs = [Layout.from_pjrt_layout(x) for x in loaded.get_output_layouts()[n_tokens:]]
    return ins, outs


def _stated_input_layouts(lowered: LoweredModule, loaded: Any) -> tuple[Any, ...]:
    if not any(s is not None and s.layout is not None for s in lowered.in_specs):
        return ()
    chosen = xla_layouts(lowered, loaded)[0]
    return tuple(
        None if s is None or s.layout is None else c
        for s, c in zip(lowered.in_specs, chosen, strict=True)
    )
