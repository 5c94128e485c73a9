"""Spec leaves beyond PartitionSpec: one-device shardings and ``Format`` (layout) leaves.

``jax.jit`` takes any of ``NamedSharding``, ``SingleDeviceSharding`` and
``jax.experimental.layout.Format`` (a sharding plus a memory layout, or
``Layout.AUTO`` for "XLA picks") as an in/out sharding. partitioner reads them
into its one spec type (``ParsedPartitionSpec``: partitions, memory kind,
layout); the devices they name become the call's mesh (``sharding/mesh_env.py``).
A SingleDeviceSharding names a one-device mesh with a reserved axis name, so
results on it are reported as ``SingleDeviceSharding`` again, as jax.jit does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from .. import jax_private as jp
from .memory import resolve_input_memory
from .parsed import ParsedPartitionSpec

#: The jax objects a spec tree may hold besides PartitionSpecs and None.
SHARDING_LEAVES = (NamedSharding, SingleDeviceSharding, Format)

#: The axis of the one-device mesh a SingleDeviceSharding leaf stands for.
SINGLE_DEVICE_AXIS = "_single_device"

MSG_LAYOUT_RANK = """\
Length of major_to_minor and the rank of the value should match. Got \
major_to_minor={major_to_minor} and shape={shape}
{where}: its layout {layout} orders {n} dimension(s), but the value has shape {shape}. \
A Layout's major_to_minor lists every dimension once, e.g. Layout(major_to_minor={example})."""

MSG_LAYOUT_MISMATCH = """\
Layout passed to jit does not match the layout on the respective arg. Got jit layout: \
{wanted},
arg layout: {got} for arg type: {aval}.
{where}: its spec asks for layout {wanted}, but the argument is laid out as {got}. {api} \
does not relayout committed arrays implicitly, as jax.jit does not. Lay it out first \
(jax.device_put(x, Format(layout, sharding))) or ask for the layout it has."""

MSG_AUTO_WITH_ARRAY = """\
{where}: its spec asks for Layout.AUTO, but the argument is a jax.Array with a concrete \
layout {got}. Layout.AUTO lets XLA choose the layout at compile time: lower with a \
jax.ShapeDtypeStruct for it, then lay arguments out as Compiled.input_formats says."""


def single_device_mesh(device: Any) -> Mesh:
    """The one-device mesh a SingleDeviceSharding leaf stands for."""
    return Mesh(np.array([device]), (SINGLE_DEVICE_AXIS,))


def leaf_mesh(leaf: Any) -> Mesh | None:
    """The mesh a spec leaf names (None for PartitionSpecs, None and shardingless Formats)."""
    if isinstance(leaf, Format):
        leaf = leaf.sharding
    if isinstance(leaf, NamedSharding):
        return leaf.mesh  # type: ignore[return-value]
    if isinstance(leaf, SingleDeviceSharding):
        return single_device_mesh(next(iter(leaf.device_set)))
    return None


