"""``auto_pipeline_p``: the mark an AUTO pipeline leaves reaches its call through every
transformation (NOTE [pipeline decision]), and changes nothing the program computes or
XLA compiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import partial_eval as pe

import partitioner
from partitioner._testing import auto_pipeline_p, auto_pipeline_sites

LAYERS, WIDTH, BATCH = 4, 8, 16


def _layer(w: Any, h: Any) -> Any:
    return jnp.tanh(h @ w)


AUTO_STACK = partitioner.pipeline(_layer, axis=partitioner.AUTO)


def _loss(ws: Any, x: Any) -> Any:
    return jnp.sum(AUTO_STACK(ws, x) ** 2)


def _plain_loss(ws: Any, x: Any) -> Any:
    h = jax.lax.scan(lambda h, w: (_layer(w, h), None), x, ws)[0]
    return jnp.sum(h**2)


def _args() -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    ws = rng.standard_normal((LAYERS, WIDTH, WIDTH), np.float32) / 4
    return ws, rng.standard_normal((BATCH, WIDTH), np.float32)


def test_auto_pipeline_p_keeps_its_mark_in_dce_and_checkpoint() -> None:
    assert "impl" in vars(auto_pipeline_p) and "abstract_eval" in vars(auto_pipeline_p)
    assert auto_pipeline_p in pe.dce_rules
    assert auto_pipeline_p in pe.partial_eval_jaxpr_custom_rules


TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "plain": lambda f: f,
    "grad": jax.grad,
    "value_and_grad": lambda f: jax.value_and_grad(f, argnums=(0, 1)),
    "checkpoint": lambda f: jax.grad(jax.checkpoint(f)),
    "vmap": lambda f: jax.vmap(f, in_axes=(None, 0)),
    "jvp": lambda f: lambda ws, x: jax.jvp(f, (ws, x), (ws, x)),
    "jax.jit": lambda f: jax.jit(jax.grad(f)),
    "partitioner.jit": lambda f: partitioner.jit(jax.grad(f)),
    "scan": lambda f: (
        lambda ws, x: jax.lax.scan(lambda c, _: (c + f(ws, x), None), 0.0, None, 2)[0]
    ),
}


@pytest.mark.parametrize("name", TRANSFORMS)
def test_the_mark_reaches_the_traced_program_through_a_transformation(name: str) -> None:
    ws, x = _args()
    if name == "vmap":
        x = np.stack([x, -x])
    traced = jax.make_jaxpr(TRANSFORMS[name](_loss))(ws, x)
    (site,) = auto_pipeline_sites(traced)
    assert site.schedules == ("gpipe", "circular") and site.microbatches is None
    # and the value is the plain scan's, the mark computing nothing
    want = TRANSFORMS[name](_plain_loss)(ws, x)
    got = TRANSFORMS[name](_loss)(ws, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


def test_the_mark_lowers_to_nothing() -> None:
    ws, x = _args()
    ours = jax.jit(jax.grad(_loss)).lower(ws, x).as_text(debug_info=False)
    plain = jax.jit(jax.grad(_plain_loss)).lower(ws, x).as_text(debug_info=False)
    assert ours.replace("_loss", "") == plain.replace("_plain_loss", "").replace("_loss", "")


def test_a_schedule_given_is_the_only_one_the_mark_allows() -> None:
    only = partitioner.pipeline(_layer, axis=partitioner.AUTO, schedule="circular")
    ws, x = _args()
    (site,) = auto_pipeline_sites(jax.make_jaxpr(only)(ws, x))
    assert site.schedules == ("circular",)
