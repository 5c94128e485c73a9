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
from .devices import CONTEXT_MESH, DeviceSource, incompatible_devices

MSG_BAD_MESH = """\
mesh(devices, axis_names): {detail}. Pass a numpy array of devices with one named axis per
dimension, e.g. mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))."""

MSG_MESH_MISMATCH = """\
{where}: this NamedSharding is over the mesh {mesh}, but the call runs over {source}, \
{expected}. A NamedSharding given as a spec must use that mesh: build it from the same \
mesh, or pass its PartitionSpec alone (NamedSharding(mesh, spec).spec)."""

# jax's sentences as jax words them (the door alone before "requires"), then ours.
MSG_NO_MESH = """\
{door} requires a non-empty mesh in context if you are passing `PartitionSpec`s to {name}. \
You can define a context mesh via `jax.set_mesh(mesh)`. Alternatively, provide `Sharding`s \
to {name} and then the mesh context manager is not required. partitioner's own context works \
too, around the call of {api}:

    with partitioner.mesh(devices, ("data", "model")):
        y = f(x)

The mesh is looked up when the function is called or lowered, not when it is wrapped."""

MSG_MESH_NOT_LENT = """
{where} names a mesh, but as in jax a NamedSharding does not lend its mesh to the \
PartitionSpecs beside it: write those as NamedSharding(mesh, spec) too, or enter the mesh."""


def as_auto_mesh(m: Mesh) -> Mesh:
    """``m`` with every axis of type Auto.

    Meshes are interned, so the twin of an equal mesh is the same object (no
    retrace).
    """
    auto = (AxisType.Auto,) * len(m.axis_names)
    if tuple(m.axis_types) == auto:
        return m
    return Mesh(m.devices, m.axis_names, axis_types=auto)


def has_explicit_axes(m: Mesh) -> bool:
    """True when some axis of ``m`` is Explicit: values are typed with their shardings.

    NOTE [explicit axes]: jax 0.10.2's ``make_mesh`` defaults to Explicit axes.
    Over such a mesh jax.jit carries shardings in the types (``float32[8@x, 4]``),
    checks them op by op and lowers each op with its type's sharding; partitioner
    does the same, so a call keeps the mesh's axis types. A mesh with no Explicit
    axis (Auto, or Manual from an enclosing map) is the GSPMD-style model of the
    2022 API: values are untyped and partitioner works on its Auto twin.
    """
    return any(t == AxisType.Explicit for t in m.axis_types)


def as_call_mesh(m: Mesh) -> Mesh:
    """The mesh a call runs over: ``m`` itself when it has Explicit axes, else its Auto twin."""
    return m if has_explicit_axes(m) else as_auto_mesh(m)


def result_mesh(m: Mesh, aval: Any) -> Mesh:
    """The mesh a result typed ``aval`` of a call over ``m`` is reported over.

    Inside ``auto_axes`` / ``explicit_axes`` (or ``use_abstract_mesh``) a value's
    type names the call's mesh with other axis types; jax.jit reports such a
    result (a residual, say) over the concrete mesh with *those* axis types, so
    that its type read back (``jax.typeof``) is the one it was traced with.
    """
    typed = getattr(getattr(aval, "sharding", None), "mesh", None)
    if typed is None or typed.empty or not has_explicit_axes(m):
        return m
    if typed.axis_types == m.axis_types or typed.shape_tuple != m.abstract_mesh.shape_tuple:
        return m
    return Mesh(m.devices, m.axis_names, axis_types=typed.axis_types)


@contextlib.contextmanager
def typed_context(m: Mesh) -> Iterator[None]:
    """Trace or lower a body of a call over ``m`` as jax.jit does (NOTE [explicit axes]).

    Over a mesh with Explicit axes, jax's sharding rules read the abstract mesh
    in context (and ``jax.device_put``/``reshard`` the concrete one), so both are
    set to ``m`` for the duration, as jax's pjit does while tracing. Inside
    ``auto_axes`` / ``explicit_axes`` around the call the abstract mesh in context
    is ``m`` with other axis types, and the arguments are typed over it: it is
    kept, as jax.jit keeps it. Over other meshes nothing changes.
    """
    if not has_explicit_axes(m):
        yield
        return
    abstract = jax_private.get_abstract_mesh()
    if not _retyped(abstract, m):
        abstract = m.abstract_mesh
    with jax_private.use_concrete_mesh(m), jax_private.use_abstract_mesh(abstract):
        yield


def _retyped(abstract: Any, m: Mesh) -> bool:
    """Whether ``abstract`` is ``m``'s abstract mesh with other axis types."""
    ours = m.abstract_mesh
    return (
        not abstract.empty
        and abstract.shape_tuple == ours.shape_tuple
        and abstract.axis_types != ours.axis_types
    )


def make_mesh(
    devices: Any, axis_names: Sequence[Any], axis_types: Sequence[AxisType] | None = None
) -> Mesh:
    """Validate ``(devices, axis_names, axis_types)`` and build a jax Mesh (Auto by default)."""
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
    types = _axis_types(axis_types, names)
    return Mesh(arr, names, axis_types=types)


