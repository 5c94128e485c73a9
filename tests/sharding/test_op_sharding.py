"""OpSharding <-> spec conversions: property round trips against jax, and hand-built protos.

The properties run over the public strategies (``partitioner.testing.strategies``):
random meshes (1-4 axes of size 1-8 over up to 840 stand-in devices, in any order, Auto
or Explicit), random ranks and random valid specs, and compare our builder and parser
with what jax's own ``NamedSharding`` computes.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax._src.interpreters import mlir
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir
from jax._src.sharding_impls import parse_flatten_op_sharding
from jax.sharding import AxisType, Mesh, NamedSharding

from partitioner import (
    REPLICATED,
    UNCONSTRAINED,
    ParsedPartitionSpec,
    PartitionSpec,
    get_aval_sharding_proto,
    parse_op_sharding,
)
from partitioner._testing import (
    Unparseable,
    ensure_sdy_mesh,
    hlo_sharding_text,
    parse_op_sharding_parsed,
    sdy_mesh_attr,
    sdy_sharding_attr,
    unflatten_superdims,
)
from partitioner.sharding_spec import devices_indices_map, sharding_spec_from_parsed
from partitioner.testing.strategies import meshes, specs_and_shapes
from tests.helpers import STAND_INS

OpSharding = xc.OpSharding
HloSharding = xc.HloSharding
T = OpSharding.Type
JaxP = jax.sharding.PartitionSpec

AXIS_NAMES = ("a", "b", "c", "d")
#: Stand-in devices (tests/helpers.py): up to 840, every axis size up to 8 divides them.
DEVICE_POOL = STAND_INS


def fake_mesh(shape: tuple[int, ...], names: tuple[str, ...], seed: int | None = None) -> Mesh:
    n = math.prod(shape)
    ids = range(n) if seed is None else np.random.default_rng(seed).permutation(n)
    devs = np.array([DEVICE_POOL[int(i)] for i in ids], dtype=object).reshape(shape)
    return Mesh(devs, names, axis_types=(AxisType.Auto,) * len(names))


def aval(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.float32)


# --- strategies: the public ones ---

MESHES = meshes(devices=DEVICE_POOL, max_axes=4, max_axis_size=8, axis_names=AXIS_NAMES)


@st.composite
def mesh_spec_shape(draw: st.DrawFn) -> tuple[Mesh, Any, list[list[str]], tuple[int, ...]]:
    """``(mesh, spec, dims, shape)``: ``dims[d]`` lists the axes of dim ``d``, major first.

    The spec may omit trailing unpartitioned dims; the shape divides evenly.
    """
    mesh = draw(MESHES)
    spec, shape = draw(specs_and_shapes(mesh, max_ndim=5))
    parsed = ParsedPartitionSpec.from_user_input(spec, "drawn")
    dims = [list(parsed.partitions[d]) if d < len(parsed) else [] for d in range(len(shape))]
    return mesh, spec, dims, shape


def expected_spec(dims: list[list[str]], mesh: Mesh) -> PartitionSpec:
    """The spec a round trip should give: size-1 axes and trailing Nones dropped, as jax does."""
    sizes = dict(mesh.shape)
    entries = [tuple(a for a in axes if sizes[a] != 1) or None for axes in dims]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def as_jax(spec: Any) -> JaxP:
    return spec if isinstance(spec, PartitionSpec) else spec


# --- properties ---


@given(mesh_spec_shape(), st.sampled_from(["explicit", "iota"]), st.booleans())
def test_spec_to_op_sharding_to_spec_is_identity(case, encoding, as_hlo) -> None:
    mesh, spec, dims, shape = case
    proto = get_aval_sharding_proto(aval(shape), spec, mesh, encoding=encoding)
    given_sharding = HloSharding.from_proto(proto) if as_hlo else proto
    assert parse_op_sharding(given_sharding, mesh) == expected_spec(dims, mesh)


@given(mesh_spec_shape(), st.sampled_from(["explicit", "iota"]))
@pytest.mark.slow
def test_op_sharding_matches_jax_named_sharding(case, encoding) -> None:
    mesh, spec, _, shape = case
    ours = HloSharding.from_proto(
        get_aval_sharding_proto(aval(shape), spec, mesh, encoding=encoding)
    )
    theirs = NamedSharding(mesh, as_jax(spec))._to_xla_hlo_sharding(len(shape))
    assert ours == theirs


@given(mesh_spec_shape())
def test_device_indices_match_jax(case) -> None:
    mesh, spec, _, shape = case
    theirs = NamedSharding(mesh, as_jax(spec)).devices_indices_map(shape)
    assert devices_indices_map(shape, spec, mesh) == dict(theirs)


@given(mesh_spec_shape(), st.sampled_from(["explicit", "iota"]))
def test_sharding_spec_op_sharding_matches_builder(case, encoding) -> None:
    mesh, spec, _, shape = case
    sharding_spec = sharding_spec_from_parsed(shape, spec, mesh)
    assert sharding_spec.mesh_shape == mesh.devices.shape
    ours = HloSharding.from_proto(sharding_spec.to_op_sharding(encoding=encoding))
    builder = HloSharding.from_proto(get_aval_sharding_proto(aval(shape), spec, mesh))
    assert ours == builder


@given(mesh_spec_shape(), st.integers(0, 2**32 - 1))
def test_parse_never_returns_a_wrong_spec(case, seed) -> None:
    """A scrambled device list parses to a spec that rebuilds it exactly, or raises ValueError."""
    mesh, spec, _, shape = case
    proto = get_aval_sharding_proto(aval(shape), spec, mesh)
    if proto.type == T.REPLICATED:
        return
    devices = np.asarray(list(proto.tile_assignment_devices))
    rng = np.random.default_rng(seed)
    if rng.random() < 0.5:  # scramble a few positions, else the whole list
        i, j = rng.integers(0, devices.size, 2)
        devices[[i, j]] = devices[[j, i]]
    else:
        devices = rng.permutation(devices)
    proto.tile_assignment_devices = [int(d) for d in devices]
    try:
        parsed = parse_op_sharding(proto, mesh)
    except ValueError as e:
        assert "parse_op_sharding" in str(e)
        return
    rebuilt = get_aval_sharding_proto(aval(shape), parsed, mesh)
    # The same layout: every device holds the same block (the order a replica
    # group lists its devices in means nothing).
    assert blocks_by_device(rebuilt) == blocks_by_device(proto)


def blocks_by_device(proto: Any) -> dict[int, tuple[int, ...]]:
    """Device position -> the tile (over the non-replicated tile dims) it holds."""
    if proto.type == T.REPLICATED:
        return {}
    dims = list(proto.tile_assignment_dimensions)
    n_repl = 1 if proto.replicate_on_last_tile_dim else len(proto.last_tile_dims)
    flat = HloSharding.from_proto(proto).tile_assignment_devices()
    devices = np.asarray(list(flat)).reshape(dims)
    return {int(devices[index]): tuple(index[: len(dims) - n_repl]) for index in np.ndindex(*dims)}


def _shuffled_within_replica_groups(proto: Any, seed: int) -> Any:
    """``proto`` with each replica group's devices listed in a random order."""
    dims = list(proto.tile_assignment_dimensions)
    n_repl = 1 if proto.replicate_on_last_tile_dim else len(proto.last_tile_dims)
    devices = np.asarray(list(HloSharding.from_proto(proto).tile_assignment_devices()))
    groups = devices.reshape(math.prod(dims[: len(dims) - n_repl]), -1)
    rng = np.random.default_rng(seed)
    shuffled = np.stack([rng.permutation(g) for g in groups]).reshape(-1)
    out = OpSharding()
    out.type = proto.type
    out.tile_assignment_dimensions = dims
    out.tile_assignment_devices = [int(d) for d in shuffled]
    out.replicate_on_last_tile_dim = proto.replicate_on_last_tile_dim
    out.last_tile_dims = list(proto.last_tile_dims)
    return out


