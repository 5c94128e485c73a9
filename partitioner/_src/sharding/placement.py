"""Where a call runs when its specs leave it open: the arguments' own layouts and devices.

Why: ``jax.jit`` (and today's pjit) let the caller omit shardings. An omitted input
spec means "as the argument is laid out", and with no mesh in context the call runs
on the devices its committed arguments live on (a NamedSharding's mesh, a single
device), else on the default device. The front doors resolve both before tracing,
so everything below them still sees one mesh and one spec per value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from .. import jax_private as jp
from .devices import (
    CONTEXT_MESH,
    OUTPUT_SHARDING,
    DeviceSource,
    argument_source,
    incompatible_devices,
)
from .leaves import single_device_mesh
from .mesh_env import as_auto_mesh, as_call_mesh
from .op_sharding import parse_op_sharding_parsed
from .parsed import REPLICATED, ParsedPartitionSpec

#: The axis of the mesh a call runs over when its committed arguments' devices (several,
#: laid out by a sharding that names no mesh) decide it.
DEVICES_AXIS = "_devices"

MSG_SHARDING_MISMATCH = """\
Sharding passed to jit does not match the sharding on the respective arg. Got jit \
sharding: {expected},
arg sharding: {actual} for arg type: {aval}
{where} is committed to {actual}, but {api} was asked to lay it out as {expected}. \
Committed arrays are never moved behind your back (a hidden transfer): pass it laid out \
as asked (jax.device_put(x, {expected_short})), or leave its spec unspecified."""


@dataclass(frozen=True)
class Placement:
    """The devices of a call and how its results are handed back.

    Attributes:
        mesh: the (Auto-typed) mesh the program runs over.
        committed: the results are committed to their devices (False only when
            nothing committed the call: uncommitted arguments, no mesh).
        derived: no mesh was in context or named by a spec: the devices came from
            the arguments (``None`` specs then read as unspecified, as in jax).
        source: what put the call on these devices, as jax's device messages name
            it (None: nothing did, the default device).
        moves_arguments: ``jit(device=...)`` placed the call: as in jax.jit, every
            argument is moved there, committed ones too.
    """

    mesh: Mesh
    committed: bool = True
    derived: bool = False
    source: DeviceSource | None = None
    moves_arguments: bool = False


def is_committed(x: Any) -> bool:
    return isinstance(x, jax.Array) and not isinstance(x, jp.Tracer) and x.committed


def _placed_sharding(x: Any) -> Any:
    """The sharding that pins ``x`` to devices: a committed array's, or a lowering
    placeholder's (``ShapeDtypeStruct(..., sharding=...)``); else None."""
    if is_committed(x):
        return x.sharding
    if isinstance(x, jax.ShapeDtypeStruct) and isinstance(x.sharding, jax.sharding.Sharding):
        return x.sharding
    return None


def placement_from_arguments(
    api: str, leaves: Sequence[Any], labels: Sequence[str], device: Any = None
) -> Placement:
    """Where a call with no mesh in context runs: its committed arguments' devices.

    ``device`` (``jit(device=...)``) decides if given; else a NamedSharding
    argument brings its mesh, an argument committed to one device brings that
    device, and with none committed the call runs on the default device with
    uncommitted results (as ``jax.jit`` does).

    Args:
        labels: each argument's name (``x['w']``), as jax's messages give it.

    Raises:
        ValueError: committed arguments live on different device sets (jax's
            "Received incompatible devices", naming both).
    """
    if device is not None:  # jit(device=...) decides, whatever the arguments say
        source = DeviceSource((device,), OUTPUT_SHARDING)  # as jax.jit reads device=
        return Placement(
            single_device_mesh(device), derived=True, source=source, moves_arguments=True
        )
    fun_name = api.partition(" ")[2]
    first: tuple[DeviceSource, Any] | None = None
    for x, label in zip(leaves, labels, strict=True):
        sharding = _placed_sharding(x)
        if sharding is None:
            continue
        source = argument_source(label, fun_name, x, jp.device_assignment_of(sharding))
        if first is None:
            first = (source, sharding)
        elif set(sharding.device_set) != set(first[1].device_set):
            raise incompatible_devices(api, first[0], source)
    if first is None:
        return Placement(single_device_mesh(jp.default_device()), committed=False, derived=True)
    source, sharding = first
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return Placement(as_call_mesh(sharding.mesh), derived=True, source=source)
    devices = jp.device_assignment_of(sharding)
    if len(devices) == 1:
        return Placement(single_device_mesh(devices[0]), derived=True, source=source)
    return Placement(Mesh(np.array(devices), (DEVICES_AXIS,)), derived=True, source=source)


