"""Spec errors: the type, and that the message names the path, axis, sizes and a fix.

These are the spec-level rows of the API.md error table; each message must say what
was expected and how to fix it, and name the argument's pytree key path.
"""

from __future__ import annotations

from collections import namedtuple

import jax
import numpy as np
import pytest

from partitioner import (
    UNCONSTRAINED,
    ParsedPartitionSpec,
    PartitionSpec,
    pjit,
    prepare_axis_resources,
)
from partitioner._testing import broadcast_prefix, check_spec, check_specs
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, mesh_ctx

JaxP = jax.sharding.PartitionSpec
Pair = namedtuple("Pair", ["w", "b"])


@pytest.fixture
def mesh_2x4(mesh: MeshFactory) -> jax.sharding.Mesh:
    return mesh((2, 4), ("x", "y"))


def parse(spec) -> ParsedPartitionSpec:
    return ParsedPartitionSpec.from_user_input(spec, "test")


def check_args(in_specs, args, mesh) -> None:
    """What pjit does with in_axis_resources: parse, broadcast over args, check."""
    parsed = prepare_axis_resources(in_specs, "in_axis_resources")
    specs, paths = broadcast_prefix(parsed, args, api="pjit", what="in_axis_resources")
    shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(args)]
    wheres = [f"pjit in_axis_resources{jax.tree_util.keystr(p)}" for p in paths]
    subjects = [f"pjit arguments with pytree key path {jax.tree_util.keystr(p)}" for p in paths]
    check_specs("pjit in_axis_resources", specs, wheres, subjects, shapes, mesh)


# --- undefined axis ---


@pytest.mark.parametrize(
    "spec", [PartitionSpec("z"), JaxP(None, ("x", "zz")), PartitionSpec(("y", "q"))]
)
def test_undefined_axis(mesh_2x4, spec) -> None:
    axis = next(a for a in parse(spec).mesh_axes if a not in ("x", "y"))
    with pytest.raises(ValueError) as info:
        check_spec(parse(spec), (8, 8), mesh_2x4, "pjit in_axis_resources[0]")
    msg = str(info.value)
    assert repr(axis) in msg
    assert "did you forget the mesh" in msg.lower()
    assert "('x', 'y')" in msg  # the axes that do exist
    # jax's own sentence first, then which spec
    assert msg.startswith(f"Resource axis: {axis} of ")
    assert "\npjit in_axis_resources[0]:" in msg


def test_undefined_axis_names_the_key_path(mesh_2x4) -> None:
    args = ({"w": np.zeros((4, 4)), "b": np.zeros(4)},)
    with pytest.raises(ValueError, match=r"pjit in_axis_resources\[0\]\['w'\].*'model'"):
        check_args(({"w": PartitionSpec("model"), "b": None},), args, mesh_2x4)


# --- rank ---


def test_rank(mesh_2x4) -> None:
    with pytest.raises(ValueError) as info:
        check_spec(
            parse(PartitionSpec("x", None, "y")), (8, 8), mesh_2x4, "pjit out_axis_resources"
        )
    msg = str(info.value)
    assert "rank" in msg and "ndim" in msg
    assert "3 entries" in msg and "rank 2" in msg and "(8, 8)" in msg
    assert "PartitionSpec('x', None)" in msg  # the suggested fix


def test_rank_of_a_scalar_names_the_path(mesh_2x4) -> None:
    with pytest.raises(ValueError, match=r"in_axis_resources\[1\].w.*rank 0"):
        check_args(
            (None, Pair(w=PartitionSpec("x"), b=None)), (np.zeros(2), Pair(w=1.0, b=2.0)), mesh_2x4
        )


def test_trailing_unpartitioned_entries_still_count_towards_rank(mesh_2x4) -> None:
    with pytest.raises(ValueError, match="rank"):
        check_spec(parse(PartitionSpec("x", None)), (8,), mesh_2x4, "here")
    check_spec(parse(PartitionSpec("x")), (8,), mesh_2x4, "here")  # fine


# --- divisibility ---


@pytest.mark.parametrize(
    "spec, shape, size, divisor",
    [
        (PartitionSpec("x"), (3, 4), 3, 2),
        (PartitionSpec(None, "y"), (4, 6), 6, 4),
        (PartitionSpec(("x", "y")), (12,), 12, 8),
    ],
)
def test_not_divisible(mesh_2x4, spec, shape, size, divisor) -> None:
    with pytest.raises(ValueError) as info:
        check_spec(parse(spec), shape, mesh_2x4, "pjit in_axis_resources[0]")
    msg = str(info.value)
    assert f"size {size}" in msg and f"divisible by {divisor}" in msg
    assert "Pad" in msg


