"""Round-trip checks: a layout survives every form partitioner converts it between.

A sharding rule (logical axis names to mesh axes, an FSDP helper, a checkpoint
resharder) produces specs, and partitioner carries each spec through several forms on
its way to XLA and back: an XLA ``OpSharding`` (``get_aval_sharding_proto`` and
``parse_op_sharding``), the HLO sharding text of an ``mhlo.sharding`` attribute, a
``jax.sharding.NamedSharding``, and pmap's ``ShardingSpec``. Each check takes a spec
over a mesh for a value of some shape, sends it through one form and back, and raises
an ``AssertionError`` that shows both sides (and the form in between) unless the
layout comes back.

NOTE [round-trip equality]: equality is semantic by default: two specs are equal when
jax's ``NamedSharding.is_equivalent_to`` says so for the value's rank, i.e. the same
devices hold the same pieces (so ``P('x')`` over a size-1 axis ``'x'`` equals
``P()``). ``strict=True`` asks for the same spec: the same mesh axes on every
dimension, and the same memory kind through a NamedSharding (the one form that
carries it; none carries UNCONSTRAINED, which each lays out whole); only the spelling of an entry (``'x'`` or ``('x',)``, ``None`` or
``()``) and trailing unpartitioned dimensions may differ.

A spec that is invalid for the mesh or the shape (an axis used twice, an axis not in
the mesh, more entries than dimensions) fails with the ``ValueError`` or
``TypeError`` partitioner's parsers give it, naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from .._src import jax_private as jp
from .._src.sharding.checks import check_spec
from .._src.sharding.op_sharding import (
    get_aval_sharding_proto,
    hlo_sharding_text,
    parse_op_sharding_parsed,
)
from .._src.sharding.parsed import ParsedPartitionSpec
from .._src.sharding.sharding_spec import sharding_spec_from_parsed

MSG_CHANGED = """\
{trip} changed the {what} of a {shape} value over {mesh}:
  sent:     {sent}
  via:      {via}
  returned: {returned}{why}"""

MSG_LAYOUTS_DIFFER = """\
the two shardings lay a {shape} value out differently ({count} of {total} devices differ):
{rows}
  first:  {a}
  second: {b}"""

#: At most this many devices are listed in a layout difference; the count says the rest.
MAX_ROWS = 8


def _checked(spec: Any, mesh: Mesh, shape: Sequence[int], where: str) -> ParsedPartitionSpec:
    """``spec`` parsed and checked against ``mesh`` and ``shape`` (no divisibility)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{where}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if isinstance(spec, NamedSharding) and spec.mesh != mesh:
        raise ValueError(
            f"{where}: the NamedSharding's mesh {_describe_mesh(spec.mesh)} is not the mesh "
            f"given, {_describe_mesh(mesh)}; pass its own mesh (sharding.mesh)"
        )
    parsed = ParsedPartitionSpec.coerce(spec, f"{where} spec", allow_unconstrained=True)
    check_spec(parsed, tuple(shape), mesh, where, check_divisible=False)
    return parsed


def _carried(spec: ParsedPartitionSpec, *, memory: bool) -> ParsedPartitionSpec:
    """What a form can carry of ``spec``: its mesh axes, and its memory kind if ``memory``.

    None of the forms carries UNCONSTRAINED (each lays such a dimension out whole)
    or a memory layout; only a NamedSharding carries a memory kind.
    """
    return ParsedPartitionSpec(
        spec.unsafe_user_spec, spec.partitions, memory_kind=spec.memory_kind if memory else None
    )


def _named(spec: ParsedPartitionSpec, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, spec.to_closed_spec(), memory_kind=spec.memory_kind)


def _same(
    a: ParsedPartitionSpec, b: ParsedPartitionSpec, mesh: Mesh, ndim: int, strict: bool
) -> bool:
    """NOTE [round-trip equality]."""
    if strict:
        return a == b
    return _named(a, mesh).is_equivalent_to(_named(b, mesh), ndim)


