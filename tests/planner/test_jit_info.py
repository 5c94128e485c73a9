"""The ``jit``/``pjit`` options record (``planner/jit_info.py``): what tells the doors apart.

Two doors with one planner: the rule that reads a ``None`` leaf, which spec tree
needs a mesh, which leaves are AUTO. Each is checked against the meaning jax gives
the same spec tree (stated beside it) on records built from test-local doors.
"""

from __future__ import annotations

from typing import Any

import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.planner.jit_info import (
    Door,
    JitInfo,
    NoneRule,
    SpecNames,
    jit_info,
    options_of,
)
from partitioner._src.sharding.parsed import REPLICATED
from partitioner._src.sharding.tree import UNSPECIFIED

PJIT = Door("pjit", NoneRule.REPLICATED_UNDER_LEGACY_MESH, use_resource_env=True)
JIT = Door("jit", NoneRule.UNSPECIFIED, use_resource_env=False)
NAMES = SpecNames("in_shardings", "out_shardings")


def _f(x: Any, y: Any) -> Any:
    return x


def _info(door: Door, in_specs: Any, out_specs: Any = None, **options: Any) -> JitInfo:
    return jit_info(_f, door, NAMES, in_specs, out_specs, options_of(partitioner.jit, options))


def test_none_is_replicated_only_for_pjit_under_the_classic_mesh() -> None:
    """jax 0.10.2's pjit: ``None`` replicated under ``with mesh:``; unspecified elsewhere
    and always in jax.jit (the argument as laid out, the output as XLA propagates it)."""
    pjit_info, jit_info_ = _info(PJIT, (None, P("x"))), _info(JIT, (None, P("x")))
    (none, x), out = pjit_info.spec_trees(legacy_mesh=True)
    assert none == REPLICATED and out == REPLICATED and x != REPLICATED
    for info, legacy in [(pjit_info, False), (jit_info_, True), (jit_info_, False)]:
        (open_none, open_x), open_out = info.spec_trees(legacy)
        assert open_none is UNSPECIFIED and open_out is UNSPECIFIED
        assert open_x == x  # a given spec reads the same everywhere


@pytest.mark.parametrize(
    "in_specs, out_specs, needs",
    [
        ((None, P("x")), None, "in_shardings"),
        (None, P(), "out_shardings"),  # even a replicated bare spec needs a mesh
        ((None, None), None, None),
        (None, AUTO, "out_shardings"),
    ],
)
def test_the_tree_holding_a_bare_spec_needs_a_mesh(
    in_specs: Any, out_specs: Any, needs: str | None
) -> None:
    assert _info(JIT, in_specs, out_specs).needs_mesh == needs


def test_named_shardings_name_their_mesh_and_where(mesh: Any) -> None:
    m = mesh((4, 2), ("x", "y"))
    info = _info(JIT, (NamedSharding(m, P("x")), None), NamedSharding(m, P()))
    assert [(where, named) for where, named, _ in info.named_meshes] == [
        ("jit in_shardings[0]", m),
        ("jit out_shardings", m),
    ]


def test_an_auto_leaf_is_seen_and_a_list_at_the_top_is_the_argument_tuple() -> None:
    assert _info(JIT, (AUTO, None)).has_auto and _info(JIT, None, {"a": AUTO}).has_auto
    assert not _info(JIT, (P("x"), None)).has_auto
    assert _info(JIT, [P("x"), None]).in_specs == _info(JIT, (P("x"), None)).in_specs


def test_compiler_options_are_a_sorted_key_and_bad_options_are_type_errors() -> None:
    info = _info(JIT, None, compiler_options={"b": 1, "a": True})
    assert info.compiler_options == (("a", True), ("b", 1))
    with pytest.raises(TypeError, match="compiler_options must be a dict"):
        _info(JIT, None, compiler_options=[("a", 1)])
    for limit in (True, 0, -1, 1.5):
        with pytest.raises(TypeError, match="auto_memory_limit must be a positive int"):
            _info(JIT, None, auto_memory_limit=limit)