def placement_in_body(
    api: str, found: Sequence[tuple[Any, str, str]], placement: Placement
) -> Placement | None:
    """Where the body's own shardings put the call (constraints, ``device_put``, nested calls).

    As jax.jit: when nothing outside the body placed the call (no mesh, uncommitted
    arguments), the devices a sharding inside it names are the call's (its mesh,
    for a NamedSharding); otherwise every sharding inside must be over the call's
    devices.

    Args:
        found: ``(sharding, what it is, where in the user's code)`` of each sharding
            in the body (``sharding_constraint``, ``"f.py:3"``).

    Returns:
        The placement the body asks for, or None when the call stays where it is.

    Raises:
        ValueError: jax's "Received incompatible devices" between the call and its
            body, or between two shardings of the body.
    """
    if not found:
        return None
    sources = [
        DeviceSource(tuple(jp.device_assignment_of(s)), f"{eqn} inside jit", f" at {at}")
        for s, eqn, at in found
    ]
    adopt = placement.derived and not placement.committed
    reference = sources[0] if adopt else placement.source
    if reference is None:  # placed by its own mesh with no other origin: name the mesh
        reference = DeviceSource(tuple(placement.mesh.devices.flat), CONTEXT_MESH)
    for source in sources:
        if set(source.devices) != set(reference.devices):
            raise incompatible_devices(api, reference, source)
    if not adopt:
        return None
    first = found[0][0]
    if isinstance(first, NamedSharding) and isinstance(first.mesh, Mesh):
        return Placement(as_call_mesh(first.mesh), derived=True, source=sources[0])
    devices = sources[0].devices
    if len(devices) == 1:
        return Placement(single_device_mesh(devices[0]), derived=True, source=sources[0])
    return Placement(Mesh(np.array(devices), (DEVICES_AXIS,)), derived=True, source=sources[0])


def layout_spec(x: Any, mesh: Mesh) -> ParsedPartitionSpec | None:
    """The spec over ``mesh`` that ``x`` (a concrete jax.Array) is laid out with.

    None when no spec over ``mesh`` expresses its layout (other devices, another
    device order, a tiling that splits a mesh axis).
    """
    sharding = x.sharding
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        if as_auto_mesh(sharding.mesh) == as_auto_mesh(mesh):
            return ParsedPartitionSpec.coerce(sharding.spec, "argument sharding")
    if jp.device_assignment_of(sharding) != tuple(mesh.devices.flat):
        return REPLICATED if mesh.size == 1 and len(sharding.device_set) == 1 else None
    try:
        parsed = parse_op_sharding_parsed(jp.hlo_sharding_of(sharding, x.ndim), mesh)
    except ValueError:
        return None
    return parsed if isinstance(parsed, ParsedPartitionSpec) else None


def unspecified_input_spec(
    x: Any, mesh: Mesh, where: str, api: str, origin: DeviceSource | None = None
) -> ParsedPartitionSpec | None:
    """The spec an argument with an omitted spec gets: its own layout.

    A committed array keeps its layout; an uncommitted one (a numpy array, a
    Python scalar, an uncommitted jax.Array) and a tracer are left to XLA's
    propagation (None), which may partition it as the body's constraints ask
    (jax.jit's rule: the call then places the value as XLA chose); a
    ``ShapeDtypeStruct`` with a sharding (for ``.lower``) takes it.

    Raises:
        ValueError: a committed array whose layout no spec over ``mesh`` expresses.
    """
    if isinstance(x, jp.Tracer):
        return None
    if is_committed(x):
        spec = layout_spec(x, mesh)
        if spec is None and set(x.sharding.device_set) != set(mesh.devices.flat):
            raise _elsewhere(x, mesh, where, origin)
        if spec is None:
            raise ValueError(
                f"{where} is committed to {x.sharding}, which is not a layout over the mesh "
                f"{dict(mesh.shape)} (devices {[d.id for d in mesh.devices.flat]}) the call "
                f"runs over ({api}). Move it onto that mesh first: "
                "jax.device_put(x, NamedSharding(mesh, spec))."
            )
        return spec
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.ShapeDtypeStruct) and isinstance(sharding, NamedSharding):
        return ParsedPartitionSpec.coerce(sharding.spec, where)
    return REPLICATED if mesh.size == 1 else None


