"""Typed PRNG keys: any extended dtype, in, out and inside pjit.

A ``key<fry>[8]`` is physically ``u32[8, 2]``: shardings cover the physical shape
with the trailing key dimensions replicated, as jax does. Every value is compared
with jax.jit's on the same keys; both partitioners, both dispatch paths.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit, with_sharding_constraint
from tests.helpers import MESH_2D, arange, assert_close, mesh_ctx

pytestmark = [pytest.mark.usefixtures("partitioner_mode"), pytest.mark.slow]


@pytest.fixture(params=["cpp", "python"])
def dispatch_path(request: pytest.FixtureRequest):
    with partitioner.options.fast_path(request.param == "cpp"):
        yield request.param


def _same_keys(got: Any, want: Any) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


def _laid_out(x: Any, mesh: Any, spec: Any) -> None:
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), x.sharding


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_keys_in_and_out(dispatch_path, impl: str) -> None:
    key = jax.random.key(0, impl=impl)

    def split(k: Any) -> Any:
        return jax.random.split(k, 8)

    def draw(ks: Any) -> Any:
        return jax.vmap(lambda k: jax.random.normal(k, (4,)))(ks)

    with mesh_ctx(*MESH_2D) as mesh:
        f, g = pjit(split, None, P("a")), pjit(draw, P("a"), P("a", "b"))
        for _ in range(3):  # the second and third calls take the fast path
            keys = f(key)
            _same_keys(keys, jax.jit(split)(key))
            _laid_out(keys, mesh, P("a"))
            out = g(keys)
            assert_close(out, jax.jit(draw)(keys))
            _laid_out(out, mesh, P("a", "b"))


def test_key_inside_body_and_under_constraint() -> None:
    def f(seed: Any, x: Any) -> Any:
        keys = with_sharding_constraint(jax.random.split(jax.random.key(seed), 8), P("a"))
        noise = jax.vmap(lambda k: jax.random.uniform(k, (4,)))(keys)
        return x + noise, keys

    x = arange(8, 4)
    with mesh_ctx(*MESH_2D) as mesh:
        want = jax.jit(f)(3, x)
        got = pjit(f, (None, P("a")), (P("a"), P("a")))(3, x)
        assert_close(got[0], want[0])
        _same_keys(got[1], want[1])
        _laid_out(got[1], mesh, P("a"))
        eager = with_sharding_constraint(jax.random.split(jax.random.key(1), 8), P("b"))
        _laid_out(eager, mesh, P("b"))


def test_donated_keys(dispatch_path) -> None:
    def advance(ks: Any) -> Any:
        return jax.vmap(lambda k: jax.random.split(k)[0])(ks)

    with mesh_ctx(*MESH_2D) as mesh:
        keys = jax.device_put(jax.random.split(jax.random.key(0), 8), NamedSharding(mesh, P("a")))
        want = jax.jit(advance)(keys)
        f = pjit(advance, P("a"), P("a"), donate_argnums=0)
        got = f(keys)
        _same_keys(got, want)
        assert keys.is_deleted()
        with pytest.raises(RuntimeError, match="deleted"):
            f(keys)


def test_grad_of_a_function_taking_a_key() -> None:
    def loss(w: Any, key: Any) -> Any:
        return jnp.sum(jnp.sin(w) * jax.random.normal(key, w.shape))

    w, key = arange(8, 4), jax.random.key(7)
    want = jax.jit(jax.grad(loss))(w, key)
    with mesh_ctx(*MESH_2D) as mesh:
        grad = jax.grad(pjit(loss, (P("a"), None), None))
        for run in (grad, jax.jit(grad)):  # eagerly, and inside jax.jit with numpy w
            got = run(w, key)
            assert_close(got, want)
            _laid_out(got, mesh, P("a"))


def test_vmap_over_a_key_batch() -> None:
    def draw(k: Any) -> Any:
        return jax.random.normal(k, (8,))

    keys = jax.random.split(jax.random.key(2), 4)
    want = jax.vmap(draw)(keys)
    with mesh_ctx(*MESH_2D) as mesh:
        got = jax.vmap(pjit(draw, None, P("a")))(keys)
        assert_close(got, want)
        _laid_out(got, mesh, P(None, "a"))


def test_lower_with_a_key_shape_dtype_struct() -> None:
    key = jax.random.key(0)

    def draw(k: Any) -> Any:
        return jax.random.normal(k, (8,))

    with mesh_ctx(*MESH_2D):
        lowered = pjit(draw, None, P("a")).lower(jax.ShapeDtypeStruct((), key.dtype))
        assert "tensor<2xui32>" in lowered.as_text()  # the key's physical form
        compiled = lowered.compile()
        assert_close(compiled(key), jax.jit(draw)(key))


def test_key_annotation_covers_the_physical_shape() -> None:
    with mesh_ctx(*MESH_2D), partitioner.spmd_partitioner("gspmd"):
        text = (
            pjit(lambda k: jax.random.split(k, 8), None, P("a")).lower(jax.random.key(0)).as_text()
        )
    # u32[8, 2]: split over "a" (4), trailing key dim whole, "b" replicated.
    assert "devices=[4,1,2]" in text and "last_tile_dim_replicate" in text
