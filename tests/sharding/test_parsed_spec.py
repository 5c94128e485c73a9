"""ParsedPartitionSpec, spec-tree parsing (prepare_axis_resources) and prefix broadcasting."""

from __future__ import annotations

import copy
import pickle
from collections import namedtuple

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from partitioner import (
    REPLICATED,
    UNCONSTRAINED,
    ParsedPartitionSpec,
    PartitionSpec,
    SpecSync,
    prepare_axis_resources,
)
from partitioner._testing import broadcast_prefix

JaxP = jax.sharding.PartitionSpec
Pair = namedtuple("Pair", ["w", "b"])


def parse(spec, **kw) -> ParsedPartitionSpec:
    return ParsedPartitionSpec.from_user_input(spec, "test", **kw)


# --- ParsedPartitionSpec ---


@pytest.mark.parametrize(
    "spec, partitions",
    [
        (None, ()),
        (PartitionSpec(), ()),
        (PartitionSpec("x"), (("x",),)),
        (PartitionSpec(None, ("x", "y")), ((), ("x", "y"))),
        (PartitionSpec("x", None), (("x",), ())),
        (JaxP(("y",), "x"), (("y",), ("x",))),
    ],
)
def test_from_user_input(spec, partitions) -> None:
    parsed = parse(spec)
    assert parsed.partitions == partitions
    assert parsed.sync == SpecSync.IN_SYNC
    assert parsed.user_spec is spec
    assert parsed.mesh_axes == tuple(a for axes in partitions for a in axes)


def test_equality_ignores_spelling_and_trailing_unpartitioned_dims() -> None:
    a = parse(PartitionSpec("x"))
    b = parse(JaxP("x", None, None))
    c = ParsedPartitionSpec("anything", [("x",)])
    assert a == b == c
    assert len({a, b, c}) == 1
    assert parse(None) == REPLICATED == parse(PartitionSpec(None, None))
    assert parse(PartitionSpec("x")) != parse(PartitionSpec(None, "x"))
    assert parse(PartitionSpec(("x", "y"))) != parse(PartitionSpec(("y", "x")))


def test_unconstrained_dims() -> None:
    with pytest.raises(ValueError, match="UNCONSTRAINED"):
        parse(PartitionSpec(UNCONSTRAINED))
    parsed = parse(PartitionSpec("x", UNCONSTRAINED), allow_unconstrained=True)
    assert parsed.partitions == (("x",), ())
    assert parsed.unconstrained_dims == frozenset({1})
    # a trailing unconstrained dim is not the same as an omitted one
    assert parsed != parse(PartitionSpec("x"))
    assert parsed.to_partition_spec() == PartitionSpec("x", UNCONSTRAINED)


def test_insert_axis_partitions_and_sync_levels() -> None:
    user = PartitionSpec("x", UNCONSTRAINED, "y")
    parsed = parse(user, allow_unconstrained=True)
    batched = parsed.insert_axis_partitions(0, ())
    assert batched.partitions == ((), ("x",), (), ("y",))
    assert batched.unconstrained_dims == frozenset({2})
    assert batched.sync == SpecSync.DIM_PERMUTE
    assert batched.unsynced_user_spec(SpecSync.DIM_PERMUTE) is user

    spmd = parsed.insert_axis_partitions(1, ("z",))
    assert spmd.partitions == (("x",), ("z",), (), ("y",))
    assert spmd.unconstrained_dims == frozenset({2})
    assert spmd.sync == SpecSync.OUT_OF_SYNC
    # sync only ever goes down
    assert batched.insert_axis_partitions(0, ("z",)).sync == SpecSync.OUT_OF_SYNC
    assert spmd.insert_axis_partitions(0, ()).sync == SpecSync.OUT_OF_SYNC
    # the original is untouched (immutable value)
    assert parsed.partitions == (("x",), (), ("y",)) and parsed.sync == SpecSync.IN_SYNC


def test_insert_past_the_end_pads_with_unpartitioned_dims() -> None:
    out = parse(PartitionSpec("x")).insert_axis_partitions(3, ("y",))
    assert out.partitions == (("x",), (), (), ("y",))
    assert parse(None).insert_axis_partitions(0, ()) == REPLICATED.insert_axis_partitions(0, ())