@given(mesh_spec_shape(), st.integers(0, 2**32 - 1))
@pytest.mark.slow
def test_parse_agrees_with_jax_on_any_replica_group_order(case, seed) -> None:
    """proto -> spec, against jax's own parser: jax's HloSharding of a random spec,
    its replica groups listed in a random order, parses to the spec jax parses."""
    mesh, spec, dims, shape = case
    hlo = NamedSharding(mesh, JaxP(*spec))._to_xla_hlo_sharding(len(shape))
    proto = hlo.to_proto()
    if proto.type == T.OTHER:
        proto = _shuffled_within_replica_groups(proto, seed)
    (theirs,) = parse_flatten_op_sharding(proto, mesh)
    ours = parse_op_sharding(proto, mesh)
    assert ours == expected_spec(dims, mesh) == theirs


@given(mesh_spec_shape())
def test_spec_to_op_sharding_agrees_with_jax(case) -> None:
    """spec -> proto, against jax's own conversion (``NamedSharding._to_xla_hlo_sharding``)."""
    mesh, spec, _, shape = case
    ours = HloSharding.from_proto(get_aval_sharding_proto(aval(shape), spec, mesh))
    assert ours == NamedSharding(mesh, JaxP(*spec))._to_xla_hlo_sharding(len(shape))


