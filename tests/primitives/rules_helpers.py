"""Shared helpers for the transformation-rule suite (``test_rules_*.py``).

Every numeric check compares a transformation of a pjit-ed function with the
same transformation of the *same plain function* under ``jax.jit``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.extend
import numpy as np
from jax.sharding import Mesh, NamedSharding

from partitioner._testing import pjit_p, sharding_constraint_p

#: Tolerances for float32 results computed with different reduction orders
#: (sharded vs. unsharded dots and sums). Values are O(1).
RTOL = 2e-5
ATOL = 2e-5


def assert_tree_close(
    got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL, *, scale_atol: bool = False
) -> None:
    """Leaf-by-leaf comparison (same tree, shapes and dtypes) after blocking on ``got``.

    ``scale_atol`` multiplies ``atol`` by the leaf's largest magnitude (at least 1),
    for randomly generated programs whose values are not O(1).
    """
    got = jax.block_until_ready(got)
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree, (got_tree, want_tree)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        scale = max(1.0, float(np.max(np.abs(w)))) if scale_atol and w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale)


def assert_sharded_like(x: jax.Array, mesh: Mesh, spec: Any) -> None:
    """``x`` is laid out as ``NamedSharding(mesh, spec)`` (``None`` = replicated)."""
    jspec = jax.sharding.PartitionSpec() if spec is None else spec
    if hasattr(jspec, "to_jax"):
        jspec = jspec
    want = NamedSharding(mesh, jspec)
    assert isinstance(x, jax.Array), type(x)
    assert x.sharding.is_equivalent_to(want, x.ndim), (x.sharding, want)


def iter_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs nested in its params."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from iter_eqns(sub)


def pjit_eqns(jaxpr: Any) -> list[Any]:
    return [e for e in iter_eqns(jaxpr) if e.primitive is pjit_p]


def constraint_eqns(jaxpr: Any) -> list[Any]:
    return [e for e in iter_eqns(jaxpr) if e.primitive is sharding_constraint_p]


def rand(seed: int, *shape: int) -> np.ndarray:
    """Standard-normal float32 values, deterministic per seed."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