def test_user_spec_guard() -> None:
    user = PartitionSpec("x")
    parsed = parse(user)
    assert parsed.describe() == repr(user)
    permuted = parsed.insert_axis_partitions(0, ())
    with pytest.raises(AssertionError, match="sync"):
        _ = permuted.user_spec
    out_of_sync = parsed.insert_axis_partitions(0, ("y",))
    with pytest.raises(AssertionError):
        out_of_sync.unsynced_user_spec(SpecSync.DIM_PERMUTE)
    assert out_of_sync.unsynced_user_spec(SpecSync.OUT_OF_SYNC) is user
    # describe never shows a stale user spec
    assert out_of_sync.describe() == repr(PartitionSpec("y", "x"))


def test_replicated() -> None:
    assert REPLICATED.partitions == ()
    assert REPLICATED.mesh_axes == ()
    assert REPLICATED.to_partition_spec() == PartitionSpec() == JaxP()
    assert REPLICATED.sync == SpecSync.IN_SYNC


def test_parsed_is_immutable_and_hashable() -> None:
    parsed = parse(PartitionSpec("x"))
    with pytest.raises(AttributeError, match="immutable"):
        parsed.partitions = ()  # type: ignore[misc]
    cache = {parsed: 1}
    assert cache[parse(JaxP("x"))] == 1


@pytest.mark.parametrize(
    "copier", [copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))]
)
def test_parsed_survives_copy_and_pickle(copier) -> None:
    user = PartitionSpec("x", UNCONSTRAINED)
    parsed = parse(user, allow_unconstrained=True).insert_axis_partitions(0, ())
    clone = copier(parsed)
    assert clone == parsed and hash(clone) == hash(parsed)
    assert clone.sync == SpecSync.DIM_PERMUTE
    assert clone.unconstrained_dims == frozenset({2})
    assert clone.unsynced_user_spec(SpecSync.DIM_PERMUTE) == user


def test_insert_an_unconstrained_dimension() -> None:
    out = parse(PartitionSpec("x")).insert_axis_partitions(0, (), unconstrained=True)
    assert out.partitions == ((), ("x",)) and out.unconstrained_dims == frozenset({0})
    assert out.to_partition_spec() == PartitionSpec(UNCONSTRAINED, "x")
    with pytest.raises(ValueError, match="unconstrained"):
        parse(PartitionSpec("x")).insert_axis_partitions(0, ("y",), unconstrained=True)


def test_views() -> None:
    parsed = parse(PartitionSpec(("x", "y"), None, "z", None))
    assert len(parsed) == 4 and parsed[0] == ("x", "y") and list(parsed)[2] == ("z",)
    assert parsed.to_partition_spec() == PartitionSpec(("x", "y"), None, "z")
    assert parsed.to_closed_spec() == JaxP(("x", "y"), None, "z", None)
    assert "partitions=" in repr(parsed)


_axes = ["a", "b", "c", "d"]


@given(st.permutations(_axes), st.lists(st.integers(-1, 3), min_size=4, max_size=4))
def test_parse_then_to_partition_spec_round_trips(order, dims) -> None:
    parts: list[list[str]] = [[] for _ in range(4)]
    for axis, d in zip(order, dims, strict=True):
        if d >= 0:
            parts[d].append(axis)
    spec = PartitionSpec(*[tuple(p) for p in parts])
    parsed = parse(spec)
    assert parse(parsed.to_partition_spec()) == parsed
    assert parsed.to_partition_spec() == PartitionSpec(
        *[tuple(p) for p in parts[: max((i + 1 for i, p in enumerate(parts) if p), default=0)]]
    )


# --- prepare_axis_resources ---


def test_prepare_none_leaves_and_lists_stay_lists() -> None:
    # Only pjit reads a *top-level* in_axis_resources list as the argument tuple;
    # a spec tree keeps its lists, which match list values.
    assert prepare_axis_resources(None, "in_axis_resources") == REPLICATED
    out = prepare_axis_resources([PartitionSpec("x"), None], "out_axis_resources")
    assert out == [parse(PartitionSpec("x")), REPLICATED]


def test_prepare_keeps_nested_structure() -> None:
    tree = (
        {"w": PartitionSpec("x"), "b": None},
        [None, JaxP(None, "y")],
        Pair(w=PartitionSpec("y"), b=None),
    )
    out = prepare_axis_resources(tree, "in_axis_resources")
    assert out[0] == {"w": parse(PartitionSpec("x")), "b": REPLICATED}
    assert isinstance(out[1], list) and out[1][1] == parse(PartitionSpec(None, "y"))
    assert isinstance(out[2], Pair) and out[2].b == REPLICATED
    assert all(isinstance(leaf, ParsedPartitionSpec) for leaf in jax.tree_util.tree_leaves(out))