def _axis_types(
    axis_types: Sequence[AxisType] | None, names: tuple[Any, ...]
) -> tuple[AxisType, ...]:
    if axis_types is None:
        return (AxisType.Auto,) * len(names)
    types = (axis_types,) if isinstance(axis_types, AxisType) else tuple(axis_types)
    if len(types) != len(names) or not all(isinstance(t, AxisType) for t in types):
        raise ValueError(
            MSG_BAD_MESH.format(
                detail=f"axis_types must be one jax.sharding.AxisType per axis name {names}, "
                f"got {axis_types!r}"
            )
        )
    return types


@contextlib.contextmanager
def mesh(
    devices: Any, axis_names: Sequence[Any], axis_types: Sequence[AxisType] | None = None
) -> Iterator[Mesh]:
    """Run the block with ``devices`` arranged as a mesh with ``axis_names``.

    Thread-local and nestable; the innermost mesh wins and the previous one is
    restored on exit, also when the block raises. Usable as a decorator too.

    Args:
        devices: a numpy object array of jax devices, one dimension per axis.
        axis_names: one name per dimension of ``devices``.
        axis_types: one ``jax.sharding.AxisType`` per axis (default: all Auto).
            Explicit axes carry shardings in the types (NOTE [explicit axes]).

    Yields:
        The ``jax.sharding.Mesh`` now in context.
    """
    m = make_mesh(devices, axis_names, axis_types)
    jax_private.push_mesh(m)
    try:
        yield m
    finally:
        jax_private.pop_mesh()


def current_mesh(api: str) -> Mesh:
    """The innermost mesh in context (as :func:`as_call_mesh`), or a RuntimeError naming ``api``."""
    return resolve_mesh(api, (), bare_specs=True)


def resolve_mesh(api: str, named: Sequence[tuple[str, Any, str]], *, bare_specs: bool) -> Mesh:
    """The mesh a constraint runs over: the innermost in context, else its NamedShardings'
    (``bare_specs``: some spec is a PartitionSpec alone, which only a mesh in context
    gives a meaning)."""
    context = jax_private.ambient_mesh()
    return resolve_call_mesh(api, named, context, "shardings", bare_specs=bare_specs)[0]


def resolve_call_mesh(
    api: str,
    named: Sequence[tuple[str, Any, str]],
    context: Mesh | None,
    spec_name: str,
    door: str | None = None,
    *,
    bare_specs: bool,
) -> tuple[Mesh, DeviceSource]:
    """The mesh a call runs over: ``context``, else the one its NamedShardings name;
    and what put the call there, for jax's device messages.

    Args:
        api: names the caller in messages.
        named: ``(where, mesh, kind)`` of every NamedSharding given as a spec.
        context: the mesh in context the caller reads (jit and pjit read different ones).
        spec_name: the spec argument a PartitionSpec without a mesh was given to.
        door: the front door jax's no-mesh sentence names (``"jit"``) where ``api``
            names more (``"jit f"``); ``api`` where None.
        bare_specs: some spec is a PartitionSpec alone (no mesh of its own). It
            needs ``context``: as in jax, the mesh of a NamedSharding beside it
            does not stand in.

    Raises:
        RuntimeError: no mesh in context, and a bare PartitionSpec or no
            NamedSharding to take one from.
        ValueError: a NamedSharding's mesh differs from the mesh in context (or
            from the other NamedShardings' mesh); names both meshes (jax's
            "Received incompatible devices" where their devices differ).
    """
    m = context
    if m is None and (bare_specs or not named):
        message = MSG_NO_MESH.format(door=door or api, api=api, name=spec_name)
        if named:
            message += MSG_MESH_NOT_LENT.format(where=named[0][0])
        raise RuntimeError(message)
    mesh = as_call_mesh(m if m is not None else named[0][1])
    source = "the mesh in context" if m is not None else f"the mesh of {named[0][0]}"
    origin = DeviceSource(tuple(mesh.devices.flat), CONTEXT_MESH if m is not None else named[0][2])
    for where, other, kind in named:
        # A NamedSharding over the mesh with other axis types names the same devices.
        if as_auto_mesh(other) == as_auto_mesh(mesh):
            continue
        if set(other.devices.flat) != set(mesh.devices.flat):
            raise incompatible_devices(api, origin, DeviceSource(tuple(other.devices.flat), kind))
        raise ValueError(
            MSG_MESH_MISMATCH.format(
                where=where, mesh=_describe(other), source=source, expected=_describe(mesh)
            )
        )
    return mesh, origin


def _describe(m: Mesh) -> str:
    return f"{dict(m.shape)} over devices {[d.id for d in m.devices.flat]}"


def maybe_current_mesh() -> Mesh | None:
    """The innermost mesh in context (as :func:`as_call_mesh`), or None."""
    m = jax_private.ambient_mesh()
    return None if m is None else as_call_mesh(m)
