"""The public strategies draw only valid objects, and every kind of them.

One run draws thousands of objects (meshes over real and stand-in devices, specs,
shapes even and uneven, NamedShardings, OpShardings, ShardingSpecs) and checks each
against jax's own constructors and parsers (``Mesh``, ``PartitionSpec``,
``NamedSharding`` and its ``shard_shape`` / ``devices_indices_map``, XLA's
``HloSharding``, jax's OpSharding parser) and partitioner's (``ParsedPartitionSpec``,
``prepare_axis_resources``, ``check_spec``, ``parse_op_sharding``); then it checks that
the run reached every kind the strategies promise.
"""

from __future__ import annotations

import collections
import importlib
import sys
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import parse_flatten_op_sharding
from jax.sharding import AxisType, Mesh, NamedSharding

from partitioner import (
    UNCONSTRAINED,
    ParsedPartitionSpec,
    get_aval_sharding_proto,
    parse_op_sharding,
    prepare_axis_resources,
)
from partitioner._testing import check_spec
from partitioner.sharding_spec import ShardingSpec
from partitioner.testing.strategies import (
    arrays,
    meshes,
    named_shardings,
    op_shardings,
    partition_specs,
    shapes,
    sharding_specs,
    specs_and_shapes,
)
from tests.helpers import STAND_INS

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

HloSharding = xc.HloSharding
JaxP = jax.sharding.PartitionSpec

#: Examples of the validity run; each draws seven objects (2,800 in all).
EXAMPLES = 400


POOL = STAND_INS


def _axes(entry: Any) -> tuple[Any, ...]:
    if entry is None or entry is UNCONSTRAINED:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def check_mesh(mesh: Mesh, pool: list[Any], seen: collections.Counter[str]) -> None:
    devices = list(mesh.devices.flat)
    assert len({id(d) for d in devices}) == len(devices), "a device twice"
    assert all(any(d is p for p in pool) for d in devices)
    assert len(pool) % mesh.size == 0, (mesh, len(pool))
    assert Mesh(mesh.devices, mesh.axis_names, axis_types=mesh.axis_types) == mesh
    seen["explicit mesh"] += AxisType.Explicit in mesh.axis_types
    seen["auto mesh"] += AxisType.Auto in mesh.axis_types
    seen["3+ axes"] += len(mesh.axis_names) >= 3
    seen["size-1 axis"] += 1 in mesh.devices.shape
    seen["devices out of order"] += [p for p in pool if any(p is d for d in devices)] != devices


def check_spec_and_shape(
    spec: Any, shape: tuple[int, ...], mesh: Mesh, uneven: bool, seen: collections.Counter[str]
) -> None:
    assert isinstance(spec, JaxP) and JaxP(*spec) == spec and len(spec) <= len(shape)
    parsed = ParsedPartitionSpec.from_user_input(spec, "drawn", allow_unconstrained=True)
    assert prepare_axis_resources(spec, "drawn", allow_unconstrained=True) == parsed
    check_spec(parsed, shape, mesh, "drawn", check_divisible=False)  # axes and rank
    sharding = NamedSharding(mesh, spec)  # refuses a repeated or unknown axis
    if uneven:
        with pytest.raises(ValueError):
            sharding.shard_shape(shape)
        with pytest.raises(ValueError, match="not divisible"):
            check_spec(parsed, shape, mesh, "drawn")
    else:
        block = sharding.shard_shape(shape)
        assert all(
            n == b * k
            for n, b, k in zip(shape, block, parsed.shards_per_dim(mesh, len(shape)), strict=True)
        )
    entries = list(spec)
    seen["tuple entry"] += any(isinstance(e, tuple) and len(e) > 1 for e in entries)
    seen["single-axis entry"] += any(len(_axes(e)) == 1 for e in entries)
    seen["None entry"] += None in entries
    seen["UNCONSTRAINED entry"] += any(e is UNCONSTRAINED for e in entries)
    seen["replicated spec"] += not parsed.mesh_axes
    seen["trailing None kept"] += bool(entries) and entries[-1] is None
    seen["shorter than the rank"] += len(entries) < len(shape)
    seen["uneven shape"] += uneven


