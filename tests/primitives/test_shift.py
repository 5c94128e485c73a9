"""``shift`` (``primitives/shift.py``): ``jnp.roll``'s values under every transformation, and
one collective-permute each way where ``jnp.roll``'s derived transpose costs two."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner._testing import shift

X = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) / 10
WEIGHTS = np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6)


def ours(x, by=1, axis=0):
    return jnp.sum(jnp.sin(shift(x, by=by, axis=axis)) * WEIGHTS)


def theirs(x, by=1, axis=0):
    return jnp.sum(jnp.sin(jnp.roll(x, by, axis=axis)) * WEIGHTS)


@pytest.mark.parametrize(("by", "axis"), [(1, 0), (-1, 0), (2, 1), (7, 0)])
def test_values_gradients_and_tangents_are_jnp_rolls(by, axis) -> None:
    np.testing.assert_array_equal(shift(X, by=by, axis=axis), jnp.roll(X, by, axis=axis))
    np.testing.assert_allclose(
        jax.grad(ours)(X, by, axis), jax.grad(theirs)(X, by, axis), rtol=1e-6
    )
    t = np.ones_like(X)
    np.testing.assert_allclose(
        jax.jvp(lambda v: ours(v, by, axis), (X,), (t,))[1],
        jax.jvp(lambda v: theirs(v, by, axis), (X,), (t,))[1],
        rtol=1e-6,
    )


def test_hessians_and_vmaps_are_jnp_rolls() -> None:
    flat = X.ravel()
    np.testing.assert_allclose(
        jax.hessian(lambda v: ours(v.reshape(8, 6)))(flat),
        jax.hessian(lambda v: theirs(v.reshape(8, 6)))(flat),
        rtol=1e-5,
        atol=1e-6,
    )
    batch = np.stack([X, X + 1, X * 2])
    for in_axes in (0, 1, 2):
        moved = np.moveaxis(batch, 0, in_axes)
        np.testing.assert_allclose(
            jax.vmap(jax.grad(ours), in_axes=in_axes)(moved),
            jax.vmap(jax.grad(theirs), in_axes=in_axes)(moved),
            rtol=1e-6,
        )


def test_one_permute_each_way_over_a_split_dimension(mesh) -> None:
    """A shift in a loop, differentiated, over an array split on two axes (a pipeline's
    activations, ``[stages, shards, ...]``): one collective-permute in the forward loop
    and one in the backward loop, where jnp.roll's derived transpose costs two."""
    m = mesh((4, 2), ("stage", "data"))
    layout = NamedSharding(m, P("stage", "data"))
    x = np.linspace(-1, 1, 4 * 2 * 8 * 6, dtype=np.float32).reshape(4, 2, 8, 6)

    def looped(roll):
        def f(x):
            def step(h, _):
                h = partitioner.with_sharding_constraint(jnp.tanh(roll(h)), layout)
                return h, None

            return jnp.sum(jax.lax.scan(step, x, None, length=3)[0] * x)

        return f

    counts = {}
    for name, roll in (
        ("shift", lambda h: shift(h, by=1, axis=0)),
        ("roll", lambda h: jnp.roll(h, 1, axis=0)),
    ):
        f = partitioner.jit(jax.grad(looped(roll)), in_shardings=layout)
        report = f.lower(x).compile().report()
        counts[name] = sum(c.count for c in report.collectives if c.kind == "collective-permute")
        np.testing.assert_allclose(f(x), jax.jit(jax.grad(looped(roll)))(x), rtol=1e-5)
    assert counts == {"shift": 2 * 3, "roll": 3 * 3}, counts
