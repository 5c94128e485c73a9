"""PartitionSpec: a canonical, immutable value that converts to and from jax's."""

from __future__ import annotations

import pickle

import jax
import pytest
from hypothesis import given
from hypothesis import strategies as st

import partitioner
from partitioner import UNCONSTRAINED, PartitionSpec
from partitioner.spec.partition_spec import as_spec, is_spec

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
    assert a.partitions == b.partitions


def test_entries_after_canonicalisation() -> None:
    p = PartitionSpec(("x",), (), ["a", "b"], UNCONSTRAINED, None)
    assert p.partitions == ("x", None, ("a", "b"), UNCONSTRAINED, None)
    assert len(p) == 5 and p[2] == ("a", "b") and list(p) == list(p.partitions)


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


def test_not_equal_to_tuples_or_jax_specs() -> None:
    # Like jax 0.10.2's spec, ours is no longer a tuple; a jax spec converts explicitly.
    assert PartitionSpec("x") != ("x",)
    assert (PartitionSpec("x") == JaxP("x")) is False
    assert as_spec(JaxP("x")) == PartitionSpec("x")


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
    text = repr(spec)
    assert text.startswith("PartitionSpec(")
    assert eval(text, {"PartitionSpec": PartitionSpec, "UNCONSTRAINED": UNCONSTRAINED}) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_unconstrained_repr_rebuilds() -> None:
    # jax's sentinel prints as UNCONSTRAINED; eval needs that name in scope.
    assert repr(PartitionSpec(UNCONSTRAINED)) == "PartitionSpec(UNCONSTRAINED)"


def test_unconstrained_is_jax_sentinel() -> None:
    assert UNCONSTRAINED is JaxP.UNCONSTRAINED
    assert PartitionSpec.UNCONSTRAINED is JaxP.UNCONSTRAINED
    assert partitioner.UNCONSTRAINED is JaxP.UNCONSTRAINED


@pytest.mark.parametrize(
    "spec",
    [
        PartitionSpec(),
        PartitionSpec("x", None),
        PartitionSpec(("x", "y"), UNCONSTRAINED),
        PartitionSpec(None, ("a", "b", "c")),
    ],
    ids=repr,
)
def test_to_jax_and_back(spec) -> None:
    j = spec.to_jax()
    assert isinstance(j, JaxP)
    assert tuple(j) == spec.partitions
    assert PartitionSpec.from_jax(j) == spec


def test_from_jax_canonicalises() -> None:
    assert PartitionSpec.from_jax(JaxP(("x",), None)) == PartitionSpec("x", None)
    assert PartitionSpec.from_jax(JaxP(JaxP.UNCONSTRAINED)) == PartitionSpec(UNCONSTRAINED)


def test_from_jax_rejects_reduced_axes() -> None:
    with pytest.raises(ValueError, match="reduced"):
        PartitionSpec.from_jax(JaxP("x", unreduced={"y"}))


def test_immutable() -> None:
    p = PartitionSpec("x")
    with pytest.raises(AttributeError, match="immutable"):
        p._partitions = ("y",)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.foo = 1  # type: ignore[attr-defined]
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


def test_is_spec_and_as_spec() -> None:
    assert is_spec(PartitionSpec()) and is_spec(JaxP())
    assert not is_spec(("x",)) and not is_spec(None) and not is_spec("x")
    ours = PartitionSpec("x")
    assert as_spec(ours) is ours


_names = st.sampled_from(["x", "y", "z", "w"])
_entries = st.one_of(
    st.none(),
    st.just(()),
    st.just(UNCONSTRAINED),
    _names,
    st.lists(_names, min_size=1, max_size=3, unique=True).map(tuple),
)


@given(st.lists(_entries, max_size=5))
def test_conversions_round_trip(entries) -> None:
    spec = PartitionSpec(*entries)
    assert PartitionSpec.from_jax(spec.to_jax()) == spec
    assert PartitionSpec(*spec.partitions) == spec
    assert (
        eval(repr(spec), {"PartitionSpec": PartitionSpec, "UNCONSTRAINED": UNCONSTRAINED}) == spec
    )
    assert hash(PartitionSpec(*entries)) == hash(spec)
    for entry in spec:
        # canonical: never an empty or 1-tuple
        assert not (isinstance(entry, tuple) and len(entry) < 2)
