"""pmap-style ShardingSpec: value semantics, OpSharding and device indices.

The random-spec property against jax's NamedSharding lives in test_op_sharding.py;
here the specs are built by hand (including pmap's Unstacked, which no
PartitionSpec produces) and the two conversions are checked against each other.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax._src.lib import xla_client as xc
from jax.sharding import AxisType, Mesh, NamedSharding

from partitioner import UNCONSTRAINED, PartitionSpec
from partitioner.sharding_spec import (
    Chunked,
    NoSharding,
    Replicated,
    ShardedAxis,
    ShardingSpec,
    Unstacked,
    devices_indices_map,
    sharding_spec_from_parsed,
)
from partitioner.testing.plugin import MeshFactory

HloSharding = xc.HloSharding
T = xc.OpSharding.Type
ALL = slice(None)


# --- value types ---


VALUES = [
    NoSharding(),
    Chunked((2, 4)),
    Chunked(()),
    Unstacked(3),
    ShardedAxis(0),
    Replicated(4),
    ShardingSpec((Chunked((2,)), NoSharding()), (ShardedAxis(0), Replicated(4))),
    ShardingSpec((Unstacked(8),), (ShardedAxis(0),)),
    ShardingSpec((), ()),
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_repr_rebuilds_the_value(value) -> None:
    rebuilt = eval(repr(value))
    assert rebuilt == value and hash(rebuilt) == hash(value)
    assert type(rebuilt) is type(value)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_copy_and_pickle(value) -> None:
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_are_frozen(value) -> None:
    field = dataclasses.fields(value)[0].name if dataclasses.fields(value) else "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, 1)


def test_construction_is_canonical() -> None:
    assert Chunked([2, np.int64(4)]) == Chunked((2, 4))
    assert isinstance(Chunked([2]).chunks, tuple)
    assert ShardingSpec([None, Chunked([2])], [ShardedAxis(0)]) == ShardingSpec(
        (NoSharding(), Chunked((2,))), (ShardedAxis(0),)
    )
    assert len({NoSharding(), NoSharding(), Replicated(2), Replicated(2)}) == 2
    assert Chunked((2,)) != Unstacked(2)
    assert ShardedAxis(1) != Replicated(1)


@pytest.mark.parametrize(
    "build, exc, match",
    [
        (lambda: Chunked((0,)), ValueError, ">= 1"),
        (lambda: Chunked((2.5,)), TypeError, "int"),
        (lambda: Chunked(4), TypeError, "tuple of ints"),
        (lambda: Unstacked(0), ValueError, ">= 1"),
        (lambda: Replicated(-2), ValueError, ">= 1"),
        (lambda: ShardedAxis(-1), ValueError, ">= 0"),
        (lambda: ShardedAxis("x"), TypeError, "int"),
        (lambda: ShardingSpec((Chunked((2,)),), ()), ValueError, "exactly once"),
        (
            lambda: ShardingSpec((Chunked((2,)),), (ShardedAxis(0), ShardedAxis(0))),
            ValueError,
            "exactly once",
        ),
        (lambda: ShardingSpec((NoSharding(),), (ShardedAxis(0),)), ValueError, "exactly once"),
        (lambda: ShardingSpec(("x",), ()), TypeError, "NoSharding"),
        (lambda: ShardingSpec((), (2,)), TypeError, "ShardedAxis"),
    ],
)
def test_bad_construction(build, exc, match) -> None:
    with pytest.raises(exc, match=match):
        build()


def test_mesh_shape() -> None:
    spec = ShardingSpec(
        (Chunked((2, 4)), Unstacked(3), NoSharding()),
        (ShardedAxis(2), Replicated(5), ShardedAxis(0), ShardedAxis(1)),
    )
    assert spec.mesh_shape == (3, 5, 2, 4)
    assert spec.num_devices == 120


# --- device indices ---


def test_indices_pmap_unstacked() -> None:
    spec = ShardingSpec((Unstacked(4), NoSharding()), (ShardedAxis(0),))
    idx = spec.indices((4, 3))
    assert idx.shape == (4,) and idx.dtype == object
    assert list(idx) == [(0, ALL), (1, ALL), (2, ALL), (3, ALL)]


def test_indices_replicated() -> None:
    idx = ShardingSpec((NoSharding(),), (Replicated(3),)).indices((5,))
    assert idx.shape == (3,) and all(i == (ALL,) for i in idx)
    scalar = ShardingSpec((), ()).indices(())
    assert scalar.shape == () and scalar[()] == ()


def test_indices_follow_the_mesh_mapping() -> None:
    # Sharded axis 0 (dim 0, 2 blocks) runs along mesh axis 1, sharded axis 1 along mesh axis 0.
    spec = ShardingSpec((Chunked((2,)), Chunked((3,))), (ShardedAxis(1), ShardedAxis(0)))
    idx = spec.indices((4, 6))
    assert idx.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            assert idx[i, j] == (slice(2 * j, 2 * j + 2), slice(2 * i, 2 * i + 2))


def test_indices_of_a_multi_chunk_dimension_are_major_to_minor() -> None:
    spec = ShardingSpec((Chunked((2, 2)),), (ShardedAxis(1), Replicated(3), ShardedAxis(0)))
    idx = spec.indices((8,))
    assert idx.shape == (2, 3, 2)
    for i in range(2):
        for r in range(3):
            for j in range(2):
                block = 2 * j + i  # sharded axis 0 (mesh axis 2) is the major chunk
                assert idx[i, r, j] == (slice(2 * block, 2 * block + 2),)


def test_indices_mixed_unstacked_and_chunked() -> None:
    spec = ShardingSpec((Chunked((2,)), Unstacked(3)), (ShardedAxis(1), ShardedAxis(0)))
    idx = spec.indices((4, 3))
    assert idx.shape == (3, 2)
    assert idx[2, 1] == (slice(2, 4), 2)


def test_a_single_block_is_the_whole_dimension() -> None:
    spec = ShardingSpec((Chunked((1,)),), (ShardedAxis(0), Replicated(2)))
    assert list(spec.indices((5,)).flat) == [(ALL,), (ALL,)]


@pytest.mark.parametrize(
    "spec, shape, match",
    [
        (ShardingSpec((Chunked((2,)),), (ShardedAxis(0),)), (5,), "5.*not divisible by 2"),
        (ShardingSpec((Chunked((2,)),), (ShardedAxis(0),)), (4, 4), "rank"),
        (ShardingSpec((Unstacked(3),), (ShardedAxis(0),)), (4,), r"Unstacked\(3\)"),
    ],
)
def test_indices_errors(spec, shape, match) -> None:
    with pytest.raises(ValueError, match=match):
        spec.indices(shape)


# --- OpSharding ---


@pytest.mark.parametrize(
    "spec, text",
    [
        (
            ShardingSpec((Chunked((2,)), NoSharding()), (ShardedAxis(0), Replicated(4))),
            "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
        ),
        (
            ShardingSpec((NoSharding(), Chunked((4,))), (Replicated(2), ShardedAxis(0))),
            "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}",
        ),
        (
            ShardingSpec((Chunked((2, 4)),), (ShardedAxis(1), ShardedAxis(0))),
            "{devices=[8]0,2,4,6,1,3,5,7}",
        ),
        (ShardingSpec((NoSharding(),), (Replicated(8),)), "{replicated}"),
        (ShardingSpec((Chunked((1,)),), (ShardedAxis(0), Replicated(8))), "{replicated}"),
        (ShardingSpec((), ()), "{replicated}"),
    ],
)
@pytest.mark.parametrize("encoding", ["explicit", "iota"])
def test_to_op_sharding(spec, text, encoding) -> None:
    proto = spec.to_op_sharding(encoding=encoding)
    assert HloSharding.from_proto(proto) == HloSharding.from_string(text)
    if text == "{replicated}":
        assert proto.type == T.REPLICATED


def test_to_op_sharding_errors() -> None:
    with pytest.raises(ValueError, match="Unstacked"):
        ShardingSpec((Unstacked(2),), (ShardedAxis(0),)).to_op_sharding()
    with pytest.raises(ValueError, match="encoding"):
        ShardingSpec((), ()).to_op_sharding(encoding="nope")


def indices_from_op_sharding(spec: ShardingSpec, shape: tuple[int, ...]) -> list[tuple]:
    """Decode the OpSharding independently: device p holds the tile at p's grid position."""
    proto = spec.to_op_sharding()
    n = spec.num_devices
    if proto.type == T.REPLICATED:
        return [(ALL,) * len(shape)] * n
    tile_dims = list(proto.tile_assignment_dimensions)
    grid = np.asarray(list(proto.tile_assignment_devices)).reshape(tile_dims)
    out = []
    for p in range(n):
        coords = [int(c[0]) for c in np.nonzero(grid == p)]
        index = []
        for d, size in enumerate(shape):
            t = tile_dims[d]
            block = size // t
            index.append(ALL if t == 1 else slice(coords[d] * block, (coords[d] + 1) * block))
        out.append(tuple(index))
    return out


