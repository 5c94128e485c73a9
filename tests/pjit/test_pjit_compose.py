"""pjit composes with jax.jit (both ways), itself, make_jaxpr, eval_shape and eval_jaxpr.

Transformations (vmap, grad, jvp...) are tested with the rules (``test_rules_*``).
Every test runs under GSPMD and Shardy; here jax's own flag follows too, so a
``jax.jit`` enclosing a pjit targets the same partitioner.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit, with_sharding_constraint
from tests.helpers import MESH_2D, MESH_3D, arange, assert_close, assert_laid_out, mesh_ctx, named

pytestmark = pytest.mark.usefixtures("jax_partitioner_mode")


def _body(x: Any, y: Any) -> Any:
    return jnp.tanh(x @ y) * 2, (x - 1.0).sum(1)


X = arange(8, 8)
Y = arange(8, 4, start=-0.4)
IN_SPECS = (P("a", "b"), P("b"))
OUT_SPECS = (P("a"), P("b"))


def _pjit_body() -> Any:
    return pjit(_body, IN_SPECS, OUT_SPECS)


# --- jax.jit around pjit ---


def test_pjit_inside_jit_with_committed_inputs() -> None:
    want = jax.jit(_body)(X, Y)
    with mesh_ctx(*MESH_2D) as mesh:
        x = jax.device_put(X, named(mesh, P("a", "b")))
        y = jax.device_put(Y, named(mesh, None))
        g = _pjit_body()
        out = jax.block_until_ready(jax.jit(lambda a, b: g(a, b))(x, y))
        again = jax.block_until_ready(jax.jit(lambda a, b: g(a, b))(x, y))
    assert_close(out, want)
    assert_close(again, want)
    for o in out:
        assert o.sharding.device_set == set(mesh.devices.flat)


def test_pjit_inside_jit_with_numpy_inputs() -> None:
    want = jax.jit(_body)(X, Y)
    with mesh_ctx(*MESH_2D):
        g = _pjit_body()
        out = jax.block_until_ready(jax.jit(lambda a, b: g(a, b))(X, Y))
    assert_close(out, want)


def test_pjit_inside_jit_with_surrounding_ops() -> None:
    def plain(x: Any, y: Any) -> Any:
        a, b = _body(x * 0.5, y)
        return a.sum() + b.mean()

    want = jax.jit(plain)(X, Y)
    with mesh_ctx(*MESH_2D) as mesh:
        g = _pjit_body()

        def composed(x: Any, y: Any) -> Any:
            a, b = g(x * 0.5, y)
            return a.sum() + b.mean()

        x = jax.device_put(X, named(mesh, P("a")))
        out = jax.block_until_ready(jax.jit(composed)(x, Y))
    assert_close(out, want)


def test_pjit_inside_jit_with_jit_out_shardings() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        g = _pjit_body()
        x = jax.device_put(X, named(mesh, P("a", "b")))
        y = jax.device_put(Y, named(mesh, P("b")))
        jitted = jax.jit(
            lambda a, b: g(a, b), out_shardings=(named(mesh, P("a")), named(mesh, P("b")))
        )
        out = jax.block_until_ready(jitted(x, y))
    assert_close(out, jax.jit(_body)(X, Y))
    assert_laid_out(out[0], mesh, P("a"))
    assert_laid_out(out[1], mesh, P("b"))


# --- jax.jit inside pjit ---


def test_jit_inside_pjit() -> None:
    inner = jax.jit(_body)

    def f(x: Any, y: Any) -> Any:
        a, b = inner(x, y)
        return a + 1, b

    want = jax.jit(f)(X, Y)
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(f, IN_SPECS, OUT_SPECS)(X, Y))
    assert_close(out, want)
    assert_laid_out(out[0], mesh, P("a"))
    assert_laid_out(out[1], mesh, P("b"))


# --- pjit inside pjit ---


@pytest.mark.parametrize(
    ("mesh_def", "outer_specs", "inner_specs"),
    [
        pytest.param(
            MESH_2D, (P("a"), P("b")), ((P("b", "a"), None), (P(None, "a"), None)), id="2d"
        ),
        pytest.param(
            MESH_3D,
            (P(("a", "b"), "c"), None),
            ((P("c"), P("a")), (P("b"), P(("c", "a")))),
            id="3d",
        ),
    ],
)
def test_nested_pjit(mesh_def, outer_specs, inner_specs) -> None:
    inner = pjit(_body, *inner_specs)

    def outer_plain(x: Any, y: Any) -> Any:
        a, b = _body(x + 1, y)
        return a * 3, b

    def outer(x: Any, y: Any) -> Any:
        a, b = inner(x + 1, y)
        return a * 3, b

    want = jax.jit(outer_plain)(X, Y)
    with mesh_ctx(*mesh_def) as mesh:
        out = jax.block_until_ready(pjit(outer, outer_specs, (P("a"), None))(X, Y))
    assert_close(out, want)
    assert_laid_out(out[0], mesh, P("a"))
    assert_laid_out(out[1], mesh, None)


def test_doubly_nested_pjit_and_constraint() -> None:
    innermost = pjit(lambda v: with_sharding_constraint(v * 2, P(None, "b")) + 1, P("a"), P("b"))
    middle = pjit(lambda v: innermost(v).T, P("b"), P("a"))

    def plain(v: Any) -> Any:
        return (v * 2 + 1).T - 3

    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(lambda v: middle(v) - 3, P("a", "b"), P(None, "a"))(X))
    assert_close(out, jax.jit(plain)(X))
    assert_laid_out(out, mesh, P(None, "a"))


def test_inner_pjit_closes_over_outer_tracer() -> None:
    def plain(x: Any, y: Any) -> Any:
        s = x.sum(0)
        return (y.T * s[:4, None]) @ x

    def outer(x: Any, y: Any) -> Any:
        s = x.sum(0)  # an outer tracer
        inner = pjit(lambda v: (v.T * s[:4, None]) @ x, P(None, "a"), P("b"))
        return inner(y)

    want = jax.jit(plain)(X, Y)
    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(outer, IN_SPECS, P("a"))(X, Y))
    assert_close(out, want)
    assert_laid_out(out, mesh, P("a"))


def test_inner_pjit_closes_over_constants() -> None:
    np_const = arange(8, 4, start=2.0)
    jnp_const = jnp.asarray(arange(4, start=-1.0))
    inner = pjit(lambda v: v @ np_const + jnp_const, P("a"), P(None, "b"))

    def plain(x: Any) -> Any:
        return (x @ np_const + jnp_const) * 2

    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(lambda x: inner(x) * 2, P("a", "b"), P("b"))(X))
        top = jax.block_until_ready(inner(X))  # the same closure at top level
    assert_close(out, jax.jit(plain)(X))
    assert_laid_out(out, mesh, P("b"))
    assert_close(top, jax.jit(lambda x: x @ np_const + jnp_const)(X))


def test_pjit_closes_over_jit_tracer() -> None:
    def plain(x: Any) -> Any:
        return x * x.mean()

    def via_jit(x: Any) -> Any:
        m = x.mean()
        return pjit(lambda v: v * m, P("a"), P("a"))(x)

    with mesh_ctx(*MESH_2D):
        out = jax.block_until_ready(jax.jit(via_jit)(X))
    assert_close(out, jax.jit(plain)(X))


def test_pjit_inside_control_flow_inside_pjit() -> None:
    step = pjit(lambda c: jnp.sin(c) + 0.1, P("a"), P("a"))

    def looped(x: Any) -> Any:
        return jax.lax.fori_loop(0, 3, lambda i, c: step(c), x)

    def plain(x: Any) -> Any:
        return jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) + 0.1, x)

    with mesh_ctx(*MESH_2D) as mesh:
        out = jax.block_until_ready(pjit(looped, P("a", "b"), P("a", "b"))(X))
    assert_close(out, jax.jit(plain)(X))
    assert_laid_out(out, mesh, P("a", "b"))


# --- make_jaxpr, eval_shape, eval_jaxpr ---


def _pjit_eqns(jaxpr: Any) -> list[Any]:
    return [e for e in jaxpr.eqns if e.primitive.name == "pjit"]


def test_make_jaxpr_shows_a_pjit_equation() -> None:
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(_pjit_body())(X, Y)
    (eqn,) = _pjit_eqns(closed.jaxpr)
    assert "pjit[" in str(closed)
    assert len(eqn.invars) == 2 and len(eqn.outvars) == 2
    assert [v.aval.shape for v in eqn.outvars] == [(8, 4), (8,)]
    assert eqn.params["name"] == "_body"
    assert [s.to_partition_spec() for s in eqn.params["in_axis_resources"]] == list(IN_SPECS)
    assert [s.to_partition_spec() for s in eqn.params["out_axis_resources"]] == list(OUT_SPECS)
    assert dict(eqn.params["mesh"].shape) == {"a": 4, "b": 2}
    hash(tuple(eqn.params.values()))  # hashable params: jax's caches work


def test_make_jaxpr_of_nested_pjit() -> None:
    inner = _pjit_body()
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(pjit(lambda x, y: inner(x, y)[0], None, None))(X, Y)
    (outer_eqn,) = _pjit_eqns(closed.jaxpr)
    (inner_eqn,) = _pjit_eqns(outer_eqn.params["jaxpr"].jaxpr)
    assert inner_eqn.params["name"] == "_body"


def test_make_jaxpr_inside_jit_tracing_sees_pjit() -> None:
    with mesh_ctx(*MESH_2D):
        g = _pjit_body()
        closed = jax.make_jaxpr(jax.jit(lambda x, y: g(x, y)))(X, Y)
    assert "pjit[" in str(closed)


def test_eval_shape() -> None:
    def f(d: dict, s: Any) -> Any:
        return {"y": d["x"] @ d["w"], "n": (d["x"] * s).sum(0).astype(jnp.int32)}

    d = {
        "x": jax.ShapeDtypeStruct((8, 8), jnp.float32),
        "w": jax.ShapeDtypeStruct((8, 4), jnp.float32),
    }
    with mesh_ctx(*MESH_2D), partitioner.recording() as events:
        out = jax.eval_shape(
            pjit(f, ({"x": P("a"), "w": None}, None), {"y": P("a"), "n": None}), d, 2.0
        )
    assert events["compile"] == 0
    assert out["y"].shape == (8, 4) and out["y"].dtype == jnp.float32
    assert out["n"].shape == (8,) and out["n"].dtype == jnp.int32
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(
        jax.eval_shape(f, d, 2.0)
    )


def _tiled(x: Any, n: int, *, scale: float) -> Any:
    return jnp.tile(x, (1, n)) * scale


def test_make_jaxpr_with_static_arguments() -> None:
    g = pjit(_tiled, P("a"), P("a"), static_argnums=1, static_argnames="scale")
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(functools.partial(g, scale=2.0), static_argnums=1)(X, 3)
    (eqn,) = _pjit_eqns(closed.jaxpr)
    assert eqn.outvars[0].aval.shape == (8, 24)
    assert len(closed.jaxpr.invars) == 1  # static arguments are not inputs


def test_eval_shape_with_static_arguments() -> None:
    # As jax documents for eval_shape: its arguments are all dynamic, static ones
    # go in through a closure (here by keyword, so they are named static).
    g = pjit(_tiled, P("a"), P("a"), static_argnames=("n", "scale"))
    with mesh_ctx(*MESH_2D):
        shape = jax.eval_shape(functools.partial(g, n=3, scale=2.0), X)
    assert shape.shape == (8, 24) and shape.dtype == jnp.float32


def test_eval_shape_through_a_python_wrapper() -> None:
    g = pjit(_tiled, P("a"), P("a"), static_argnums=1, static_argnames="scale")
    with mesh_ctx(*MESH_2D), partitioner.recording() as events:
        shape = jax.eval_shape(lambda x: g(x, 3, scale=2.0), X)
        pair = jax.eval_shape(lambda x, y: _pjit_body()(x, y), X, Y)
    assert events["compile"] == 0
    assert shape.shape == (8, 24) and shape.dtype == jnp.float32
    assert [o.shape for o in pair] == [(8, 4), (8,)]


def test_eval_shape_of_jit_around_pjit() -> None:
    with mesh_ctx(*MESH_2D):
        out = jax.eval_shape(jax.jit(_pjit_body()), X, Y)
    assert [o.shape for o in out] == [(8, 4), (8,)]


def test_jit_around_pjit_lowers_with_jits_options() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        g = pjit(lambda x: x * 2, P("a"), P("a"))
        jitted = jax.jit(g, out_shardings=named(mesh, P("b")))
        out = jax.block_until_ready(jitted.lower(X).compile()(X))
    assert_close(out, X * 2)
    assert_laid_out(out, mesh, P("b"))


def test_eval_jaxpr_of_make_jaxpr_gives_same_numbers() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        g = _pjit_body()
        closed = jax.make_jaxpr(g)(X, Y)
        outs = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, X, Y)
        outs = jax.block_until_ready(outs)
        direct = jax.block_until_ready(g(X, Y))
    assert_close(tuple(outs), jax.jit(_body)(X, Y))
    assert_close(tuple(outs), direct)
    assert_laid_out(outs[0], mesh, P("a"))
    assert_laid_out(outs[1], mesh, P("b"))


def test_eval_jaxpr_under_jit() -> None:
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(_pjit_body())(X, Y)
        out = jax.jit(lambda x, y: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x, y))(X, Y)
        out = jax.block_until_ready(out)
    assert_close(tuple(out), jax.jit(_body)(X, Y))


def test_jaxpr_with_constants_round_trips() -> None:
    const = jnp.asarray(arange(8, 8, start=1.0))

    def f(x: Any) -> Any:
        return x @ const

    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(pjit(f, P("a"), P("a")))(X)
        (out,) = jax.block_until_ready(jax.core.eval_jaxpr(closed.jaxpr, closed.consts, X))
    assert_close(out, jax.jit(f)(X))


def test_pjit_output_feeds_jit_and_numpy() -> None:
    with mesh_ctx(*MESH_2D):
        a, b = jax.block_until_ready(_pjit_body()(X, Y))
    want_a, want_b = jax.jit(_body)(X, Y)
    np.testing.assert_allclose(np.asarray(a), np.asarray(want_a), rtol=1e-5, atol=1e-5)
    assert_close(
        jax.block_until_ready(jax.jit(lambda u, v: u.sum() + v.sum())(a, b)),
        want_a.sum() + want_b.sum(),
    )
