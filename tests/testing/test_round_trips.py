"""The public round-trip checks: they pass on every valid spec, and each can fail.

The properties run the checks over the public strategies (stand-in meshes of up to 840
devices, specs with UNCONSTRAINED, even and uneven shapes). Each check is then shown
to fail, with both sides in its message, when the conversion it guards is broken (the
converter it calls is replaced by a wrong one for the test). ``assert_same_layout``
is compared with jax's ``devices_indices_map`` (and, for uneven shapes, with jax's map
of the padded shape, cut back to the real one: XLA pads at the end).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from partitioner import REPLICATED, UNCONSTRAINED, ParsedPartitionSpec
from partitioner.sharding_spec import ShardingSpec
from partitioner.testing import (
    assert_hlo_text_round_trip,
    assert_named_sharding_round_trip,
    assert_op_sharding_round_trip,
    assert_round_trips,
    assert_same_layout,
    assert_sharding_spec_round_trip,
    round_trips,
)
from partitioner.testing.strategies import meshes, specs_and_shapes
from tests.helpers import STAND_INS

POOL = STAND_INS
BIG_MESHES = meshes(devices=POOL, max_axes=4, max_axis_size=8)


def _uses_a_size_one_axis(spec: Any, mesh: Mesh) -> bool:
    parsed = ParsedPartitionSpec.from_user_input(spec, "", allow_unconstrained=True)
    return any(mesh.shape[a] == 1 for a in parsed.mesh_axes)


@given(st.data())
@pytest.mark.slow
def test_every_drawn_spec_round_trips(data: st.DataObject) -> None:
    mesh = data.draw(BIG_MESHES, label="mesh")
    uneven = mesh.size > 1 and data.draw(st.booleans(), label="uneven")
    spec, shape = data.draw(specs_and_shapes(mesh, unconstrained=True, uneven=uneven))
    assert_round_trips(spec, mesh, shape)
    # Strictly, only a size-1 axis may vanish (no form keeps it: it cuts nothing).
    if _uses_a_size_one_axis(spec, mesh):
        with pytest.raises(AssertionError, match="size-1 axes count"):
            assert_round_trips(spec, mesh, shape, strict=True)
    else:
        assert_round_trips(spec, mesh, shape, strict=True)


@given(st.data())
@pytest.mark.slow
def test_same_layout_agrees_with_jax(data: st.DataObject) -> None:
    mesh = data.draw(meshes(), label="mesh")  # real devices: jax.Arrays too
    spec, shape = data.draw(specs_and_shapes(mesh, max_ndim=3))
    other, _ = data.draw(specs_and_shapes(mesh, ndim=len(shape)))
    a, b = NamedSharding(mesh, spec), NamedSharding(mesh, other)
    x = jax.device_put(np.zeros(shape, np.float32), a)
    assert_same_layout(a, x, shape)
    assert_same_layout(a, a.devices_indices_map(shape), shape)
    if a.is_equivalent_to(b, len(shape)):
        assert_same_layout(a, b, shape)
    else:
        with pytest.raises(AssertionError, match="differently"):
            assert_same_layout(a, b, shape)


@given(st.data())
@pytest.mark.slow
def test_an_uneven_shape_is_laid_out_as_xla_pads_it(data: st.DataObject) -> None:
    mesh = data.draw(meshes(devices=POOL, max_axes=3, max_axis_size=8).filter(lambda m: m.size > 1))
    spec, shape = data.draw(specs_and_shapes(mesh, uneven=True))
    sharding = NamedSharding(mesh, spec)
    pieces = ParsedPartitionSpec.from_user_input(spec, "").shards_per_dim(mesh, len(shape))
    padded = tuple(-(-n // k) * k for n, k in zip(shape, pieces, strict=True))
    clipped = {
        d: tuple(
            slice(min(i.indices(p)[0], n), min(i.indices(p)[1], n))
            for i, p, n in zip(index, padded, shape, strict=True)
        )
        for d, index in sharding.devices_indices_map(padded).items()
    }
    assert_same_layout(sharding, clipped, shape)


def test_an_uneven_shape_by_hand() -> None:
    mesh = Mesh(np.array(POOL[:4], dtype=object), ("a",), axis_types=(AxisType.Auto,))
    blocks = [(0, 2), (2, 4), (4, 5), (5, 5)]  # ceil(5 / 4) = 2 per device, the last empty
    expected = {POOL[i]: (slice(*b),) for i, b in enumerate(blocks)}
    assert_same_layout(NamedSharding(mesh, P("a")), expected, (5,))


# --- each check fails when its conversion is wrong, showing both sides ---

MESH = Mesh(
    np.array(POOL[:8], dtype=object).reshape(2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2
)


def _replicated(*args: Any, **kwargs: Any) -> ParsedPartitionSpec:
    return REPLICATED


def test_a_wrong_op_sharding_parser_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(round_trips, "parse_op_sharding_parsed", _replicated)
    with pytest.raises(AssertionError) as info:
        assert_op_sharding_round_trip(P("a", "b"), MESH, (4, 8))
    message = str(info.value)
    assert "spec -> OpSharding -> spec changed the layout of a (4, 8) value" in message
    assert "Mesh('a': 2, 'b': 4)" in message
    assert "sent:     P('a', 'b')" in message and "returned: P()" in message
    assert "via:      OpSharding {devices=[2,4]0,1,2,3,4,5,6,7} (explicit device list)" in message


def test_a_wrong_hlo_text_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(round_trips, "hlo_sharding_text", lambda *a: "{devices=[4,2]<=[2,4]T(1,0)}")
    with pytest.raises(AssertionError) as info:
        assert_hlo_text_round_trip(P("a", "b"), MESH, (4, 8))
    message = str(info.value)
    assert "spec -> HLO sharding text -> spec" in message and "returned: P('b', 'a')" in message
    assert "via:      {devices=[4,2]<=[2,4]T(1,0)}" in message


def test_a_wrong_named_sharding_parser_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ParsedPartitionSpec.from_user_input

    def loses_the_spec(entry: Any, where: str, **kwargs: Any) -> ParsedPartitionSpec:
        return REPLICATED if isinstance(entry, NamedSharding) else real(entry, where, **kwargs)

    monkeypatch.setattr(ParsedPartitionSpec, "from_user_input", staticmethod(loses_the_spec))
    with pytest.raises(AssertionError) as info:
        assert_named_sharding_round_trip(P(None, ("b", "a")), MESH, (4, 8))
    message = str(info.value)
    assert "spec -> NamedSharding -> spec" in message and "sent:     P(None, ('b', 'a'))" in message
    assert "returned: P()" in message


def test_a_wrong_sharding_spec_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = round_trips.sharding_spec_from_parsed
    monkeypatch.setattr(
        round_trips, "sharding_spec_from_parsed", lambda shape, spec, mesh: real(shape, P(), mesh)
    )
    with pytest.raises(AssertionError, match="spec -> ShardingSpec -> spec") as info:
        assert_sharding_spec_round_trip(P("b"), MESH, (8,))
    assert "ShardingSpec(sharding=(NoSharding(),)" in str(info.value)


def test_wrong_sharding_spec_indices_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ShardingSpec.indices
    monkeypatch.setattr(ShardingSpec, "indices", lambda self, shape: real(self, shape)[::-1])
    with pytest.raises(AssertionError) as info:
        assert_sharding_spec_round_trip(P("a"), MESH, (8,))
    message = str(info.value)
    assert "lay a (8,) value out differently (8 of 8 devices differ)" in message
    assert "StandIn(0): [4:8] vs [0:4]" in message


def test_strict_counts_a_size_one_axis_and_semantic_does_not() -> None:
    mesh = Mesh(
        np.array(POOL[:8], dtype=object).reshape(1, 8),
        ("stage", "data"),
        axis_types=(AxisType.Auto,) * 2,
    )
    assert_round_trips(P("stage", "data"), mesh, (4, 16))
    with pytest.raises(AssertionError) as info:
        assert_op_sharding_round_trip(P("stage", "data"), mesh, (4, 16), strict=True)
    message = str(info.value)
    assert "changed the spec" in message and "returned: P(None, 'data')" in message
    assert "size-1 axes count" in message
    assert_round_trips(P("data", None), mesh, (16, 4), strict=True)  # spelling aside


def test_a_named_sharding_keeps_its_memory_kind() -> None:
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    pinned = NamedSharding(mesh, P("a"), memory_kind="pinned_host")
    assert_round_trips(pinned, mesh, (4, 8), strict=True)
    assert_named_sharding_round_trip(P("a", UNCONSTRAINED), mesh, (4, 8), strict=True)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: assert_round_trips(P("a", "a"), MESH, (4, 4)), ValueError, "more than once"),
        (lambda: assert_round_trips(P("c"), MESH, (4,)), ValueError, "'c', which is not in"),
        (lambda: assert_round_trips(P("a", "b"), MESH, (4,)), ValueError, "rank 1"),
        (lambda: assert_round_trips("a", MESH, (4,)), TypeError, "PartitionSpec"),
        (lambda: assert_round_trips(P("a"), "mesh", (4,)), TypeError, "jax.sharding.Mesh"),
        (
            lambda: assert_round_trips(P("a"), jax.make_mesh((8,), ("a",)).abstract_mesh, (8,)),
            TypeError,
            "jax.sharding.Mesh",
        ),
        (lambda: assert_same_layout(P("a"), P("a"), (4,)), TypeError, "jax Shardings"),
    ],
)
def test_bad_arguments(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_a_named_sharding_over_another_mesh_is_refused() -> None:
    other = Mesh(
        np.array(POOL[8:16], dtype=object).reshape(2, 4),
        ("a", "b"),
        axis_types=(AxisType.Auto,) * 2,
    )
    with pytest.raises(ValueError, match="is not the mesh given"):
        assert_round_trips(NamedSharding(other, P("a")), MESH, (4,))