def as_reported(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """``sharding`` as jax.jit reports it: a SingleDeviceSharding on a one-device leaf's mesh."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    mesh = sharding.mesh
    if tuple(mesh.axis_names) == (SINGLE_DEVICE_AXIS,):
        return SingleDeviceSharding(mesh.devices.flat[0], memory_kind=sharding.memory_kind)  # type: ignore[union-attr]
    return sharding


def xla_layout_text(layout: Any, aval: Any) -> str | None:
    """``mhlo.layout_mode`` for a spec's layout: "auto", XLA's layout string, or None."""
    if layout is None:
        return None
    if not isinstance(layout, Layout):
        return "auto"
    return str(layout._to_xla_layout(jp.physical_aval(aval).dtype))


def check_layouts(
    api: str,
    specs: Sequence[ParsedPartitionSpec | None],
    avals: Sequence[Any],
    where: Callable[[int], str],
    leaves: Sequence[Any] | None = None,
) -> None:
    """Each stated layout fits its value (and, for inputs, the argument's own layout).

    Raises:
        ValueError: a layout of the wrong rank; an argument committed to another
            layout; ``Layout.AUTO`` for a concrete jax.Array (as jax.jit says).
    """
    for i, (spec, aval) in enumerate(zip(specs, avals, strict=True)):
        layout = None if spec is None else spec.layout
        if layout is None:
            continue
        shape = tuple(aval.shape)
        if isinstance(layout, Layout) and len(layout.major_to_minor) != len(shape):
            raise ValueError(
                MSG_LAYOUT_RANK.format(
                    major_to_minor=layout.major_to_minor,
                    where=where(i),
                    layout=layout,
                    n=len(layout.major_to_minor),
                    shape=shape,
                    example=tuple(range(len(shape))),
                )
            )
        leaf = None if leaves is None else leaves[i]
        if not (isinstance(leaf, jax.Array) and not isinstance(leaf, jp.Tracer)):
            continue
        got = _layout_of(leaf)
        if not isinstance(layout, Layout):
            raise ValueError(MSG_AUTO_WITH_ARRAY.format(where=where(i), got=got))
        if leaf.committed and not same_layout(layout, got):
            raise ValueError(
                MSG_LAYOUT_MISMATCH.format(
                    where=where(i),
                    wanted=layout,
                    got=got,
                    api=api.split(" ")[0],
                    aval=jp.shaped_abstractify(leaf),
                )
            )


def same_layout(asked: Layout, got: Any) -> bool:
    """Whether ``got`` (a concrete layout) is the layout ``asked`` states (tiling may be open)."""
    if got is None or tuple(asked.major_to_minor) != tuple(got.major_to_minor):
        return False
    return asked.tiling is None or tuple(asked.tiling) == tuple(got.tiling or ())


def resolve_inputs(
    api: str,
    specs: Sequence[ParsedPartitionSpec],
    leaves: Sequence[Any],
    avals: Sequence[Any],
    where: Callable[[int], str],
    mesh: Mesh,
) -> tuple[tuple[ParsedPartitionSpec, ...], tuple[Any, ...]]:
    """The inputs' memory kinds and layouts, checked against the arguments (before tracing).

    Returns ``(specs, avals)`` in the memory kinds the arguments will live in
    (:func:`spec.memory.resolve_input_memory`).
    """
    default_kind = mesh.devices.flat[0].default_memory().kind  # type: ignore[union-attr]
    specs, avals = resolve_input_memory(api, specs, leaves, avals, where, default_kind)
    check_layouts(api, specs, avals, where, leaves)
    return tuple(_with_arg_layout(s, x) for s, x in zip(specs, leaves, strict=True)), avals


def _with_arg_layout(spec: ParsedPartitionSpec, leaf: Any) -> ParsedPartitionSpec:
    """A committed array (or a ShapeDtypeStruct) in a non-default layout is taken in it.

    The program is compiled for the layout the argument has, rather than reading
    its buffers as if they were laid out by default (a wrong result).
    """
    if spec.layout is not None:
        return spec
    if isinstance(leaf, jax.ShapeDtypeStruct):  # a layout given on the struct
        fmt = getattr(leaf, "format", None)
        layout = getattr(fmt, "layout", None)
        if isinstance(layout, Layout) and not is_default_layout(layout, len(leaf.shape)):
            return spec.with_layout(layout)
        return spec
    if not isinstance(leaf, jax.Array):
        return spec
    if isinstance(leaf, jp.Tracer) or not leaf.committed or leaf.is_deleted():
        return spec
    layout = _layout_of(leaf)
    if layout is None or is_default_layout(layout, leaf.ndim):
        return spec
    return spec.with_layout(layout)


def _layout_of(x: jax.Array) -> Layout | None:
    """A concrete array's layout (None where it has none to report, e.g. typed key arrays)."""
    fmt = getattr(x, "format", None)
    return None if fmt is None else fmt.layout


def is_default_layout(layout: Layout, ndim: int) -> bool:
    """Whether ``layout`` is XLA's default for an ``ndim``-dimensional dense array."""
    return tuple(layout.major_to_minor) == tuple(range(ndim)) and not layout.tiling


MSG_COMPILED_LAYOUT = """\
{where}: the computation was compiled for input layouts that disagree with the layouts of \
arguments passed to it: compiled for {wanted}, got {got}. Lay the argument out as \
Compiled.input_formats says (jax.device_put(x, fmt)), or lower again for this layout."""


def check_compiled_layouts(
    leaves: Sequence[Any], layouts: Sequence[Any], where: Callable[[int], str]
) -> None:
    """Arrays passed to a ``Compiled`` must be in the layouts it was compiled for (as jax's).

    ``layouts[i]`` is the layout input ``i`` was compiled for, None for XLA's default.

    Raises:
        ValueError: a jax.Array in another layout (it would be read wrongly).
    """
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or isinstance(leaf, jp.Tracer):
            continue
        if leaf.is_deleted():
            continue
        got = _layout_of(leaf)
        wanted = layouts[i] if i < len(layouts) else None
        if got is None:
            continue
        ok = is_default_layout(got, leaf.ndim) if wanted is None else same_layout(wanted, got)
        if not ok:
            raise ValueError(
                MSG_COMPILED_LAYOUT.format(
                    where=where(i), wanted=wanted or "the default layout", got=got
                )
            )
