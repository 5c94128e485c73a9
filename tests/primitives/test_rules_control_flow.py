"""pjit inside lax.scan / lax.cond / lax.while_loop bodies.

The bodies are lowered with our MLIR rule inside jax's control-flow lowering;
under grad (scan and cond) they go through our JVP, partial-eval and transpose
rules inside the loop/branch jaxprs. Numbers are compared with the same
plain function under ``jax.jit``; both partitioners (``partitioner_mode``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from partitioner import PartitionSpec as P
from partitioner import pjit
from tests.helpers import MESH_2D, mesh_ctx, named
from tests.primitives.rules_helpers import assert_sharded_like, assert_tree_close, rand

pytestmark = [pytest.mark.usefixtures("partitioner_mode"), pytest.mark.slow]

X_SPEC = P("a", "b")


def _step(c: Any, w: Any) -> Any:
    # c: [8, 4], w: [4, 4] -> [8, 4]
    return jnp.tanh(c @ w) + 0.5 * c


def _plain(f: Callable[..., Any], *_: Any) -> Callable[..., Any]:
    return f


def _scan_loss(call: Callable[..., Any]) -> Callable[..., Any]:
    step = call(_step, (X_SPEC, P("b")), X_SPEC)

    def run(c0: Any, ws: Any) -> Any:
        def body(c: Any, w: Any) -> Any:
            c = step(c, w)
            return c, jnp.sum(c * c)

        c, ys = jax.lax.scan(body, c0, ws)
        return jnp.sum(c) + jnp.sum(ys)

    return run


def _placed(mesh: Any, *xs: Any) -> list[Any]:
    """Inputs already laid out over the mesh (so the loop runs on all of its devices)."""
    return [jax.device_put(x, named(mesh, None)) for x in xs]


@pytest.mark.parametrize("placed", [False, True], ids=["numpy-in", "mesh-in"])
def test_scan_forward_and_grad(placed) -> None:
    c0, ws = rand(0, 8, 4), rand(1, 3, 4, 4) / 2
    plain = _scan_loss(_plain)
    want = (jax.jit(plain)(c0, ws), jax.jit(jax.grad(plain, argnums=(0, 1)))(c0, ws))
    with mesh_ctx(*MESH_2D) as mesh:
        args = _placed(mesh, c0, ws) if placed else (c0, ws)
        f = _scan_loss(pjit)
        got = (f(*args), jax.grad(f, argnums=(0, 1))(*args))
        assert_tree_close(got, want)
        assert_tree_close(jax.jit(f)(*args), want[0])
        if placed:
            return
        # The loop inside an outer pjit.
        outer = pjit(f, (X_SPEC, None), None)
        got = (outer(*args), jax.grad(outer, argnums=(0, 1))(*args))
        assert_tree_close(got, want)
        assert_sharded_like(got[1][0], mesh, X_SPEC)


def _cond_fn(call: Callable[..., Any]) -> Callable[..., Any]:
    # Both branches return one layout: XLA's verifier rejects a conditional whose
    # branches end in different shardings, for jax.jit's own jit(out_shardings=)
    # as for ours (the cond is partitioned over the mesh, NOTE [device
    # assignment under jax.jit]). The inputs may differ.
    left = call(lambda x, w: jnp.sin(x @ w), (X_SPEC, P("b")), P("a"))
    right = call(lambda x, w: jnp.cos(x) * jnp.sum(w), (P(None, "a"), None), P("a"))

    def f(p: Any, x: Any, w: Any) -> Any:
        return jnp.sum(jax.lax.cond(p, left, right, x, w) ** 2)

    return f


def test_cond_forward_and_grad() -> None:
    x, w = rand(2, 8, 4), rand(3, 4, 4)
    plain = _cond_fn(_plain)
    with mesh_ctx(*MESH_2D):
        f = _cond_fn(pjit)
        outer = pjit(f, (None, X_SPEC, None), None)
        for pred in (True, False):  # the predicate is traced: one compile serves both
            want = (
                jax.jit(plain)(pred, x, w),
                jax.jit(jax.grad(plain, argnums=(1, 2)))(pred, x, w),
            )
            got = (f(pred, x, w), jax.grad(f, argnums=(1, 2))(pred, x, w))
            assert_tree_close(got, want)
            assert_tree_close(jax.grad(outer, argnums=(1, 2))(pred, x, w), want[1])


def _while_fn(call: Callable[..., Any]) -> Callable[..., Any]:
    step = call(_step, (X_SPEC, P("b")), X_SPEC)

    def f(c0: Any, w: Any, n: Any) -> Any:
        def cond(s: Any) -> Any:
            return (s[0] < n) & (jnp.sum(s[1] ** 2) < 1e6)

        def body(s: Any) -> Any:
            return s[0] + 1, step(s[1], w)

        return jax.lax.while_loop(cond, body, (0, c0))

    return f


def test_while_loop_forward() -> None:
    c0, w = rand(4, 8, 4), rand(5, 4, 4) / 2
    plain = _while_fn(_plain)
    want = jax.jit(plain)(c0, w, 4)
    with mesh_ctx(*MESH_2D):
        f = _while_fn(pjit)
        assert_tree_close(f(c0, w, 4), want)
        assert_tree_close(pjit(f, (X_SPEC, None, None), None)(c0, w, 4), want)
        # A fixed trip count (fori_loop lowers to scan) can be differentiated.
        step = pjit(_step, (X_SPEC, P("b")), X_SPEC)

        def fori(step: Callable[..., Any]) -> Callable[..., Any]:
            return lambda c, w: jnp.sum(jax.lax.fori_loop(0, 3, lambda i, c: step(c, w), c) ** 2)

        assert_tree_close(
            jax.grad(fori(step), argnums=(0, 1))(c0, w),
            jax.jit(jax.grad(fori(_step), argnums=(0, 1)))(c0, w),
        )
