"""Moves XLA can only make by replicating a value (NOTE [involuntary rematerialization]): the
cost model's rule against XLA's own warning, their price, and a search that prints none of
XLA's warnings about layouts it only measured (NOTE [trial compiles' warnings])."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.auto.cost.layouts import REMATERIALIZE, involuntary, moves

SIZES = {"data": 4, "model": 2}
D, M, DM = ("data",), ("model",), ("data", "model")

#: Moves of a value [16, 32, 64] over the 4x2 mesh: the ones XLA replicates for (True)
#: and neighbours it makes with collectives (False), as observed on jax 0.10.2.
CASES = [
    (((), (), DM), ((), D, ()), True),  # part of a dimension's tiles dropped, the rest moved
    ((DM, (), ()), ((), D, M), True),  # one dimension's tiles split over two
    ((D, M, ()), ((), (), DM), True),  # two dimensions' tiles merged into one
    ((D, (), ()), ((), M, ()), True),  # nothing carried over: a gather and a slice
    ((M, (), ()), ((), (), D), True),
    ((DM, (), ()), ((), DM, ()), False),  # one all-to-all, whole
    ((D, M, ()), ((), (), D), False),  # one dimension gathered, one moved whole
    ((D, (), ()), ((), DM, ()), False),  # moved whole, then sliced further
    ((D, (), ()), ((), M, D), False),
    ((D, M, ()), ((), D, ()), False),  # a tiled dimension kept
    ((DM, (), ()), (M, D, ()), False),
    (((), D, M), (D, (), ()), False),
]


def _spec(layout) -> P:
    return P(*[(axes if len(axes) > 1 else axes[0]) if axes else None for axes in layout])


@pytest.mark.parametrize(("src", "dst", "replicated"), CASES)
def test_the_rule_is_xlas(mesh, capfd, src, dst, replicated) -> None:
    m = mesh((4, 2), ("data", "model"))
    x = jnp.ones((16, 32, 64))
    out = NamedSharding(m, _spec(dst))
    f = jax.jit(
        lambda v: jax.lax.with_sharding_constraint(v * 2, out) + 1,
        in_shardings=NamedSharding(m, _spec(src)),
        out_shardings=out,
    )
    capfd.readouterr()
    f.lower(x).compile()
    warned = "Involuntary full rematerialization" in capfd.readouterr().err
    assert warned == replicated, "XLA disagrees with the case's label"
    assert involuntary([list(axes) for axes in src], dst) == replicated


def test_a_replication_is_priced_as_gathering_the_whole_value() -> None:
    src, dst = (D, M, ()), ((), (), DM)
    steps = list(moves((16, 32, 64), 4, src, frozenset(), dst, SIZES))
    block = 16 * 32 * 64 * 4 / 8
    assert steps == [(REMATERIALIZE, 8, block, None)]
    # a neighbour XLA makes with collectives keeps its price
    steps = list(moves((16, 32, 64), 4, (D, M, ()), frozenset(), ((), (), D), SIZES))
    assert [step[0] for step in steps] == ["all-to-all", "all-gather"]


def test_a_search_prints_none_of_xlas_warnings_about_layouts_it_only_measured(
    mesh_4x2, capfd
) -> None:
    """Eight unrolled MLP blocks: the search measures a layout XLA compiles by
    replicating a value; XLA's warning stays out of stderr (the choice's own would not)."""
    rng = np.random.default_rng(0)
    layers = [
        {
            "w1": rng.normal(size=(128, 512)).astype(np.float32) / 11,
            "w2": rng.normal(size=(512, 128)).astype(np.float32) / 22,
        }
        for _ in range(8)
    ]
    x = rng.normal(size=(256, 128)).astype(np.float32)

    def loss(params, x):
        for p in params:
            x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        return jnp.mean(x**2)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda a, b: a - 0.01 * b, params, grads)

    partitioner.clear_caches()
    f = partitioner.pjit(step, (AUTO, P("data")), AUTO)
    capfd.readouterr()
    with jax.set_mesh(mesh_4x2):
        ours = f(layers, x)
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    want = jax.jit(step)(layers, x)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