def test_not_divisible_names_the_key_path_and_axis_sizes(mesh_2x4) -> None:
    args = (np.zeros(8), {"k": [np.zeros((8, 6))]})
    with pytest.raises(ValueError) as info:
        check_args((None, {"k": [PartitionSpec(None, ("x", "y"))]}), args, mesh_2x4)
    msg = str(info.value)
    assert "in_axis_resources[1]['k'][0]" in msg
    assert "x=2 * y=4" in msg and "size 6" in msg and "8" in msg


def test_divisibility_can_be_skipped(mesh_2x4) -> None:
    # with_sharding_constraint allows uneven sharding
    check_spec(parse(PartitionSpec("x")), (3,), mesh_2x4, "constraint", check_divisible=False)


def test_valid_specs_pass(mesh_2x4) -> None:
    args = (np.zeros((8, 4)), {"a": np.zeros(2), "b": 3.0})
    check_args((PartitionSpec("y", "x"), {"a": PartitionSpec("x"), "b": None}), args, mesh_2x4)
    check_args(None, args, mesh_2x4)
    check_args(PartitionSpec(), args, mesh_2x4)


# --- the parse-time rows of the error table ---


@pytest.mark.parametrize("leaf", ["x", 3, 1.0, object()])
def test_leaf_that_is_not_a_spec(leaf) -> None:
    with pytest.raises(TypeError) as info:
        prepare_axis_resources((None, {"w": leaf}), "in_axis_resources")
    assert "in_axis_resources[1]['w']" in str(info.value)
    assert type(leaf).__name__ in str(info.value)


@pytest.mark.parametrize(
    "spec, axis",
    [
        (PartitionSpec("x", "x"), "x"),
        (PartitionSpec(("x", "y"), None, "y"), "y"),
        (JaxP(("model", "model")), "model"),
    ],
)
def test_duplicate_axis(spec, axis) -> None:
    with pytest.raises(ValueError) as info:
        prepare_axis_resources((spec,), "out_axis_resources")
    msg = str(info.value)
    assert repr(axis) in msg and "more than once" in msg
    assert "out_axis_resources[0]" in msg


@pytest.mark.parametrize("spec", [PartitionSpec(UNCONSTRAINED), JaxP("x", JaxP.UNCONSTRAINED)])
def test_unconstrained_in_pjit_specs(spec) -> None:
    with pytest.raises(ValueError, match="with_sharding_constraint"):
        prepare_axis_resources(spec, "in_axis_resources")


def test_wrong_length_tuple_of_specs(mesh_2x4) -> None:
    with pytest.raises(ValueError) as info:
        check_args((None, None), (np.zeros(2),), mesh_2x4)
    msg = str(info.value)
    assert "in_axis_resources" in msg and "prefix" in msg and "length 2 vs 1" in msg


def test_namedtuple_for_the_argument_tuple(mesh_2x4) -> None:
    with pytest.raises(ValueError) as info:
        check_args(Pair(None, None), (np.zeros(2), np.zeros(2)), mesh_2x4)
    msg = str(info.value)
    assert "in_axis_resources" in msg and "prefix" in msg and "tuple" in msg


def test_spec_subtree_where_the_argument_is_a_leaf(mesh_2x4) -> None:
    with pytest.raises(ValueError, match=r"prefix.*at \[0\]"):
        check_args(({"w": None},), (np.zeros(2),), mesh_2x4)


# --- every bad leaf at once ---


def test_a_spec_tree_reports_every_bad_leaf_at_once() -> None:
    P = PartitionSpec
    specs = {"w": "x", "b": P("y", "y"), "ok": P("x"), "u": P(UNCONSTRAINED)}
    with pytest.raises(TypeError) as info:
        prepare_axis_resources(specs, "pjit in_axis_resources")
    message = str(info.value)
    assert "3 spec leaves are invalid" in message
    for path in ("['w']", "['b']", "['u']"):
        assert f"pjit in_axis_resources{path}" in message
    assert "['ok']" not in message


def test_shape_checks_report_every_bad_leaf_at_once() -> None:
    x = {"a": np.ones((6, 4), np.float32), "b": np.ones((4,), np.float32)}
    with mesh_ctx(*MESH_2D), pytest.raises(ValueError) as info:
        pjit(lambda t: t, ({"a": PartitionSpec("a"), "b": PartitionSpec("a", "b")},), None)(x)
    message = str(info.value)
    assert "2 spec leaves are invalid" in message
    assert "argument t['a']" in message and "not divisible by" in message
    assert "argument t['b']" in message and "rank 1" in message