@st.composite
def chunked_specs(draw: st.DrawFn) -> tuple[ShardingSpec, tuple[int, ...]]:
    """Random specs without Unstacked dims, with a shape each one divides."""
    rank = draw(st.integers(0, 3))
    sharding, shape, n_sharded = [], [], 0
    for _ in range(rank):
        chunks = draw(st.lists(st.integers(1, 4), max_size=2))
        if chunks or draw(st.booleans()):
            sharding.append(Chunked(tuple(chunks)))
            n_sharded += len(chunks)
        else:
            sharding.append(NoSharding())
        shape.append(math.prod(chunks) * draw(st.integers(1, 2)))
    mapping = [ShardedAxis(k) for k in draw(st.permutations(range(n_sharded)))]
    for _ in range(draw(st.integers(0, 2))):
        mapping.insert(draw(st.integers(0, len(mapping))), Replicated(draw(st.integers(1, 3))))
    return ShardingSpec(tuple(sharding), tuple(mapping)), tuple(shape)


@given(chunked_specs())
def test_indices_agree_with_op_sharding(case) -> None:
    spec, shape = case
    idx = spec.indices(shape)
    assert idx.shape == spec.mesh_shape
    assert list(idx.flat) == indices_from_op_sharding(spec, shape)
    assert eval(repr(spec)) == spec