def check_committed_layout(
    x: Any, spec: ParsedPartitionSpec, mesh: Mesh, where: str, api: str
) -> None:
    """A committed array must already be laid out as its (given) spec asks, as in jax.jit.

    Raises:
        ValueError: naming the argument, both shardings and the fix.
    """
    if not is_committed(x):
        return
    # Only the layout is compared here: memory kinds are checked (and named in their
    # own error) by sharding/memory.py.
    wanted = NamedSharding(mesh, spec.to_closed_spec(), memory_kind=x.sharding.memory_kind)
    if x.sharding == wanted or x.sharding.is_equivalent_to(wanted, x.ndim):
        return
    raise ValueError(
        MSG_SHARDING_MISMATCH.format(
            aval=jp.shaped_abstractify(x),
            where=where,
            actual=x.sharding,
            api=api,
            expected=wanted,
            expected_short=f"NamedSharding(mesh, {spec.to_partition_spec()})",
        )
    )


def check_live(x: Any, where: str) -> None:
    """Raise a RuntimeError naming ``where`` if ``x`` is a deleted (e.g. donated) array."""
    if isinstance(x, jax.Array) and not isinstance(x, jp.Tracer) and x.is_deleted():
        raise RuntimeError(
            f"Array has been deleted with shape={x.aval.str_short()}.\n"
            f"{where} is an array that has been deleted, most likely donated to an earlier "
            "call (donate_argnums). Pass a live array, or stop donating it."
        )


def check_usable(x: Any, mesh: Mesh, where: str, origin: DeviceSource | None = None) -> None:
    """Reject an argument pjit cannot run on: deleted, or committed to other devices.

    Arrays committed to some of the mesh's devices are moved onto the mesh as
    their spec asks; ``jax.jit`` raises for devices outside its computation, and
    so does pjit, rather than copying between device sets behind the user's back.

    Args:
        where: ``"jit f: argument x"``: the call and the argument, for messages.
        origin: what put the call on ``mesh`` (jax's message names it).

    Raises:
        RuntimeError: ``x`` was deleted (most likely donated to an earlier call).
        ValueError: ``x`` is committed to a device outside the mesh.
    """
    check_live(x, where)
    if isinstance(x, jax.Array) and not isinstance(x, jp.Tracer) and x.committed:
        devices = {d.id for d in x.sharding.device_set}  # type: ignore[attr-defined]
        mesh_ids = {d.id for d in mesh.devices.flat}
        if not devices <= mesh_ids:
            raise _elsewhere(x, mesh, where, origin)


def _elsewhere(x: Any, mesh: Mesh, where: str, origin: DeviceSource | None) -> ValueError:
    """jax's "Received incompatible devices" for an argument committed off the call's mesh."""
    api, _, label = where.partition(": argument ")
    argument = argument_source(label, api.partition(" ")[2], x, jp.device_assignment_of(x.sharding))
    call = origin or DeviceSource(tuple(mesh.devices.flat), CONTEXT_MESH)
    error = incompatible_devices(api, argument, call)
    return ValueError(
        f"{error}\n{where} is committed to {x.sharding}, which is not on the mesh "
        f"{dict(mesh.shape)} (devices {[d.id for d in mesh.devices.flat]}) the call runs over. "
        "Move it onto the mesh first (jax.device_put(x, NamedSharding(mesh, spec))), or run "
        "under a mesh of its devices."
    )