def _compare(
    trip: str,
    sent: ParsedPartitionSpec,
    returned: ParsedPartitionSpec,
    via: str,
    mesh: Mesh,
    shape: Sequence[int],
    strict: bool,
) -> None:
    if _same(sent, returned, mesh, len(shape), strict):
        return
    raise AssertionError(
        MSG_CHANGED.format(
            trip=trip,
            what="spec" if strict else "layout",
            shape=tuple(shape),
            mesh=_describe_mesh(mesh),
            sent=_describe(sent),
            via=via,
            returned=_describe(returned),
            why=(
                "\n  (strict: the same mesh axes on every dimension; size-1 axes count)"
                if strict and _same(sent, returned, mesh, len(shape), False)
                else ""
            ),
        )
    )


def _describe(spec: ParsedPartitionSpec) -> str:
    text = repr(spec.to_partition_spec())
    if spec.memory_kind is not None:
        text += f" in memory {spec.memory_kind!r}"
    return text


def _describe_mesh(mesh: Any) -> str:
    axes = ", ".join(f"{name!r}: {size}" for name, size in mesh.shape.items())
    return f"Mesh({axes})"


def assert_op_sharding_round_trip(
    spec: Any, mesh: Mesh, shape: Sequence[int], *, strict: bool = False
) -> None:
    """spec -> ``OpSharding`` -> spec, in both of XLA's device-list encodings.

    ``get_aval_sharding_proto`` builds the OpSharding (explicit device list, then iota
    form) and ``parse_op_sharding`` reads it back.

    Args:
        spec: a PartitionSpec, a ParsedPartitionSpec, a NamedSharding (its spec) or
            None (replicated).
        mesh: the mesh the spec lays the value out over.
        shape: the value's shape (a shape the spec does not divide evenly is allowed:
            XLA pads).
        strict: compare specs, not layouts (NOTE [round-trip equality] in the module
            docstring).

    Raises:
        AssertionError: the spec came back as another layout (or, strictly, another
            spec), with both sides and the OpSharding in the message.
        ValueError, TypeError: the spec is not valid for ``mesh`` and ``shape``.
    """
    sent = _carried(_checked(spec, mesh, shape, "assert_op_sharding_round_trip"), memory=False)
    aval = jax.ShapeDtypeStruct(tuple(shape), np.float32)
    for encoding in ("explicit", "iota"):
        proto = get_aval_sharding_proto(aval, sent, mesh, encoding=encoding)
        returned = parse_op_sharding_parsed(proto, mesh)
        assert isinstance(returned, ParsedPartitionSpec)  # one value: not a TUPLE sharding
        via = f"OpSharding {jp.HloSharding.from_proto(proto)} ({encoding} device list)"
        _compare("spec -> OpSharding -> spec", sent, returned, via, mesh, shape, strict)


def assert_hlo_text_round_trip(
    spec: Any, mesh: Mesh, shape: Sequence[int], *, strict: bool = False
) -> None:
    """spec -> HLO sharding text (``{devices=[2,4]<=[8]}``) -> spec.

    The text is what partitioner writes into a GSPMD module's ``mhlo.sharding``
    attributes; XLA's own parser reads it back to an HloSharding, which
    ``parse_op_sharding`` turns into a spec. Arguments and errors as
    :func:`assert_op_sharding_round_trip`.
    """
    sent = _carried(_checked(spec, mesh, shape, "assert_hlo_text_round_trip"), memory=False)
    text = hlo_sharding_text(jax.ShapeDtypeStruct(tuple(shape), np.float32), sent, mesh)
    returned = parse_op_sharding_parsed(jp.HloSharding.from_string(text), mesh)
    assert isinstance(returned, ParsedPartitionSpec)
    _compare("spec -> HLO sharding text -> spec", sent, returned, text, mesh, shape, strict)


