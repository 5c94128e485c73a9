"""XLA's all-reduce combiner in the AUTO cost model (NOTE [all-reduce combiner] in
``partitioner/_src/auto/cost/combiner.py``).

XLA:CPU merges all-reduces that do not depend on each other, over the same devices
with the same reduction, into one. The model counts a computation's all-reduces per
group (reduction, mesh axes) as the deepest chain of them: on these programs its count
is XLA's, and the count decides which layout is faster where collectives are many and
small.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from benchmarks import models
from partitioner import PartitionSpec as P
from partitioner._src.auto.cost import rates
from partitioner._testing import AutoEstimator, auto_candidates
from partitioner.testing.plugin import MeshFactory

pytestmark = pytest.mark.slow

SIZES = {"data": 4, "model": 2}
ORDER = ("data", "model")
LAYERS, WIDTH, BATCH = 8, 16, 64


def _layout(spec, ndim):
    dims = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    return tuple(dims + [()] * (ndim - len(dims)))


def _xla(mesh, fun, in_specs, out_specs, *args):
    """XLA's report of ``fun`` laid out so, compiled."""
    f = partitioner.pjit(fun, in_axis_resources=in_specs, out_axis_resources=out_specs)
    with jax.set_mesh(mesh):
        report = f.lower(*args).compile().report()
    return report


def _estimate(fun, in_specs, out_specs, *args):
    jaxpr = jax.make_jaxpr(fun)(*args)
    flat_in = jax.tree.leaves(in_specs, is_leaf=lambda x: isinstance(x, P))
    flat_out = jax.tree.leaves(out_specs, is_leaf=lambda x: isinstance(x, P))
    ins = [_layout(s, jnp.ndim(a)) for s, a in zip(flat_in, jax.tree.leaves(args), strict=True)]
    outs = [_layout(s, len(v.shape)) for s, v in zip(flat_out, jaxpr.out_avals, strict=True)]
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(ins, outs, [False] * len(ins))
    return estimate


# --- what the combiner merges, in the model as in XLA's program ---


def _deep_mlp_step(ws, x):
    """``LAYERS`` tanh layers in a row, trained: each weight's gradient is its own
    all-reduce over the batch's axis, none reads another's."""

    def loss(ws):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    return [w - 0.1 * g for w, g in zip(ws, jax.grad(loss)(ws), strict=True)]


def _deep_mlp_args():
    keys = jax.random.split(jax.random.key(0), LAYERS + 1)
    ws = [jax.random.normal(k, (WIDTH, WIDTH)) / 4 for k in keys[:-1]]
    return ws, jax.random.normal(keys[-1], (BATCH, WIDTH))


def _two_reductions(x):
    """A sum and a maximum over the same split dimension: two reductions, not merged."""
    return jnp.sum(x, axis=1), jnp.max(x, axis=1)


def _two_axes(a, b):
    """Two sums, one over "data", one over "model": two groups, not merged."""
    return a @ a.T, b @ b.T


def _chain(x):
    """Sums over a split dimension, each reading the one before: dependent, not merged."""
    for _ in range(3):
        x = x * jnp.sum(x, axis=1, keepdims=True)
    return x


_X = jnp.ones((16, 64)) / 64

PROGRAMS = {
    # eight gradients over "data", independent: one all-reduce of eight operands
    "gradients": (_deep_mlp_step, ([P()] * LAYERS, P("data")), [P()] * LAYERS),
    # a sum and a max over "model"
    "sum-and-max": (_two_reductions, (P(None, "model"),), (P(), P())),
    # one sum over "data", one over "model"
    "two-axes": (_two_axes, (P(None, "data"), P(None, "model")), (P(), P())),
    # three sums over "model", each reading the one before
    "chain": (_chain, (P(None, "model"),), P(None, "model")),
}


def _args(name):
    if name == "gradients":
        return _deep_mlp_args()
    if name == "sum-and-max":
        return (_X,)
    if name == "two-axes":
        return (jnp.ones((16, 64)), jnp.ones((16, 64)))
    return (_X,)


@pytest.mark.parametrize(
    ("name", "combined"),
    [("gradients", 1), ("sum-and-max", 2), ("two-axes", 2), ("chain", 3)],
)
def test_the_model_counts_the_all_reduces_xla_runs(name, combined, mesh: MeshFactory):
    """Independent all-reduces of one group merge (eight gradients, one all-reduce);
    different reductions, different axes and a chain do not. The model's count of
    collectives is XLA's, and so are its bytes."""
    fun, in_specs, out_specs = PROGRAMS[name]
    args = _args(name)
    report = _xla(mesh((4, 2), ORDER), fun, in_specs, out_specs, *args)
    reduces = [c for c in report.collectives if c.kind == "all-reduce"]
    assert sum(c.count for c in reduces) == combined, str(report)
    estimate = _estimate(fun, in_specs, out_specs, *args)
    assert estimate.collectives == sum(c.count for c in report.collectives), str(report)
    assert estimate.collective_bytes == report.collective_bytes