def test_parse_maximal_on_one_device_and_reordered_groups() -> None:
    one = fake_mesh((1,), ("a",))
    assert parse_op_sharding(_special(T.MAXIMAL, [0]), one) == PartitionSpec()
    a2 = fake_mesh((2,), ("a",))
    assert parse_op_sharding(tiled([1, 2], [1, 0], replicate_last=True), a2) == PartitionSpec()
    ab = fake_mesh((2, 2), ("a", "b"))
    assert parse_op_sharding(tiled([2, 2], [0, 1, 3, 2], replicate_last=True), ab) == (
        PartitionSpec("a")
    )


@st.composite
def transposed_aranges(draw: st.DrawFn) -> np.ndarray:
    shape = draw(st.lists(st.integers(1, 6), min_size=0, max_size=4))
    perm = draw(st.permutations(range(len(shape))))
    return np.arange(math.prod(shape)).reshape(shape).transpose(perm).reshape(-1)


def rebuild_from_superdims(dims: list[tuple[int, int]], n: int) -> np.ndarray:
    """``assignment[k] = sum_i ((k // prod(sizes before i)) % size_i) * stride_i`` (minor first)."""
    k = np.arange(n)
    out = np.zeros(n, dtype=np.int64)
    inner = 1
    for size, stride in dims:
        out += ((k // inner) % size) * stride
        inner *= size
    return out


@given(transposed_aranges())
def test_unflatten_superdims_rebuilds_any_mesh_transposition(assignment) -> None:
    dims = unflatten_superdims(assignment)
    assert math.prod(size for size, _ in dims) == assignment.size
    assert all(size >= 2 for size, _ in dims)
    np.testing.assert_array_equal(rebuild_from_superdims(dims, assignment.size), assignment)


@given(st.integers(1, 24).flatmap(lambda n: st.permutations(range(n))))
def test_unflatten_superdims_result_always_rebuilds_its_input(assignment) -> None:
    """For any permutation: either it is rejected, or the runs reproduce it exactly."""
    assignment = np.asarray(assignment)
    try:
        dims = unflatten_superdims(assignment)
    except Unparseable:
        return
    np.testing.assert_array_equal(rebuild_from_superdims(dims, assignment.size), assignment)


# --- the builder on hand-picked cases ---


MESH_2x4 = fake_mesh((2, 4), ("x", "y"))


@pytest.mark.parametrize(
    "spec, ndim, text",
    [
        (PartitionSpec("x", "y"), 2, "{devices=[2,4]0,1,2,3,4,5,6,7}"),
        (PartitionSpec("y", "x"), 2, "{devices=[4,2]0,4,1,5,2,6,3,7}"),
        (PartitionSpec("y"), 2, "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
        (PartitionSpec(None, ("y", "x")), 2, "{devices=[1,8]0,4,1,5,2,6,3,7}"),
        (PartitionSpec(), 3, "{replicated}"),
        (None, 1, "{replicated}"),
    ],
)
def test_builder_device_order(spec, ndim, text) -> None:
    proto = get_aval_sharding_proto(aval((8,) * ndim), spec, MESH_2x4)
    assert HloSharding.from_proto(proto) == HloSharding.from_string(text)
    if spec is not None:
        theirs = NamedSharding(MESH_2x4, as_jax(spec))._to_xla_hlo_sharding(ndim)
        assert HloSharding.from_proto(proto) == theirs


def test_builder_returns_op_sharding_types() -> None:
    replicated = get_aval_sharding_proto(aval((4,)), PartitionSpec(), MESH_2x4)
    assert isinstance(replicated, OpSharding) and replicated.type == T.REPLICATED
    tiled = get_aval_sharding_proto(aval((4,)), PartitionSpec("x"), MESH_2x4)
    assert tiled.type == T.OTHER and tiled.replicate_on_last_tile_dim
    assert list(tiled.tile_assignment_dimensions) == [2, 4]


def test_builder_on_672_fake_devices() -> None:
    mesh = fake_mesh((2, 8, 6, 7), AXIS_NAMES, seed=0)
    spec = PartitionSpec(("d", "a"), None, "b")
    proto = get_aval_sharding_proto(aval((14, 3, 8)), spec, mesh)
    assert list(proto.tile_assignment_dimensions) == [14, 1, 8, 6]
    theirs = NamedSharding(mesh, spec)._to_xla_hlo_sharding(3)
    assert HloSharding.from_proto(proto) == theirs
    assert parse_op_sharding(proto, mesh) == spec


def test_builder_size_one_axes_are_dropped() -> None:
    mesh = fake_mesh((1, 4, 1), ("a", "b", "c"))
    assert get_aval_sharding_proto(aval((4,)), PartitionSpec(("a", "c")), mesh).type == T.REPLICATED
    assert parse_op_sharding(
        get_aval_sharding_proto(aval((4,)), PartitionSpec(("a", "b")), mesh), mesh
    ) == PartitionSpec("b")


def test_builder_accepts_parsed_specs_and_unconstrained() -> None:
    parsed = ParsedPartitionSpec.from_user_input(PartitionSpec(None, "y"), "test")
    by_parsed = get_aval_sharding_proto(aval((2, 4)), parsed, MESH_2x4)
    by_spec = get_aval_sharding_proto(aval((2, 4)), PartitionSpec(None, "y"), MESH_2x4)
    assert HloSharding.from_proto(by_parsed) == HloSharding.from_proto(by_spec)
    assert get_aval_sharding_proto(aval((2,)), REPLICATED, MESH_2x4).type == T.REPLICATED
    # UNCONSTRAINED dims carry no tiling in the proto (the lowering marks them open).
    loose = get_aval_sharding_proto(aval((2, 4)), PartitionSpec(UNCONSTRAINED, "y"), MESH_2x4)
    assert HloSharding.from_proto(loose) == HloSharding.from_proto(by_spec)


@pytest.mark.parametrize(
    "spec, ndim, match, exc",
    [
        (PartitionSpec("z"), 1, "'z'", ValueError),
        (PartitionSpec("x", None, None), 2, "rank", ValueError),
        ("x", 1, "PartitionSpec", TypeError),
    ],
)
def test_builder_errors(spec, ndim, match, exc) -> None:
    with pytest.raises(exc, match=match):
        get_aval_sharding_proto(aval((4,) * ndim), spec, MESH_2x4)


def test_builder_rejects_unknown_encoding() -> None:
    with pytest.raises(ValueError, match="encoding"):
        get_aval_sharding_proto(aval((4,)), PartitionSpec("x"), MESH_2x4, encoding="bogus")


def test_text_forms() -> None:
    text = hlo_sharding_text(aval((4, 4)), PartitionSpec("y"), MESH_2x4)
    assert text == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert HloSharding.from_string(text) == HloSharding.from_string(
        "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    )


def test_shardy_attributes() -> None:
    """The Shardy attributes the lowering builds (with jax's MLIR builders) read as
    Shardy's documented syntax: closed dims, ``{?}`` for UNCONSTRAINED, quoted axes."""
    with mlir.make_ir_context():
        assert str(sdy_mesh_attr(MESH_2x4)) == '#sdy.mesh<["x"=2, "y"=4]>'
        assert str(sdy_mesh_attr(MESH_2x4, range(8))) == '#sdy.mesh<["x"=2, "y"=4]>'
        assert (
            str(sdy_mesh_attr(MESH_2x4, [1, 0, 2, 3, 4, 5, 6, 7]))
            == '#sdy.mesh<["x"=2, "y"=4], device_ids=[1, 0, 2, 3, 4, 5, 6, 7]>'
        )
        assert (
            str(sdy_sharding_attr(3, PartitionSpec(("y", "x"), UNCONSTRAINED)))
            == '#sdy.sharding<@mesh, [{"y", "x"}, {?}, {}]>'
        )
        assert str(sdy_sharding_attr(2, REPLICATED, "mesh_1")) == "#sdy.sharding<@mesh_1, [{}, {}]>"
        assert str(sdy_sharding_attr(0, None)) == "#sdy.sharding<@mesh, []>"


def test_one_sdy_mesh_op_per_distinct_mesh() -> None:
    """A module names each mesh (with its device order) once: the same mesh reuses its
    symbol, another device order gets a fresh one."""
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        assert ensure_sdy_mesh(module, MESH_2x4) == "mesh"
        assert ensure_sdy_mesh(module, MESH_2x4, range(8)) == "mesh"
        assert ensure_sdy_mesh(module, MESH_2x4, [1, 0, 2, 3, 4, 5, 6, 7]) == "mesh_1"
        assert ensure_sdy_mesh(module, MESH_2x4, [1, 0, 2, 3, 4, 5, 6, 7]) == "mesh_1"
        ops = [str(op) for op in module.body.operations]
    assert ops == [
        'sdy.mesh @mesh_1 = <["x"=2, "y"=4], device_ids=[1, 0, 2, 3, 4, 5, 6, 7]>',
        'sdy.mesh @mesh = <["x"=2, "y"=4]>',
    ]


# --- the parser on hand-built protos ---


def tiled(
    dims: list[int],
    devices: list[int] | None = None,
    *,
    iota: tuple[list[int], list[int]] | None = None,
    replicate_last: bool = False,
    last_tile_dims: list[Any] = (),
) -> OpSharding:
    proto = OpSharding()
    proto.type = T.OTHER
    proto.tile_assignment_dimensions = dims
    if iota is not None:
        proto.iota_reshape_dims, proto.iota_transpose_perm = iota
    else:
        proto.tile_assignment_devices = list(range(math.prod(dims))) if devices is None else devices
    proto.replicate_on_last_tile_dim = replicate_last
    proto.last_tile_dims = list(last_tile_dims)
    return proto


YX = [0, 4, 1, 5, 2, 6, 3, 7]  # MESH_2x4 transposed: y major, x minor


@pytest.mark.parametrize(
    "proto, expected",
    [
        (tiled([2, 4]), PartitionSpec("x", "y")),
        (tiled([4, 2], YX), PartitionSpec("y", "x")),
        (tiled([1, 8], YX), PartitionSpec(None, ("y", "x"))),
        (tiled([8, 1]), PartitionSpec(("x", "y"))),
        (tiled([2, 1, 4], replicate_last=True), PartitionSpec("x")),
        (tiled([1, 4, 2], YX, replicate_last=True), PartitionSpec(None, "y")),
        (tiled([2, 1, 4], last_tile_dims=[T.REPLICATED]), PartitionSpec("x")),
        (tiled([4, 2], iota=([2, 4], [1, 0])), PartitionSpec("y", "x")),
        (tiled([4, 1, 2], iota=([2, 4], [1, 0]), replicate_last=True), PartitionSpec("y")),
        (tiled([2, 4], iota=([8], [0])), PartitionSpec("x", "y")),
        (tiled([1, 1, 8], replicate_last=True), PartitionSpec()),
    ],
)
def test_parse_hand_built(proto, expected) -> None:
    assert parse_op_sharding(proto, MESH_2x4) == expected
    assert parse_op_sharding(HloSharding.from_proto(proto), MESH_2x4) == expected


def test_parse_replicated_and_tuple() -> None:
    replicated = OpSharding()
    replicated.type = T.REPLICATED
    assert parse_op_sharding(replicated, MESH_2x4) == PartitionSpec()
    assert parse_op_sharding_parsed(replicated, MESH_2x4) == REPLICATED
    tup = OpSharding()
    tup.type = T.TUPLE
    tup.tuple_shardings = [tiled([4, 2], YX), replicated, tiled([2, 1, 4], replicate_last=True)]
    assert parse_op_sharding(tup, MESH_2x4) == [
        PartitionSpec("y", "x"),
        PartitionSpec(),
        PartitionSpec("x"),
    ]


def test_parse_hlo_sharding_from_text_and_from_jax() -> None:
    assert parse_op_sharding(HloSharding.from_string("{replicated}"), MESH_2x4) == PartitionSpec()
    text = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert parse_op_sharding(HloSharding.from_string(text), MESH_2x4) == PartitionSpec("y")
    jax_hlo = NamedSharding(MESH_2x4, JaxP(None, ("x", "y")))._to_xla_hlo_sharding(2)
    assert parse_op_sharding(jax_hlo, MESH_2x4) == PartitionSpec(None, ("x", "y"))


def test_parse_returns_our_spec_and_parsed_form() -> None:
    spec = parse_op_sharding(tiled([4, 2], YX), MESH_2x4)
    assert isinstance(spec, PartitionSpec)
    parsed = parse_op_sharding_parsed(tiled([4, 2], YX), MESH_2x4)
    assert parsed.partitions == (("y",), ("x",))


def _special(kind: Any, devices: list[int] = ()) -> OpSharding:
    proto = OpSharding()
    proto.type = kind
    proto.tile_assignment_devices = list(devices)
    return proto


@pytest.mark.parametrize(
    "proto, why",
    [
        (_special(T.MAXIMAL, [3]), "MAXIMAL"),
        (_special(T.MANUAL), "MANUAL"),
        (tiled([2, 4], [0, 2, 1, 3, 4, 5, 6, 7]), "transposition"),  # not a mesh order
        (tiled([8], [1, 0, 2, 3, 4, 5, 6, 7]), "position 0"),
        (tiled([2, 4], [4, 5, 6, 7, 0, 1, 2, 3]), "position 0"),  # x reversed
        (tiled([4, 2]), "splits a mesh axis"),  # tile of 4 over x=2 then half of y
        (tiled([2, 2, 2], replicate_last=True), "splits a mesh axis"),
        (tiled([2, 2], iota=([4], [0])), "mesh has 8 devices"),
        (tiled([16], iota=([16], [0])), "mesh has 8 devices"),
        (tiled([2, 1, 4], last_tile_dims=[T.MANUAL]), "replicated subgroups"),
        (tiled([2, 3], list(range(8))), "multiply"),
    ],
)
def test_parse_rejects_shardings_no_spec_can_express(proto, why) -> None:
    with pytest.raises(ValueError, match="parse_op_sharding") as info:
        parse_op_sharding(proto, MESH_2x4)
    assert why in str(info.value)


def test_parse_rejects_a_tile_that_splits_a_mesh_axis_in_iota_form() -> None:
    mesh = fake_mesh((4, 2), ("x", "y"))
    # x has 4 devices; a tile dim of 2 over x's stride would split it.
    with pytest.raises(ValueError, match="splits a mesh axis"):
        parse_op_sharding(tiled([2, 4], iota=([8], [0])), mesh)