def assert_named_sharding_round_trip(
    spec: Any, mesh: Mesh, shape: Sequence[int], *, strict: bool = False
) -> None:
    """ParsedPartitionSpec <-> ``NamedSharding``, both ways round.

    The parsed spec becomes ``NamedSharding(mesh, spec, memory_kind=...)`` and is
    parsed back (as a spec leaf of ``pjit`` is), and that NamedSharding, parsed and
    rebuilt, must equal it; a NamedSharding given as ``spec`` starts the trip with
    its own memory kind, which must survive. Arguments and errors as
    :func:`assert_op_sharding_round_trip`.
    """
    where = "assert_named_sharding_round_trip"
    sent = _carried(_checked(spec, mesh, shape, where), memory=True)
    named = _named(sent, mesh)
    returned = ParsedPartitionSpec.from_user_input(named, f"{where} NamedSharding")
    if sent.memory_kind is None:  # no memory kind stated: the devices' default, as jax fills in
        sent = sent.with_memory_kind(named.memory_kind)
    _compare("spec -> NamedSharding -> spec", sent, returned, repr(named), mesh, shape, strict)
    again = _named(returned, mesh)
    same = again == named if strict else again.is_equivalent_to(named, len(shape))
    if not same:
        raise AssertionError(
            MSG_CHANGED.format(
                trip="NamedSharding -> spec -> NamedSharding",
                what="sharding" if strict else "layout",
                shape=tuple(shape),
                mesh=_describe_mesh(mesh),
                sent=repr(named),
                via=_describe(returned),
                returned=repr(again),
                why="",
            )
        )


def assert_sharding_spec_round_trip(
    spec: Any, mesh: Mesh, shape: Sequence[int], *, strict: bool = False
) -> None:
    """spec -> pmap's ``ShardingSpec`` -> spec, and the same pieces on the same devices.

    ``sharding_spec_from_parsed`` builds the ShardingSpec; its ``to_op_sharding()``,
    parsed, is the spec it describes. Where ``shape`` divides evenly (a ShardingSpec
    has no padded blocks), ``ShardingSpec.indices(shape)`` must also give every device
    the index ranges jax's ``NamedSharding`` gives it (:func:`assert_same_layout`).
    Arguments and errors as :func:`assert_op_sharding_round_trip`.
    """
    where = "assert_sharding_spec_round_trip"
    sent = _carried(_checked(spec, mesh, shape, where), memory=False)
    sharding_spec = sharding_spec_from_parsed(tuple(shape), sent, mesh)
    returned = parse_op_sharding_parsed(sharding_spec.to_op_sharding(), mesh)
    assert isinstance(returned, ParsedPartitionSpec)
    _compare(
        "spec -> ShardingSpec -> spec", sent, returned, repr(sharding_spec), mesh, shape, strict
    )
    try:
        check_spec(sent, tuple(shape), mesh, where)
    except ValueError:
        return  # uneven: a ShardingSpec's blocks are equal, so it has no indices for it
    indices = sharding_spec.indices(tuple(shape))
    by_device = dict(zip(mesh.devices.flat, indices.flat, strict=True))
    assert_same_layout(by_device, _named(sent, mesh), shape)


def assert_round_trips(
    spec: Any, mesh: Mesh, shape: Sequence[int], *, strict: bool = False
) -> None:
    """Every round trip above: OpSharding, HLO text, NamedSharding and ShardingSpec.

    The one call to make inside a property over a sharding rule: the spec the rule
    gives is valid for ``mesh`` and ``shape`` and means the same layout in every form
    partitioner hands to XLA or reads back. Arguments and errors as
    :func:`assert_op_sharding_round_trip`.
    """
    assert_op_sharding_round_trip(spec, mesh, shape, strict=strict)
    assert_hlo_text_round_trip(spec, mesh, shape, strict=strict)
    assert_named_sharding_round_trip(spec, mesh, shape, strict=strict)
    assert_sharding_spec_round_trip(spec, mesh, shape, strict=strict)


# --- the same pieces on the same devices ---


