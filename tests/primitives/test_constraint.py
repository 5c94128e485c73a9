"""``with_sharding_constraint``: inside pjit, inside jax.jit under a mesh, and eagerly.

Numbers are compared with the same function without the constraint under
``jax.jit``. Runs under GSPMD and Shardy (jax's flag follows, for ``jax.jit``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import UNCONSTRAINED, pjit, with_sharding_constraint
from partitioner import PartitionSpec as P
from tests.helpers import MESH_2D, MESH_3D, arange, assert_close, assert_laid_out, mesh_ctx, named

pytestmark = pytest.mark.usefixtures("jax_partitioner_mode")

X = arange(8, 8)


def _f(x: Any) -> Any:
    return jnp.sin(x) @ x.T + 1


def _constrained(spec: Any) -> Any:
    def f(x: Any) -> Any:
        return with_sharding_constraint(jnp.sin(x), spec) @ x.T + 1

    return f


SPECS = [
    pytest.param(P("a", "b"), id="2d"),
    pytest.param(P(None, ("b", "a")), id="tuple"),
    pytest.param(None, id="replicated"),
    pytest.param(P(UNCONSTRAINED, "b"), id="unconstrained"),
    pytest.param(jax.sharding.PartitionSpec("b"), id="jax-spec"),
]


# --- inside pjit ---


@pytest.mark.parametrize("spec", SPECS)
def test_inside_pjit(spec: Any) -> None:
    want = jax.jit(_f)(X)
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(_constrained(spec), P("a"), P("a"))(X))
    assert_close(out, want)
    assert_laid_out(out, mesh, P("a"))


def test_constraint_is_honoured_by_the_partitioner() -> None:
    # Replicated in and out; only the constraint shards the intermediate, so
    # the partitioned HLO must hold per-device [2, 4] pieces of the [8, 8] value.
    def f(x: Any) -> Any:
        return with_sharding_constraint(x * 2, P("a", "b")).sum()

    with mesh_ctx(*MESH_2D):
        g = pjit(f, None, None)
        text = g.lower(X).compile().as_text()
        out = jax.block_until_ready(g(X))
    assert "f32[2,4]" in text
    assert_close(out, jax.jit(lambda x: (x * 2).sum())(X))


def test_last_op_constraint_in_pjit_with_replicated_output() -> None:
    def f(x: Any) -> Any:
        return with_sharding_constraint(x + 1, P("b", "a"))

    with mesh_ctx(*MESH_3D) as mesh:
        out = jax.block_until_ready(pjit(f, P("a"), None)(X))
    assert_close(out, X + 1)
    assert_laid_out(out, mesh, None)


# --- inside jax.jit under a mesh ---


@pytest.mark.parametrize("spec", SPECS)
def test_inside_jit_under_mesh(spec: Any) -> None:
    want = jax.jit(_f)(X)
    with mesh_ctx(*MESH_2D):
        out = jax.block_until_ready(jax.jit(_constrained(spec))(X))
    assert_close(out, want)


def test_inside_jit_output_follows_the_constraint() -> None:
    def f(x: Any) -> Any:
        return with_sharding_constraint(x * 3, P("a", "b"))

    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(X, named(mesh, None))
        out = jax.block_until_ready(jax.jit(f)(x))
    assert_close(out, X * 3)
    assert_laid_out(out, mesh, P("a", "b"))


def test_inside_jit_with_committed_inputs_on_the_mesh() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(X, named(mesh, P("b")))
        out = jax.block_until_ready(jax.jit(_constrained(P("a", "b")))(x))
    assert_close(out, jax.jit(_f)(X))


# --- eagerly ---


@pytest.mark.parametrize(
    ("mesh_def", "spec"),
    [
        pytest.param(MESH_2D, P("a", "b"), id="2d"),
        pytest.param(MESH_2D, P(("b", "a")), id="2d-tuple"),
        pytest.param(MESH_2D, None, id="2d-replicated"),
        pytest.param(MESH_3D, P("c", ("a", "b")), id="3d"),
    ],
)
def test_eager_lays_the_value_out(mesh_def: Any, spec: Any) -> None:
    with mesh_ctx(*mesh_def) as mesh:
        out = jax.block_until_ready(with_sharding_constraint(X, spec))
    assert_close(out, X)
    assert_laid_out(out, mesh, spec, X)


def test_eager_on_committed_array() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(X, named(mesh, P("a")))
        out = jax.block_until_ready(with_sharding_constraint(x, P(None, "a")))
    assert_laid_out(out, mesh, P(None, "a"), X)


def test_eager_unconstrained_dims_are_unpartitioned() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(with_sharding_constraint(X, P(UNCONSTRAINED, "b")))
    assert_close(out, X)
    assert_laid_out(out, mesh, P(None, "b"), X)


# --- pytrees with prefix specs ---


def _tree() -> dict:
    return {"w": arange(8, 4), "bs": [arange(8), arange(4, 2)], "s": np.float32(2.0)}


TREE_SPECS = {"w": P("a", "b"), "bs": [P("a"), P(None, "b")], "s": None}
TREE_PREFIX = {"w": P(None, "b"), "bs": P("b"), "s": None}  # one spec for the list


@pytest.mark.parametrize("specs", [TREE_SPECS, TREE_PREFIX], ids=["full", "prefix"])
def test_pytree_eager(specs: Any) -> None:
    tree = _tree()
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(with_sharding_constraint(tree, specs))
    assert_close(out, tree)
    bs_specs = specs["bs"] if isinstance(specs["bs"], list) else [specs["bs"]] * 2
    assert_laid_out(out["w"], mesh, specs["w"])
    for leaf, spec in zip(out["bs"], bs_specs, strict=True):
        assert_laid_out(leaf, mesh, spec)
    assert_laid_out(out["s"], mesh, None)


@pytest.mark.parametrize("specs", [TREE_SPECS, TREE_PREFIX, P("b")], ids=["full", "prefix", "one"])
def test_pytree_inside_pjit(specs: Any) -> None:
    def plain(t: dict) -> Any:
        return t["w"].sum() * t["s"] + t["bs"][0].sum() + t["bs"][1].sum()

    def constrained(t: dict) -> Any:
        return plain(with_sharding_constraint(t, specs))

    tree = _tree()
    if specs == P("b"):
        tree["s"] = np.ones((2,), np.float32)  # rank >= 1 everywhere for a single spec
    with mesh_ctx(*MESH_2D):
        out = jax.block_until_ready(pjit(constrained, None, None)(tree))
        in_jit = jax.block_until_ready(jax.jit(constrained)(tree))
    want = jax.jit(plain)(tree)
    assert_close(out, want)
    assert_close(in_jit, want)


def test_pytree_constraint_keeps_the_structure() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", ["x", "y"])
    value = Pair(x=arange(8, 2), y=(arange(4), arange(2, 2)))
    with mesh_ctx(*MESH_2D):
        out = jax.block_until_ready(with_sharding_constraint(value, Pair(x=P("a"), y=P("b"))))
        inside = jax.block_until_ready(
            pjit(lambda v: with_sharding_constraint(v, Pair(x=P("a"), y=None)), None, None)(value)
        )
    assert isinstance(out, Pair) and isinstance(out.y, tuple)
    assert_close(out, value)
    assert_close(inside, value)


# --- uneven shapes ---


@pytest.mark.parametrize(
    ("shape", "spec"),
    [
        pytest.param((5, 3), P("a", "b"), id="both"),
        pytest.param((7,), P(("a", "b")), id="tuple"),
        pytest.param((3, 9), P(None, "a"), id="cols"),
        pytest.param((8, 3), P("a", "b"), id="mixed"),
    ],
)
def test_uneven_shapes_are_allowed(shape: tuple[int, ...], spec: Any) -> None:
    x = arange(*shape)

    def plain(v: Any) -> Any:
        return jnp.cos(v) * 2

    def constrained(v: Any) -> Any:
        return with_sharding_constraint(jnp.cos(v), spec) * 2

    want = jax.jit(plain)(x)
    with mesh_ctx(*MESH_2D) as mesh:
        in_pjit = jax.block_until_ready(pjit(constrained, None, None)(x))
        in_jit = jax.block_until_ready(jax.jit(constrained)(x))
        eager = jax.block_until_ready(with_sharding_constraint(x, spec))
    assert_close(in_pjit, want)
    assert_close(in_jit, want)
    assert_close(eager, x)
    # Eagerly a jax.Array cannot be split unevenly: the dims the axes do not
    # divide are laid out unpartitioned, the others as the spec says.
    sizes = dict(mesh.shape)
    even = [
        None if e is None or shape[d] % np.prod([sizes[a] for a in np.atleast_1d(e)]) else e
        for d, e in enumerate(spec)
    ]
    assert_laid_out(eager, mesh, P(*even), x)


# --- no mesh ---


def test_no_mesh_eager_raises() -> None:
    with pytest.raises(RuntimeError, match="mesh"):
        with_sharding_constraint(X, P("a"))


def test_no_mesh_under_make_jaxpr_raises() -> None:
    with pytest.raises(RuntimeError, match="mesh"):
        jax.make_jaxpr(lambda x: with_sharding_constraint(x, P("a")))(X)


def test_no_mesh_error_names_the_api() -> None:
    with pytest.raises(RuntimeError, match="with_sharding_constraint"):
        with_sharding_constraint({"w": X}, {"w": P("a")})


# --- the primitive in a jaxpr ---


def test_constraint_appears_in_the_jaxpr() -> None:
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(_constrained(P("a", UNCONSTRAINED)))(X)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "sharding_constraint"]
    assert eqn.params["axis_resources"].to_partition_spec() == P("a", UNCONSTRAINED)
    assert dict(eqn.params["mesh"].shape) == {"a": 4, "b": 2}


def test_eval_shape_with_constraint() -> None:
    sds = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    with mesh_ctx(*MESH_2D), partitioner.recording() as events:
        out = jax.eval_shape(_constrained(P("a", "b")), sds)
    assert out.shape == (8, 8) and out.dtype == jnp.float32
    assert events["compile"] == 0