def check_op_sharding(proto: Any, ndim: int, mesh: Mesh, seen: collections.Counter[str]) -> None:
    hlo = HloSharding.from_proto(proto)  # XLA's constructor
    ours = parse_op_sharding(proto, mesh)
    (theirs,) = parse_flatten_op_sharding(proto, mesh)  # jax's parser
    assert ours == theirs, (proto, ours, theirs)
    rebuilt = get_aval_sharding_proto(jax.ShapeDtypeStruct((1,) * ndim, np.float32), ours, mesh)
    assert HloSharding.from_proto(rebuilt) == hlo
    seen[f"{'iota' if len(proto.iota_reshape_dims) else 'explicit'} OpSharding"] += 1


def check_sharding_spec(spec: ShardingSpec, mesh: Mesh, seen: collections.Counter[str]) -> None:
    assert ShardingSpec(spec.sharding, spec.mesh_mapping) == spec  # its invariants
    assert spec.mesh_shape == mesh.devices.shape
    parsed = parse_op_sharding(spec.to_op_sharding(), mesh)
    blocks = [getattr(s, "total", 1) for s in spec.sharding]
    shape = tuple(2 * b for b in blocks)
    theirs = NamedSharding(mesh, parsed).devices_indices_map(shape)
    assert dict(zip(mesh.devices.flat, spec.indices(shape).flat, strict=True)) == dict(theirs)
    seen["chunked ShardingSpec"] += any(b > 1 for b in blocks)


