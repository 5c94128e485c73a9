"""Spec trees as real clients write them.

Empty containers are nodes with no leaves; a list matches a list (only the top of
``in_axis_resources`` is the argument tuple); today's ``in_shardings`` /
``out_shardings`` spellings; NamedSharding leaves; our specs inside jax's
NamedSharding. Numbers and layouts are compared with ``jax.jit`` given the same
NamedShardings.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit, with_sharding_constraint
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, arange, assert_close, assert_laid_out, mesh_ctx, named

pytestmark = pytest.mark.usefixtures("partitioner_mode")

Pair = namedtuple("Pair", ["left", "right"])


# --- empty containers (item 1) ---


@pytest.mark.parametrize(
    "out_fn, out_specs",
    [
        pytest.param(lambda x: (), (), id="empty-tuple"),
        pytest.param(lambda x: {"a": x, "b": {}}, {"a": P("a"), "b": {}}, id="empty-dict-inside"),
        pytest.param(lambda x: [x, []], [P("a"), []], id="empty-list-inside"),
        pytest.param(
            lambda x: (x, optax.EmptyState()), (P("a"), optax.EmptyState()), id="optax-EmptyState"
        ),
        pytest.param(
            lambda x: {"m": optax.MaskedNode(), "x": x},
            {"m": optax.MaskedNode(), "x": P(None, "b")},
            id="optax-MaskedNode",
        ),
        pytest.param(lambda x: (x, None), (P("a"), None), id="none-output-leaf"),
    ],
)
def test_empty_containers_in_outputs(out_fn, out_specs) -> None:
    x = arange(8, 4)
    want = jax.jit(out_fn)(x)
    with mesh_ctx(*MESH_2D) as mesh:
        got = pjit(out_fn, P("a"), out_specs)(x)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert_close(got, want)
        specs = jax.tree.leaves(
            out_specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)
        )
        for leaf, spec in zip(jax.tree.leaves(got), specs, strict=False):
            assert_laid_out(leaf, mesh, spec)


def test_empty_containers_in_arguments() -> None:
    def f(state: Any, x: Any) -> Any:
        return (state[0], x * 2)

    state = (optax.EmptyState(), {})
    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        got = pjit(f, ((optax.EmptyState(), {}), P("a")), ((optax.EmptyState()), P("a")))(state, x)
        assert got[0] == optax.EmptyState()
        assert_laid_out(got[1], mesh, P("a"), 2 * x)


def test_empty_container_matches_only_the_same_empty_node() -> None:
    with mesh_ctx(*MESH_2D), pytest.raises(ValueError, match=r"out_axis_resources.*\[1\]"):
        pjit(lambda x: (x, {}), P("a"), (P("a"), ()))(arange(8, 4))


# --- lists (item 3) ---


def test_list_specs_match_list_values_in_and_out() -> None:
    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        out = pjit(lambda v: v, ([P("a"), None],), [None, P(None, "b")])([x, x])
        assert isinstance(out, list)
        assert_laid_out(out[0], mesh, None, x)
        assert_laid_out(out[1], mesh, P(None, "b"), x)


def test_top_level_in_axis_resources_list_is_the_argument_tuple() -> None:
    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        out = pjit(lambda a, b: a + b, [P("a"), None], P("a"))(x, x)
        assert_laid_out(out, mesh, P("a"), 2 * x)


def test_constraint_with_list_specs() -> None:
    a, b = arange(8, 4), arange(8, 4, start=1.0)

    def f(a: Any, b: Any) -> Any:
        return with_sharding_constraint([a, b], [P("a"), P("b")])

    with mesh_ctx(*MESH_2D) as mesh:
        got = pjit(f, None, [P("a"), P("b")])(a, b)
        assert_laid_out(got[0], mesh, P("a"), a)
        assert_laid_out(got[1], mesh, P("b"), b)
        eager = with_sharding_constraint([a, b], [P("a"), P("b")])
        assert_laid_out(eager[1], mesh, P("b"), b)


def test_tuple_spec_for_list_value_names_the_path() -> None:
    with mesh_ctx(*MESH_2D), pytest.raises(ValueError, match="tuple where the outputs has a list"):
        pjit(lambda v: v, None, (None, None))([arange(8, 4), arange(8, 4)])


# --- today's spellings: in_shardings / out_shardings, NamedSharding leaves (item 9) ---


def test_in_shardings_out_shardings_aliases() -> None:
    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        out = pjit(lambda a: a * 3, in_shardings=P("a"), out_shardings=P(None, "b"))(x)
        assert_laid_out(out, mesh, P(None, "b"), 3 * x)


def test_alias_and_its_name_together_is_an_error() -> None:
    with pytest.raises(TypeError, match="in_axis_resources and in_shardings"):
        pjit(lambda a: a, P("a"), None, in_shardings=P("a"))
    # One of them may be omitted: the outputs are then laid out as XLA propagates.
    with mesh_ctx(*MESH_2D) as mesh:
        out = pjit(lambda a: a, in_shardings=P("a"))(arange(8, 4))
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("a")), 2)


def test_named_sharding_leaves_take_their_spec() -> None:
    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        f = pjit(
            lambda a, b: (a + b, a - b),
            in_shardings=(NamedSharding(mesh, P("a")), None),
            out_shardings=(NamedSharding(mesh, P(None, "b")), P("b")),
        )
        s, d = f(x, x)
        assert_laid_out(s, mesh, P(None, "b"), 2 * x)
        assert_laid_out(d, mesh, P("b"), 0 * x)


def test_named_sharding_mesh_is_used_without_a_mesh_in_context(mesh: MeshFactory) -> None:
    jax_mesh = mesh(*MESH_2D)
    x = arange(8, 4)
    f = pjit(
        lambda a: a + 1, NamedSharding(jax_mesh, P("a")), NamedSharding(jax_mesh, P(None, "b"))
    )
    out = f(x)
    assert_laid_out(out, jax_mesh, P(None, "b"), x + 1)
    want = jax.jit(
        lambda a: a + 1,
        in_shardings=NamedSharding(jax_mesh, P("a")),
        out_shardings=NamedSharding(jax_mesh, P(None, "b")),
    )(x)
    assert_close(out, want)


def test_named_sharding_over_another_mesh_names_both(mesh: MeshFactory) -> None:
    other = mesh(*MESH_2D, devices=jax.devices()[:8][::-1])
    f = pjit(lambda a: a, NamedSharding(other, P("a")), None)
    with mesh_ctx(*MESH_2D), pytest.raises(ValueError) as info:
        f(arange(8, 4))
    message = str(info.value)
    assert "in_axis_resources" in message and "[7, 6, 5" in message and "[0, 1, 2" in message


def test_our_spec_in_jax_named_sharding_and_jax_jit(mesh: MeshFactory) -> None:
    jax_mesh = mesh(*MESH_2D)
    sharding = NamedSharding(jax_mesh, P("a", "b"))
    x = arange(8, 4)
    y = jax.jit(lambda a: a * 2, out_shardings=sharding)(jax.device_put(x, sharding))
    assert_laid_out(y, jax_mesh, P("a", "b"), 2 * x)


# --- pjit accepts what jax.jit accepts, for arbitrary pytrees (hypothesis) ---

_Rec = namedtuple("_Rec", ["u", "v"])


@jax.tree_util.register_dataclass
@dataclass
class Registered:
    a: Any
    b: Any
    tag: str = field(default="t", metadata={"static": True})


@struct.dataclass
class FlaxStruct:
    a: Any
    b: Any
    tag: str = struct.field(pytree_node=False, default="s")


_SPECS = [P(), P("a"), P(None, "b"), P(("a", "b")), P("b", "a"), P("a", None)]


@st.composite
def _value_trees(draw: Any, depth: int = 0) -> Any:
    """Nested tuples, lists, dicts, namedtuples, dataclasses, flax structs, empties, None."""
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        kind = draw(st.sampled_from(["array", "array", "array", "none", "()", "{}", "[]"]))
        if kind == "array":
            shape = draw(st.sampled_from([(8, 4), (8, 8), (16, 2), (8,), (4,)]))
            return arange(*shape, start=float(draw(st.integers(0, 3))))
        return {"none": None, "()": (), "{}": {}, "[]": []}[kind]
    sub = _value_trees(depth + 1)
    kind = draw(st.sampled_from(["tuple", "list", "dict", "namedtuple", "dataclass", "struct"]))
    if kind in ("tuple", "list"):
        kids = draw(st.lists(sub, min_size=1, max_size=3))
        return tuple(kids) if kind == "tuple" else kids
    if kind == "dict":
        return draw(st.dictionaries(st.sampled_from(["k0", "k1", "k2"]), sub, min_size=1))
    if kind == "namedtuple":
        return _Rec(draw(sub), draw(sub))
    if kind == "dataclass":
        return Registered(draw(sub), draw(sub), tag=draw(st.sampled_from(["x", "y"])))
    return FlaxStruct(draw(sub), draw(sub))


def _spec_prefix(draw: Any, value: Any) -> Any:
    """A spec tree that is a pytree prefix of ``value``; empty nodes stay empty nodes.

    Spec leaves are drawn blindly: where one does not fit a leaf it stands for
    (rank, divisibility), jax.jit rejects the pair, and pjit must too.
    """
    kids, node = jax.tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)
    if value is None or node.node_data() is None or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(_SPECS))
    return node.unflatten([_spec_prefix(draw, k) for k in kids])


def _jax_shardings(spec_tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        spec_tree,
        is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec),
    )


def _outcome(run: Any) -> tuple[str, Any]:
    try:
        return "ok", run()
    except (ValueError, TypeError) as e:
        return "error", e


# Each example compiles two programs (~0.1 s each); 50 of them cover every outcome
# (accepted, rank, divisibility, prefix errors) and keep the suite within its time. The
# plugin's ``mesh`` fixture is per test, and holds nothing an example could change.
@settings(
    max_examples=50,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(st.data())
@pytest.mark.slow
def test_pjit_accepts_what_jax_jit_accepts(mesh: MeshFactory, data: Any) -> None:
    """Same pytree, same prefix spec trees: pjit and jax.jit agree on acceptance and layout."""
    value = data.draw(_value_trees(), label="value")
    in_specs = _spec_prefix(data.draw, value)
    out_specs = _spec_prefix(data.draw, value)
    jax_mesh = mesh(*MESH_2D)

    def f(v: Any) -> Any:
        return jax.tree.map(lambda a: a * 2, v)

    theirs = _outcome(
        lambda: jax.jit(
            f,
            in_shardings=(_jax_shardings(in_specs, jax_mesh),),
            out_shardings=_jax_shardings(out_specs, jax_mesh),
        )(value)
    )
    with partitioner.mesh(jax_mesh.devices, jax_mesh.axis_names):
        ours = _outcome(lambda: pjit(f, (in_specs,), out_specs)(value))
    event(f"outcome: {ours[0]}")
    assert ours[0] == theirs[0], (ours, theirs, in_specs, out_specs)
    if ours[0] == "error":
        assert isinstance(ours[1], ValueError), ours[1]
        # Named by key path: "argument x..." (by parameter, as jax) or "output...".
        assert "argument " in str(ours[1]) or "output" in str(ours[1]), ours[1]
        return
    got, want = ours[1], theirs[1]
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w))
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)


def test_named_shardings_in_spec_trees_match_jax_jit_layouts(mesh: MeshFactory) -> None:
    jax_mesh = mesh(*MESH_2D)
    tree = {"w": arange(8, 4), "b": arange(8), "s": Pair(arange(8, 8), jnp.float32(2.0))}
    specs = {"w": P("a", "b"), "b": P("b"), "s": Pair(P(None, "a"), P())}
    shardings = _jax_shardings(specs, jax_mesh)
    want = jax.jit(lambda t: t, in_shardings=(shardings,), out_shardings=shardings)(tree)
    got = pjit(lambda t: t, (shardings,), shardings)(tree)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert named(jax_mesh, P("a", "b")).is_equivalent_to(got["w"].sharding, 2)