@pytest.mark.parametrize(
    "specs",
    [
        {"b1": P("model"), "w1": P(None, "model"), "w2": P("model", None)},  # Megatron
        {"b1": P(), "w1": P(), "w2": P()},  # data parallel
    ],
    ids=["megatron", "replicated"],
)
def test_an_mlp_train_step_runs_the_collectives_the_model_counts(specs, mesh: MeshFactory):
    """The data-parallel step's three gradients are one all-reduce in XLA's program, and
    one in the model's count."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"b1": jnp.zeros((512,)), "w1": jax.random.normal(k1, (128, 512)),
              "w2": jax.random.normal(k2, (512, 128))}  # fmt: skip
    x = jax.random.normal(k3, (512, 128))

    def step(p, batch):
        def loss(p):
            return jnp.mean((models.mlp(p, batch[0]) - batch[1]) ** 2)

        return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p))

    in_specs, out_specs = (specs, (P("data"), P("data"))), specs
    report = _xla(mesh((4, 2), ORDER), step, in_specs, out_specs, params, (x, x))
    estimate = _estimate(step, in_specs, out_specs, params, (x, x))
    assert estimate.collectives == sum(c.count for c in report.collectives), str(report)


# --- the count decides ---


def test_merged_gradients_make_data_parallelism_the_faster_layout(mesh: MeshFactory):
    """Eight small layers trained on a batch split over "data": data parallelism
    reduces eight gradients, which XLA merges into one all-reduce; replicating the
    batch too runs no collective and computes four times over. Counting eight
    all-reduces (16 us at the model's latency) the model ranked replication faster;
    counting the one XLA runs, data parallelism, which XLA's figures (its count and
    bytes at the model's rates, the model's compute) rank faster too."""
    m = mesh((4, 2), ORDER)
    ws, x = _deep_mlp_args()
    parallel = ([P()] * LAYERS, P("data"))
    replicated = ([P()] * LAYERS, P())
    ours = _estimate(_deep_mlp_step, parallel, [P()] * LAYERS, ws, x)
    theirs = _estimate(_deep_mlp_step, replicated, [P()] * LAYERS, ws, x)
    assert ours.time_s < theirs.time_s, (ours, theirs)

    # XLA agrees: the same order with its count and bytes in place of the model's
    def on_xla(estimate, specs):
        report = _xla(m, _deep_mlp_step, specs, [P()] * LAYERS, ws, x)
        count = sum(c.count for c in report.collectives)
        return estimate.compute_s + rates.seconds(0.0, report.collective_bytes, count)

    assert on_xla(ours, parallel) < on_xla(theirs, replicated)


def test_the_walk_replays_levels_exactly():
    """NOTE [auto walk memo]: an equation's levels are kept relative to its operands',
    so a walk that replays them counts what a fresh one works out, on blocks whose
    backward pass joins values of different depths (the weights' gradients read the
    forward pass's activations and the backward pass's)."""
    dims = models.Dims(batch=8, seq=16, model=32, ff=64)
    layers = [models.block_params(dims, jax.random.key(i)) for i in range(2)]
    batch = models.block_batch(dims)

    def step(layers, batch):
        def loss(layers):
            x = batch[0]
            for p in layers:
                x = models.block(p, x)
            return jnp.mean((x - batch[1]) ** 2)

        return jax.tree.map(lambda a, g: a - 0.1 * g, layers, jax.grad(loss)(layers))

    jaxpr = jax.make_jaxpr(step)(layers, batch)
    shapes = [leaf.shape for leaf in jax.tree.leaves(layers)]
    options = [auto_candidates(shape, ORDER, SIZES, ORDER) for shape in shapes]
    rng = np.random.default_rng(0)
    shared = AutoEstimator(jaxpr, SIZES)
    for _ in range(10):
        ins = [opts[rng.integers(len(opts))] for opts in options] + [(("data",), (), ())] * 2
        args = (ins, ins[: len(shapes)], [False] * len(ins))
        assert shared.run(*args) == AutoEstimator(jaxpr, SIZES).run(*args)


def test_a_scans_stacked_gradients_are_reduced_every_trip(mesh: MeshFactory):
    """A scan over stacked layers, trained on a batch split over "data": each trip of the
    backward loop writes its layer's gradients, partial sums over "data", into the
    stack, and XLA reduces them there, one merged all-reduce per trip (NOTE [loop
    outputs reduced per trip] in ``control.py``), not one of the whole stack after the
    loop. The model counts as many, and the same bytes."""
    ws, x = _deep_mlp_args()
    stack = {"w": jnp.stack(ws), "v": jnp.stack(ws) * 2}

    def step(stack, x):
        def loss(stack):
            def layer(h, p):
                return jnp.tanh(jnp.tanh(h @ p["w"]) @ p["v"]), None

            return jnp.mean(jax.lax.scan(layer, x, stack)[0] ** 2)

        return jax.tree.map(lambda a, g: a - 0.1 * g, stack, jax.grad(loss)(stack))

    specs = {"w": P(), "v": P()}
    report = _xla(mesh((4, 2), ORDER), step, (specs, P("data")), specs, stack, x)
    reduces = [c for c in report.collectives if c.kind == "all-reduce"]
    assert [c.count for c in reduces] == [LAYERS], str(report)
    estimate = _estimate(step, (specs, P("data")), specs, stack, x)
    assert estimate.collectives == LAYERS
    assert estimate.collective_bytes == report.collective_bytes


def test_a_branch_returning_a_constant_is_walked():
    """A branch whose result is a literal (``lax.cond`` returning a constant, as the
    pipeline's action schedules do in a step where a stage idles) has no collective
    behind it: the walk gives it no level (it raised on the unhashable literal)."""

    def step(w, x):
        def loss(w):
            h = x @ w
            return jax.lax.cond(x[0, 0] > 0, lambda h: 1.0, lambda h: jnp.sum(h**2), h)

        return w - 0.1 * jax.grad(loss)(w)

    w, x = jnp.ones((WIDTH, WIDTH)), jnp.ones((BATCH, WIDTH))
    jaxpr = jax.make_jaxpr(step)(w, x)
    ins = [_layout(P(None, "model"), 2), _layout(P("data"), 2)]
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(ins, ins[:1], [False, False])
    assert estimate.collectives >= 1  # the batch's gradient is reduced over "data"
