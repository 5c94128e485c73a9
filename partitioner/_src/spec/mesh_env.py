"""The mesh context: which devices and axis names a call runs over.

Why share jax's resource stack instead of keeping our own: users mix
``with partitioner.mesh(...)`` and ``with jax.sharding.Mesh(...)`` and expect the
innermost to win either way. One stack gives that for free, plus thread-locality.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from jax.sharding import AxisType, Mesh

from .. import jax_private

MSG_BAD_MESH = """\
mesh(devices, axis_names): {detail}. Pass a numpy array of devices with one named axis per
dimension, e.g. mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))."""

MSG_MESH_MISMATCH = """\
{where}: this NamedSharding is over the mesh {mesh}, but the call runs over {source}, \
{expected}. A NamedSharding given as a spec must use that mesh: build it from the same \
mesh, or pass its PartitionSpec alone (NamedSharding(mesh, spec).spec)."""

MSG_NO_MESH = """\
{api} needs a mesh in context, but none is active.
Wrap the call in a mesh context:

    with partitioner.mesh(devices, ("data", "model")):   # or: with jax.sharding.Mesh(...)
        y = f(x)

The mesh is looked up when the function is called or lowered, not when pjit is applied."""


def as_auto_mesh(m: Mesh) -> Mesh:
    """``m`` with every axis of type Auto.

    jax 0.10.2's ``make_mesh`` defaults to Explicit axes, which change how jax
    types sharded values; partitioner's specs are the Auto (GSPMD-style) model,
    so it always works on the Auto twin of a mesh. Meshes are interned, so the
    twin of an equal mesh is the same object (no retrace).
    """
    auto = (AxisType.Auto,) * len(m.axis_names)
    if tuple(m.axis_types) == auto:
        return m
    return Mesh(m.devices, m.axis_names, axis_types=auto)


def make_mesh(devices: Any, axis_names: Sequence[Any]) -> Mesh:
    """Validate ``(devices, axis_names)`` and build an Auto-typed jax Mesh."""
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    if not isinstance(axis_names, (tuple, list)):
        raise TypeError(
            MSG_BAD_MESH.format(
                detail=f"axis_names must be a tuple or list, got {type(axis_names).__name__}"
            )
        )
    names = tuple(axis_names)
    arr = devices if isinstance(devices, np.ndarray) else np.array(list(devices), dtype=object)
    if arr.ndim != len(names):
        raise ValueError(
            MSG_BAD_MESH.format(
                detail=f"devices has {arr.ndim} dimensions (shape {arr.shape}) but {len(names)} axis names {names} were given"
            )
        )
    if len(set(names)) != len(names):
        raise ValueError(MSG_BAD_MESH.format(detail=f"axis names {names} repeat a name"))
    if arr.size == 0:
        raise ValueError(MSG_BAD_MESH.format(detail="devices is empty"))
    return Mesh(arr, names, axis_types=(AxisType.Auto,) * len(names))


@contextlib.contextmanager
def mesh(devices: Any, axis_names: Sequence[Any]) -> Iterator[Mesh]:
    """Run the block with ``devices`` arranged as a mesh with ``axis_names``.

    Thread-local and nestable; the innermost mesh wins and the previous one is
    restored on exit, also when the block raises. Usable as a decorator too.

    Args:
        devices: a numpy object array of jax devices, one dimension per axis.
        axis_names: one name per dimension of ``devices``.

    Yields:
        The ``jax.sharding.Mesh`` now in context.
    """
    m = make_mesh(devices, axis_names)
    jax_private.push_mesh(m)
    try:
        yield m
    finally:
        jax_private.pop_mesh()


def current_mesh(api: str) -> Mesh:
    """The innermost mesh in context (Auto-typed), or a RuntimeError naming ``api``."""
    return resolve_mesh(api, ())


def resolve_mesh(api: str, named: Sequence[tuple[str, Any]]) -> Mesh:
    """The mesh a call runs over: the one in context, else the one its NamedShardings name.

    Args:
        api: names the caller in messages.
        named: ``(where, mesh)`` of every NamedSharding given as a spec.

    Raises:
        RuntimeError: no mesh in context and no NamedSharding to take one from.
        ValueError: a NamedSharding's mesh differs from the mesh in context (or
            from the other NamedShardings' mesh); names both meshes.
    """
    m = jax_private.ambient_mesh()
    if m is None and not named:
        raise RuntimeError(MSG_NO_MESH.format(api=api))
    mesh = as_auto_mesh(m if m is not None else named[0][1])
    source = "the mesh in context" if m is not None else f"the mesh of {named[0][0]}"
    for where, other in named:
        if as_auto_mesh(other) != mesh:
            raise ValueError(
                MSG_MESH_MISMATCH.format(
                    where=where,
                    mesh=_describe(other),
                    source=source,
                    expected=_describe(mesh),
                )
            )
    return mesh


def _describe(m: Mesh) -> str:
    return f"{dict(m.shape)} over devices {[d.id for d in m.devices.flat]}"


def maybe_current_mesh() -> Mesh | None:
    """The innermost mesh in context (Auto-typed), or None."""
    m = jax_private.ambient_mesh()
    return None if m is None else as_auto_mesh(m)