def test_prepare_passes_parsed_leaves_through() -> None:
    parsed = parse(PartitionSpec("x")).insert_axis_partitions(0, ())
    assert prepare_axis_resources((parsed,), "out")[0] is parsed


@pytest.mark.parametrize(
    "tree, path",
    [
        ("x", "in_axis_resources"),
        (3, "in_axis_resources"),
        ((PartitionSpec("x"), "x"), "in_axis_resources[1]"),
        ([None, 3], "in_axis_resources[1]"),
        (({"w": ("x", None)},), "in_axis_resources[0]['w'][0]"),
        ((Pair(w=1.5, b=None),), "in_axis_resources[0].w"),
    ],
)
def test_prepare_rejects_non_spec_leaves(tree, path) -> None:
    with pytest.raises(TypeError) as info:
        prepare_axis_resources(tree, "in_axis_resources")
    assert path in str(info.value)
    assert "PartitionSpec" in str(info.value)


def test_prepare_duplicate_axis() -> None:
    with pytest.raises(ValueError, match=r"'x'") as info:
        prepare_axis_resources((None, {"k": PartitionSpec("x", ("y", "x"))}), "out_axis_resources")
    assert "out_axis_resources[1]['k']" in str(info.value)


def test_prepare_unconstrained_only_when_allowed() -> None:
    tree = (PartitionSpec(UNCONSTRAINED, "x"),)
    with pytest.raises(ValueError, match="UNCONSTRAINED") as info:
        prepare_axis_resources(tree, "in_axis_resources")
    assert "in_axis_resources[0]" in str(info.value)
    out = prepare_axis_resources(tree, "axis_resources", allow_unconstrained=True)
    assert out[0].unconstrained_dims == frozenset({0})


# --- broadcast_prefix ---


def test_broadcast_single_spec_over_everything() -> None:
    spec = parse(PartitionSpec("x"))
    args = (np.zeros(2), {"a": 1, "b": (2, 3)})
    specs, paths = broadcast_prefix(spec, args, api="pjit", what="arguments")
    assert specs == [spec] * 4
    assert paths == [
        (SequenceKey(0),),
        (SequenceKey(1), DictKey("a")),
        (SequenceKey(1), DictKey("b"), SequenceKey(0)),
        (SequenceKey(1), DictKey("b"), SequenceKey(1)),
    ]


def test_broadcast_prefix_subtrees() -> None:
    sx, sy = parse(PartitionSpec("x")), parse(PartitionSpec("y"))
    prefix = ({"w": sx, "b": REPLICATED}, [sy, None], Pair(w=sx, b=sy))
    full = ({"b": 1, "w": (2, 3)}, [4, {"k": 5}], Pair(w=6, b=[7, 8]))
    specs, paths = broadcast_prefix(prefix, full, api="pjit", what="arguments")
    assert specs == [REPLICATED, sx, sx, sy, None, sx, sy, sy]
    leaves = jax.tree_util.tree_flatten_with_path(full)[0]
    assert paths == [p for p, _ in leaves]
    assert paths[5] == (SequenceKey(2), GetAttrKey("w"))


def test_broadcast_none_children_of_the_full_tree_have_no_leaves() -> None:
    specs, paths = broadcast_prefix(
        (REPLICATED, REPLICATED), (None, 1), api="pjit", what="arguments"
    )
    assert specs == [REPLICATED] and paths == [(SequenceKey(1),)]


@pytest.mark.parametrize(
    "prefix, full, where, detail",
    [
        ((None, None), (1, 2, 3), "the top level", "length 2 vs 3"),
        (({"w": None},), ({"v": 1},), "[0]", "['v']"),
        (Pair(None, None), (1, 2), "the top level", "Pair"),
        ((None, (None, None)), (1, 2), "[1]", "leaf of type int"),
        (([None], None), ((1,), 2), "[0]", "list"),
        (({"a": {"b": (None, None)}},), ({"a": {"b": (1,)}},), "[0]['a']['b']", "length 2 vs 1"),
    ],
)
def test_broadcast_not_a_prefix(prefix, full, where, detail) -> None:
    with pytest.raises(ValueError, match="prefix") as info:
        broadcast_prefix(prefix, full, api="pjit", what="arguments")
    msg = str(info.value)
    # jax's account first, then ours, naming where the trees part and how.
    assert msg.startswith("Mismatch details (1 found):\npytree structure error: ")
    assert "\npjit: the spec tree is not a pytree prefix of the arguments" in msg
    assert f"at {where}:" in msg
    assert detail in msg