def test_strategies_draw_only_valid_objects_of_every_kind() -> None:
    seen: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.data())
    def draw_and_check(data: st.DataObject) -> None:
        real = data.draw(st.booleans())
        pool = jax.devices() if real else POOL
        mesh = data.draw(meshes(devices=None if real else POOL, max_axes=4, max_axis_size=8))
        check_mesh(mesh, pool, seen)
        uneven = mesh.size > 1 and data.draw(st.booleans())
        spec, shape = data.draw(specs_and_shapes(mesh, unconstrained=True, uneven=uneven))
        check_spec_and_shape(spec, shape, mesh, uneven, seen)
        spec = data.draw(partition_specs(mesh))
        check_spec_and_shape(spec, data.draw(shapes(mesh, spec)), mesh, False, seen)
        ndim = data.draw(st.integers(0, 4))
        named = data.draw(named_shardings(mesh, ndim))
        assert NamedSharding(named.mesh, named.spec) == named and len(named.spec) <= ndim
        parsed = ParsedPartitionSpec.from_user_input(named, "drawn")
        assert parsed.partitions == ParsedPartitionSpec.from_user_input(named.spec, "").partitions
        check_op_sharding(data.draw(op_shardings(mesh, ndim)), ndim, mesh, seen)
        check_sharding_spec(data.draw(sharding_specs(mesh, ndim)), mesh, seen)
        seen["examples"] += 1

    draw_and_check()
    assert seen["examples"] >= EXAMPLES, seen
    kinds = [
        "explicit mesh", "auto mesh", "3+ axes", "size-1 axis", "devices out of order",
        "tuple entry", "single-axis entry", "None entry", "UNCONSTRAINED entry",
        "replicated spec", "trailing None kept", "shorter than the rank", "uneven shape",
        "iota OpSharding", "explicit OpSharding", "chunked ShardingSpec",
    ]  # fmt: skip
    never = [k for k in kinds if not seen[k]]
    assert not never, f"never drawn: {never} in {dict(seen)}"


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_arrays_are_laid_out_as_asked(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    spec, shape = data.draw(specs_and_shapes(mesh, max_ndim=3))
    dtype = data.draw(st.sampled_from([np.float32, np.int32, np.bool_]))
    x = data.draw(arrays(mesh, spec, shape, dtype))
    assert isinstance(x, jax.Array) and x.shape == shape and x.dtype == dtype
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
    whole = np.asarray(x)
    for shard in x.addressable_shards:  # each device holds its own block of the value
        np.testing.assert_array_equal(np.asarray(shard.data), whole[shard.index])


def test_shrinking_goes_to_small_meshes_and_short_specs() -> None:
    """A property that fails on any mesh shrinks to one axis of size 1 and a spec of P()."""
    found: list[tuple[Mesh, Any]] = []

    @settings(max_examples=100, database=None, deadline=None)
    @given(st.data())
    def always_fails(data: st.DataObject) -> None:
        mesh = data.draw(meshes())
        spec = data.draw(partition_specs(mesh))
        found.append((mesh, spec))
        raise AssertionError

    with pytest.raises(AssertionError):
        always_fails()
    mesh, spec = found[-1]  # the shrunk example runs last
    assert mesh.devices.shape == (1,) and mesh.axis_types == (AxisType.Auto,), mesh
    assert mesh.devices.flat[0] == jax.devices()[0]
    assert spec == JaxP(), spec


@pytest.mark.parametrize(
    ("axis_types", "drawn"),
    [
        (AxisType.Explicit, {AxisType.Explicit}),  # one type: every axis of it
        ("explicit", {AxisType.Explicit}),  # by name, as assert_sharding_invariant took it
        (["AUTO", AxisType.Explicit], {AxisType.Auto, AxisType.Explicit}),  # drawn from
    ],
)
def test_axis_types_one_for_every_axis_some_to_draw_from_or_names(
    axis_types: Any, drawn: set[AxisType]
) -> None:
    seen: set[AxisType] = set()

    @settings(max_examples=60, database=None, deadline=None)
    @given(meshes(devices=POOL, axis_types=axis_types))
    def record(mesh: Mesh) -> None:
        seen.update(mesh.axis_types)

    record()
    assert seen == drawn


# --- bad arguments name what is wrong ---


MESH = Mesh(
    np.array(POOL[:8], dtype=object).reshape(2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2
)
ONE = Mesh(np.array(POOL[:1], dtype=object).reshape(1), ("a",), axis_types=(AxisType.Auto,))


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: meshes(min_axes=0), ValueError, "min_axes must be >= 1"),
        (lambda: meshes(max_axes=9), ValueError, "at least max_axes=9 distinct names"),
        (lambda: meshes(axis_names=("x", "x", "y")), ValueError, "distinct names"),
        (
            lambda: meshes(axis_types=("sideways",)),
            ValueError,
            r"meshes: axis_types must be a jax.sharding.AxisType .* got \('sideways',\)",
        ),
        (lambda: meshes(axis_types=3), TypeError, r"meshes: axis_types must be .* got 3\."),
        (lambda: meshes(axis_types=()), ValueError, r"meshes: axis_types must be .* got \(\)\."),
        (lambda: meshes(devices=[]), ValueError, "devices is empty"),
        (lambda: partition_specs("mesh"), TypeError, "mesh must be a jax.sharding.Mesh"),
        (lambda: partition_specs(MESH, -1), ValueError, "ndim must be >= 0"),
        (lambda: shapes(MESH, JaxP("a", "a")), ValueError, "more than once"),
        (lambda: shapes(MESH, JaxP("c")), ValueError, "'c', which is not in"),
        (lambda: shapes(MESH, JaxP("a", "b"), ndim=1), ValueError, "ndim must be >= 2"),
        (lambda: shapes(MESH, JaxP(None), uneven=True), ValueError, "cuts none"),
        (lambda: specs_and_shapes(ONE, uneven=True), ValueError, "axis larger than 1"),
        (lambda: specs_and_shapes(MESH, ndim=0, uneven=True), ValueError, "ndim must be >= 1"),
        (lambda: op_shardings(MESH, encodings=("v2",)), ValueError, "encodings"),
        (lambda: arrays(MESH, JaxP("a"), (2,)), ValueError, "real jax devices"),
        (lambda: arrays(MESH, JaxP("b"), (6,)), ValueError, "not divisible by 4"),
        (lambda: arrays(MESH, JaxP(UNCONSTRAINED), (4,)), ValueError, "UNCONSTRAINED"),
    ],
)
def test_bad_arguments_are_refused_when_the_strategy_is_made(make, error, match) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "module", ["partitioner.testing.strategies", "partitioner.testing.invariance"]
)
def test_without_hypothesis_the_import_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # `import hypothesis` now fails
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=r'pip install "partitioner\[hypothesis\]"'):
        importlib.import_module(module)
    import partitioner.testing  # the round-trip checks need no hypothesis

    assert callable(partitioner.testing.assert_round_trips)


def test_stand_in_meshes_can_be_large() -> None:
    sizes: list[int] = []

    @settings(max_examples=200, database=None, deadline=None)
    @given(meshes(devices=POOL, max_axes=4, max_axis_size=8))
    def record(mesh: Mesh) -> None:
        sizes.append(mesh.size)

    record()
    assert max(sizes) >= 100, max(sizes)