def assert_same_layout(a: Any, b: Any, shape: Sequence[int]) -> None:
    """The same devices hold the same index ranges of a value of ``shape`` under ``a`` and ``b``.

    Each side is a ``jax.sharding.Sharding`` (any kind: NamedSharding, a single
    device's, ...), a ``jax.Array`` (its sharding), or a mapping from device to the
    index each holds (what ``devices_indices_map`` gives). An index range is compared
    as ``(start, stop)`` per dimension, so ``slice(None)`` equals ``slice(0, n)``. A
    shape a sharding does not divide evenly is laid out as XLA pads it: blocks of
    ``ceil(size / pieces)``, the last ones shorter or empty.

    Raises:
        AssertionError: a device holds different ranges, or is on one side only; the
            message lists them (up to 8) and both shardings.
        TypeError: a side is none of the above.
    """
    shape = tuple(int(n) for n in shape)
    left, right = _index_ranges(a, shape), _index_ranges(b, shape)
    if left == right:
        return
    differ = [d for d in {**left, **right} if left.get(d) != right.get(d)]
    rows = [
        f"  {d}: {_ranges_text(left.get(d))} vs {_ranges_text(right.get(d))}"
        for d in sorted(differ, key=_device_key)[:MAX_ROWS]
    ]
    raise AssertionError(
        MSG_LAYOUTS_DIFFER.format(
            shape=shape,
            count=len(differ),
            total=len({**left, **right}),
            rows="\n".join(rows),
            a=_side_text(a),
            b=_side_text(b),
        )
    )


Ranges = tuple[tuple[int, int], ...]


def _index_ranges(x: Any, shape: tuple[int, ...]) -> dict[Any, Ranges]:
    """``{device: ((start, stop), ...)}`` for a sharding, an array or an index mapping."""
    if isinstance(x, Mapping):
        return {d: _as_ranges(index, shape) for d, index in x.items()}
    sharding = x.sharding if isinstance(x, jax.Array) else x
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            "assert_same_layout takes jax Shardings, jax.Arrays or {device: index} mappings, "
            f"got {type(x).__name__}"
        )
    try:
        mapping = sharding.devices_indices_map(shape)
    except ValueError:  # jax refuses uneven shapes: lay it out as XLA pads it
        return _padded_ranges(sharding, shape)
    return {d: _as_ranges(index, shape) for d, index in mapping.items()}


def _as_ranges(index: Any, shape: tuple[int, ...]) -> Ranges:
    index = index if isinstance(index, tuple) else (index,)
    index = index + (slice(None),) * (len(shape) - len(index))
    out = []
    for i, n in zip(index, shape, strict=True):
        if isinstance(i, slice):
            start, stop, _ = i.indices(n)
            out.append((start, stop))
        else:  # an integer index (pmap's Unstacked): one element
            out.append((int(i), int(i) + 1))
    return tuple(out)


def _padded_ranges(sharding: Any, shape: tuple[int, ...]) -> dict[Any, Ranges]:
    """Each device's ranges as XLA tiles an uneven shape: ``ceil(size / pieces)`` blocks."""
    hlo = jp.hlo_sharding_of(sharding, len(shape))
    devices = jp.device_assignment_of(sharding)
    whole = tuple((0, n) for n in shape)
    if hlo.is_replicated():
        return {d: whole for d in devices}
    dims = list(hlo.tile_assignment_dimensions())
    tiled = len(shape)  # the trailing tile dimensions are replica groups
    positions = np.asarray(hlo.tile_assignment_devices()).reshape(dims)
    out: dict[Any, Ranges] = {}
    for tile in np.ndindex(*dims):
        ranges = []
        for n, pieces, i in zip(shape, dims[:tiled], tile[:tiled], strict=True):
            block = -(-n // pieces)
            ranges.append((min(i * block, n), min((i + 1) * block, n)))
        out[devices[int(positions[tile])]] = tuple(ranges)
    return out


def _ranges_text(ranges: Ranges | None) -> str:
    if ranges is None:
        return "(not on this side)"
    return "[" + ", ".join(f"{a}:{b}" for a, b in ranges) + "]"


def _device_key(device: Any) -> tuple[int, str]:
    return (getattr(device, "id", -1), repr(device))


def _side_text(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"a mapping over {len(x)} devices"
    return repr(x.sharding if isinstance(x, jax.Array) else x)