# --- from a PartitionSpec and a mesh ---


class FakeDevice:
    def __init__(self, id: int) -> None:
        self.id = id


def fake_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    devs = np.array([FakeDevice(i) for i in range(math.prod(shape))], dtype=object)
    return Mesh(devs.reshape(shape), names, axis_types=(AxisType.Auto,) * len(names))


def test_from_parsed_builds_chunks_in_spec_order() -> None:
    mesh = fake_mesh((2, 1, 4), ("x", "u", "y"))
    spec = sharding_spec_from_parsed((8, 3, 2), PartitionSpec(("y", "x"), None, "u"), mesh)
    assert spec == ShardingSpec(
        (Chunked((4, 2)), NoSharding(), Chunked((1,))),
        (ShardedAxis(1), ShardedAxis(2), ShardedAxis(0)),
    )
    assert spec.mesh_shape == (2, 1, 4)
    replicated = sharding_spec_from_parsed((3,), None, mesh)
    assert replicated == ShardingSpec(
        (NoSharding(),), (Replicated(2), Replicated(1), Replicated(4))
    )


@pytest.mark.parametrize(
    "spec, shape, match",
    [
        (PartitionSpec("z"), (4,), "'z'"),
        (PartitionSpec("x", "y"), (4,), "rank"),
        (PartitionSpec(UNCONSTRAINED), (4,), "UNCONSTRAINED"),
    ],
)
def test_from_parsed_errors(spec, shape, match) -> None:
    with pytest.raises(ValueError, match=match):
        sharding_spec_from_parsed(shape, spec, fake_mesh((2, 4), ("x", "y")))


@pytest.mark.parametrize(
    "spec, shape",
    [
        (PartitionSpec("x", "y"), (4, 8)),
        (PartitionSpec("y"), (8, 3)),
        (PartitionSpec(None, ("y", "x")), (3, 16)),
        (PartitionSpec(), (5,)),
        (jax.sharding.PartitionSpec(("x", "y")), (8,)),
    ],
)
def test_indices_match_real_device_layout(spec, shape, mesh: MeshFactory) -> None:
    """On the 8 CPU devices: each shard jax lays out sits where our indices say."""
    jax_mesh = mesh((2, 4), ("x", "y"), devices=jax.devices()[::-1])
    jax_spec = spec if isinstance(spec, PartitionSpec) else spec
    x = jax.device_put(
        np.arange(math.prod(shape)).reshape(shape), NamedSharding(jax_mesh, jax_spec)
    )
    ours = devices_indices_map(shape, spec, jax_mesh)
    assert len(ours) == 8
    for shard in x.addressable_shards:
        assert shard.index == ours[shard.device]
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(x)[ours[shard.device]])
