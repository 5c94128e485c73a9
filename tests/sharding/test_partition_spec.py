"""PartitionSpec: partitioner's spec *is* jax's, built after a check of its entries."""

from __future__ import annotations

import pickle

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import partitioner
from partitioner import UNCONSTRAINED, PartitionSpec
from partitioner.testing.plugin import MeshFactory

JaxP = jax.sharding.PartitionSpec


@pytest.mark.parametrize(
    "a, b",
    [
        (PartitionSpec(("x",)), PartitionSpec("x")),
        (PartitionSpec(()), PartitionSpec(None)),
        (PartitionSpec(["x", "y"]), PartitionSpec(("x", "y"))),
        (PartitionSpec([]), PartitionSpec(None)),
        (PartitionSpec("x", ("y",), ()), PartitionSpec("x", "y", None)),
    ],
)
def test_canonicalisation(a, b) -> None:
    assert a == b and hash(a) == hash(b)
    assert tuple(a) == tuple(b)


def test_entries_after_canonicalisation() -> None:
    p = PartitionSpec(("x",), (), ["a", "b"], UNCONSTRAINED, None)
    assert tuple(p) == ("x", None, ("a", "b"), UNCONSTRAINED, None)
    assert len(p) == 5 and p[2] == ("a", "b")


@pytest.mark.parametrize(
    "a, b",
    [
        (PartitionSpec("x"), PartitionSpec("y")),
        (PartitionSpec("x"), PartitionSpec("x", None)),  # trailing None is not dropped
        (PartitionSpec(("x", "y")), PartitionSpec(("y", "x"))),  # order is major to minor
        (PartitionSpec(None), PartitionSpec(UNCONSTRAINED)),
        (PartitionSpec(), PartitionSpec(None)),
    ],
)
def test_inequality(a, b) -> None:
    assert a != b


def test_is_jax_spec() -> None:
    # The whole point: a partitioner spec works wherever jax's does.
    p = PartitionSpec("x", None)
    assert type(p) is JaxP and p == JaxP("x", None)
    assert isinstance(p, PartitionSpec) and isinstance(JaxP("y"), PartitionSpec)
    assert PartitionSpec("x") != ("x",)


def test_works_with_jax_sharding_apis(mesh: MeshFactory) -> None:
    jax_mesh = mesh((4, 2), ("x", "y"))
    sharding = jax.sharding.NamedSharding(jax_mesh, PartitionSpec("x", "y"))
    assert sharding == jax.sharding.NamedSharding(jax_mesh, JaxP("x", "y"))
    x = jax.device_put(np.arange(16.0).reshape(8, 2), sharding)
    assert x.sharding.spec == JaxP("x", "y")
    np.testing.assert_array_equal(np.asarray(x), np.arange(16.0).reshape(8, 2))
    with jax.set_mesh(jax_mesh):
        y = jax.device_put(np.arange(8.0), PartitionSpec("x"))
    assert y.sharding.spec == JaxP("x")


@pytest.mark.parametrize(
    "spec",
    [
        PartitionSpec(),
        PartitionSpec(None),
        PartitionSpec("x"),
        PartitionSpec(("x", "y"), None, "z"),
        PartitionSpec(UNCONSTRAINED, "x"),
        PartitionSpec(0, (1, 2)),  # any hashable axis name
    ],
    ids=repr,
)
def test_repr_round_trip(spec) -> None:
    scope = {"P": PartitionSpec, "UNCONSTRAINED": UNCONSTRAINED}
    assert eval(repr(spec), scope) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_unconstrained_is_jax_sentinel() -> None:
    assert UNCONSTRAINED is JaxP.UNCONSTRAINED
    assert PartitionSpec.UNCONSTRAINED is JaxP.UNCONSTRAINED
    assert partitioner.UNCONSTRAINED is JaxP.UNCONSTRAINED


def test_immutable() -> None:
    p = PartitionSpec("x")
    with pytest.raises(AttributeError):
        p._partitions = ("y",)  # type: ignore[misc]
    with pytest.raises(TypeError):
        p[0] = "y"  # type: ignore[index]
    assert p == PartitionSpec("x")


@pytest.mark.parametrize(
    "entry, match",
    [
        ((("x", None)), "axis names only"),
        ((("x", ("y", "z"))), "axis names only"),
        ((("x", UNCONSTRAINED)), "axis names only"),
        ({"x": 1}, "not a mesh axis name"),
    ],
)
def test_bad_entries(entry, match) -> None:
    with pytest.raises(TypeError, match=match):
        PartitionSpec(entry)


def test_isinstance() -> None:
    assert isinstance(PartitionSpec(), PartitionSpec) and isinstance(JaxP(), PartitionSpec)
    assert not any(isinstance(x, PartitionSpec) for x in (("x",), None, "x"))


_names = st.sampled_from(["x", "y", "z", "w"])
_entries = st.one_of(
    st.none(),
    st.just(()),
    st.just(UNCONSTRAINED),
    _names,
    st.lists(_names, min_size=1, max_size=3, unique=True).map(tuple),
)


@given(st.lists(_entries, max_size=5))
def test_equal_to_jax_spec_of_same_entries(entries) -> None:
    spec = PartitionSpec(*entries)
    assert spec == JaxP(*entries) and hash(spec) == hash(JaxP(*entries))
    assert PartitionSpec(*spec) == spec
    assert eval(repr(spec), {"P": PartitionSpec, "UNCONSTRAINED": UNCONSTRAINED}) == spec
    for entry in spec:
        # canonical: never an empty or 1-tuple
        assert not (isinstance(entry, tuple) and len(entry) < 2)
