"""The AUTO cost model on its own: moves between layouts, candidates, and one pass
over a jaxpr, each checked against XLA's compiled program or by hand.

NOTE [auto layouts] counts collectives as the report's table does (operand bytes on
one device), so for layouts where XLA's choice is unambiguous the model's bytes must
equal XLA's exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from benchmarks import models
from partitioner import PartitionSpec as P
from partitioner._testing import AutoEstimator, auto_candidates, auto_moves
from partitioner.testing.plugin import MeshFactory

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

SIZES = {"data": 4, "model": 2}
ORDER = ("data", "model")


SUM_DATA, SUM_MODEL = ("add", ("data",)), ("add", ("model",))


@pytest.mark.parametrize(
    ("src", "partial", "dst", "want"),
    [
        # whole -> split: a local slice, nothing moves
        (((), ()), frozenset(), (("data",), ()), []),
        # split -> whole: one all-gather of the local block (64x32/4 floats)
        ((("data",), ()), frozenset(), ((), ()), [("all-gather", 4, 64 * 32 // 4 * 4, None)]),
        # a partial sum kept whole: all-reduce of the full block, which XLA's all-reduce
        # combiner may merge with other sums over "model" (NOTE [all-reduce combiner])
        (((), ()), frozenset({"model"}), ((), ()), [("all-reduce", 2, 64 * 32 * 4, SUM_MODEL)]),
        # a partial sum the target splits over that axis: reduce-scatter (an all-reduce
        # on XLA:CPU, merged alike)
        (
            ((), ()),
            frozenset({"model"}),
            ((), ("model",)),
            [("reduce-scatter", 2, 64 * 32 * 4, SUM_MODEL)],
        ),
        # an axis changing dimension: one all-to-all of the local block
        (
            (("model",), ()),
            frozenset(),
            ((), ("model",)),
            [("all-to-all", 2, 64 * 32 // 2 * 4, None)],
        ),
        # both axes gathered from one dimension: one all-gather over 8 devices
        (
            (("data", "model"), ()),
            frozenset(),
            ((), ()),
            [("all-gather", 8, 64 * 32 // 8 * 4, None)],
        ),
        # ... from two: one all-gather per dimension, the minor first, the second
        # gathering the block the first made (NOTE [one dimension per collective])
        (
            (("data",), ("model",)),
            frozenset(),
            ((), ()),
            [("all-gather", 2, 64 * 32 // 8 * 4, None), ("all-gather", 4, 64 * 32 // 4 * 4, None)],
        ),
        # a partial sum over both axes scattered over two dimensions: the whole block
        # all-reduced once per dimension (XLA:CPU's reduce-scatter), then sliced
        (
            ((), ()),
            frozenset({"data", "model"}),
            (("data",), ("model",)),
            [
                ("reduce-scatter", 4, 64 * 32 * 4, SUM_DATA),
                ("reduce-scatter", 2, 64 * 32 * 4, SUM_MODEL),
            ],
        ),
        # a partial sum over both axes, split over one: scattered first, so the all-reduce
        # over the other moves the scattered block (as XLA orders them)
        (
            ((), ()),
            frozenset({"data", "model"}),
            (("data",), ()),
            [
                ("reduce-scatter", 4, 64 * 32 * 4, SUM_DATA),
                ("all-reduce", 2, 64 * 32 // 4 * 4, SUM_MODEL),
            ],
        ),
    ],
)
def test_moves_between_layouts(src, partial, dst, want):
    assert list(auto_moves((64, 32), 4, src, partial, dst, SIZES)) == want


def test_candidates_split_evenly_and_start_replicated():
    found = auto_candidates((8, 6), ORDER, SIZES, ORDER)
    assert found[0] == ((), ())
    assert len(found) == len(set(found))
    for layout in found:
        for n, axes in zip((8, 6), layout, strict=True):
            assert n % math.prod(SIZES[a] for a in axes) == 0
    # 6 does not split over data (4); 8 takes data, model or both
    assert (("data", "model"), ()) in found and ((), ("data",)) not in found
    # a mesh axis that is not free is never used
    assert all(
        "data" not in d for lay in auto_candidates((8, 6), ORDER, SIZES, ("model",)) for d in lay
    )


def _mlp_step(p, batch):
    def loss(p):
        x, y = batch
        return jnp.mean((models.mlp(p, x) - y) ** 2)

    return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p))


def _layout(spec, ndim):
    dims = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    return tuple(dims + [()] * (ndim - len(dims)))


@pytest.mark.parametrize(
    "specs",
    [
        {"b1": P("model"), "w1": P(None, "model"), "w2": P("model", None)},  # Megatron
        {"b1": P(), "w1": P(), "w2": P()},  # data parallel
    ],
    ids=["megatron", "replicated"],
)
def test_estimated_collective_bytes_equal_xlas(specs, mesh: MeshFactory):
    """For the textbook layouts of an MLP train step the model's collectives are XLA's."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "b1": jnp.zeros((512,)),
        "w1": jax.random.normal(k1, (128, 512)),
        "w2": jax.random.normal(k2, (512, 128)),
    }
    x = jax.random.normal(k3, (512, 128))
    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(
        _mlp_step, in_axis_resources=(specs, (P("data"), P("data"))), out_axis_resources=specs
    )
    with jax.set_mesh(m):
        report = f.lower(params, (x, x)).report()
    measured = report.collective_bytes
    jaxpr = jax.make_jaxpr(_mlp_step)(params, (x, x))
    ins = [_layout(specs[k], params[k].ndim) for k in sorted(params)] + [(("data",), ())] * 2
    estimate, outs = AutoEstimator(jaxpr, SIZES).run(ins, ins[:3], [False] * 5)
    assert estimate.collective_bytes == measured
    assert outs == ins[:3]
    # the model's memory is within a quarter of XLA's (it cannot see XLA's fusion decisions)
    assert abs(estimate.memory_bytes - report.memory.total) <= 0.25 * report.memory.total


@pytest.mark.parametrize(
    ("w_spec", "w_layout"),
    [(P("model", None), (("model",), ())), (P(None, "model"), ((), ("model",)))],
    ids=["contracting-split", "column-split"],
)
def test_a_scan_body_counts_once_per_iteration(w_spec, w_layout, mesh: MeshFactory):
    """A collective in a scan body runs ``length`` times, in the model as in XLA's program."""

    def body(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=4)[0]

    w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(body, in_axis_resources=(w_spec, P("data")), out_axis_resources=P("data"))
    with jax.set_mesh(m):
        report = f.lower(w, x).report()
    in_loop = [c for c in report.collectives if c.count == 4]
    estimate, _ = AutoEstimator(jax.make_jaxpr(body)(w, x), SIZES).run(
        [w_layout, (("data",), ())], [(("data",), ())], [False, False]
    )
    assert estimate.collectives == sum(c.count for c in in_loop) == 4
    assert estimate.collective_bytes == sum(c.bytes_per_run for c in in_loop)


# --- the layers' strategies against XLA (the layers models are made of) ---


def _conv(x, k):
    return jax.lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


_EMB, _IDS, _UPD = jnp.ones((128, 16)), jnp.zeros((8, 6), jnp.int32), jnp.ones((8, 6, 16))
_IMG, _KER, _X = jnp.ones((8, 16, 16, 8)), jnp.ones((3, 3, 8, 16)), jnp.ones((16, 64))
_W = jnp.ones((64, 32))


def _scatter_add(e, i, g):
    return jnp.zeros_like(e).at[i].add(g)


@pytest.mark.parametrize(
    ("fun", "args", "in_specs", "out_spec"),
    [
        # an embedding lookup from a table split over the vocabulary: a partial sum
        (lambda e, i: e[i], (_EMB, _IDS), (P("model"), P("data")), P("data")),
        # ... over its features: the lookup's features split alike, nothing moves
        (lambda e, i: e[i], (_EMB, _IDS), (P(None, "model"), P("data")), P("data", None, "model")),
        # its gradient, updates split over the batch: a partial sum of the whole table
        (_scatter_add, (_EMB, _IDS, _UPD), (P(), P("data"), P("data")), P()),
        # ... the table split over the vocabulary, updates whole: each device its rows
        (_scatter_add, (_EMB, _IDS, _UPD), (P("model"), P(), P()), P("model")),
        # ... over the features
        (_scatter_add, (_EMB, _IDS, _UPD), (P(None, "model"), P("data"), P("data", None, "model")),
         P(None, "model")),
        # a dynamic slice of a split dimension gathers it; a dynamic update leaves it split
        (lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 4, 1), (_X, jnp.int32(3)),
         (P(None, "model"), P()), P()),
        (lambda x, i: jax.lax.dynamic_update_slice_in_dim(x, jnp.ones((16, 1)), i, 1),
         (_X, jnp.int32(3)), (P(None, "model"), P()), P(None, "model")),
        # convolutions: batch, output-feature and input-feature (a partial sum) splits
        (_conv, (_IMG, _KER), (P("data"), P()), P("data")),
        (_conv, (_IMG, _KER), (P("data"), P(None, None, None, "model")),
         P("data", None, None, "model")),
        (_conv, (_IMG, _KER), (P("data", None, None, "model"), P(None, None, "model")), P("data")),
        # the kernel's gradient under data parallelism: an all-reduce over "data"
        (jax.grad(lambda k, x: _conv(x, k).sum()), (_KER, _IMG), (P(), P("data")), P()),
        # pooling windows that tile each block keep it split
        (_pool, (_IMG,), (P("data"),), P("data")),
        (_pool, (_IMG,), (P(None, "model"),), P(None, "model")),
        # a cumulative sum along a split dimension gathers it
        (lambda x: jnp.cumsum(x, 1), (_X,), (P(None, "model"),), P(None, "model")),
        # a sort moves the axis to another dimension and back (two all-to-alls)
        (lambda x: jnp.sort(x, 1), (_X,), (P(None, "model"),), P(None, "model")),
        # top-k gathers its operand whole, whichever dimension is split
        (lambda x: jax.lax.top_k(x, 4)[0], (_X,), (P("data"),), P("data")),
        # a value split over two dimensions gathered: one all-gather per dimension, and
        # a sum over both axes scattered over two dimensions: one all-reduce per
        # dimension (NOTE [one dimension per collective])
        (lambda x: x * 2.0, (_X,), (P("data", "model"),), P()),
        (lambda h, w: h @ w, (_X, _W), (P(None, ("data", "model")), P(("data", "model"))),
         P("data", "model")),
    ],
    ids=[
        "gather-vocab", "gather-features", "scatter-add-batch", "scatter-add-vocab",
        "scatter-add-features", "dynamic-slice", "dynamic-update-slice", "conv-batch",
        "conv-out-features", "conv-in-features", "conv-kernel-grad", "pool-batch",
        "pool-height", "cumsum", "sort", "top-k", "gather-two-dims", "sum-scattered-two-dims",
    ],
)  # fmt: skip
def test_layer_strategies_move_the_bytes_xla_moves(
    fun, args, in_specs, out_spec, mesh: MeshFactory
):
    """Where XLA's choice is unambiguous the model's collectives are XLA's: no layer
    the model knows falls back to gathering its operands."""
    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(fun, in_axis_resources=in_specs, out_axis_resources=out_spec)
    with jax.set_mesh(m):
        report = f.lower(*args).report()
    measured = report.collective_bytes
    jaxpr = jax.make_jaxpr(fun)(*args)
    ins = [_layout(s, jnp.ndim(a)) for s, a in zip(in_specs, args, strict=True)]
    out = _layout(out_spec, len(jaxpr.out_avals[0].shape))
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(ins, [out], [False] * len(args))
    assert estimate.collective_bytes == measured, str(report)


def test_a_residual_add_keeps_the_split_of_its_split_operand(mesh: MeshFactory):
    """``x + f(x)`` with ``f(x)`` a partial sum: the sum is reduced to ``x``'s layout, as
    XLA does, not ``x`` gathered to the sum's (NOTE [elementwise keeps the split]): a
    gathered residual would leave every later layer of a stack working on the whole
    batch. The bytes are XLA's."""
    x, h, w = jnp.ones((8, 16, 128)), jnp.ones((8, 16, 512)), jnp.ones((512, 128))
    in_specs = (P("data"), P(None, None, ("data", "model")), P(("data", "model")))

    def residual(x, h, w):
        return x + h @ w

    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(residual, in_axis_resources=in_specs, out_axis_resources=P("data"))
    with jax.set_mesh(m):
        report = f.lower(x, h, w).report()
    measured = report.collective_bytes
    jaxpr = jax.make_jaxpr(residual)(x, h, w)
    ins = [_layout(s, jnp.ndim(a)) for s, a in zip(in_specs, (x, h, w), strict=True)]
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(ins, [ins[0]], [False] * 3)
    assert estimate.collective_bytes == measured, str(report)
    _, (arrived,) = AutoEstimator(jaxpr, SIZES).run(ins, [None], [False] * 3)
    assert arrived == ins[0]


def _stacked_mlp_step(layers, x):
    def loss(layers):
        h = x
        for p in layers:
            h = jnp.tanh(h @ p["w1"]) @ p["w2"]
        return jnp.mean(h**2)

    return jax.tree.map(lambda a, g: a - 0.1 * g, layers, jax.grad(loss)(layers))


def test_the_walk_replays_what_an_assignment_does_not_change():
    """NOTE [auto walk memo]: one estimator scoring many assignments gives each the
    estimate a fresh one gives it, and works out one layer for its equal copies."""
    k = jax.random.split(jax.random.key(0), 8)
    layers = [{"w1": jax.random.normal(k[i], (32, 64)), "w2": jax.random.normal(k[i + 4], (64, 32))}
              for i in range(4)]  # fmt: skip
    x = jax.random.normal(k[0], (16, 32))
    jaxpr = jax.make_jaxpr(_stacked_mlp_step)(layers, x)
    options = {2: auto_candidates((32, 64), ORDER, SIZES, ORDER),
               3: auto_candidates((64, 32), ORDER, SIZES, ORDER)}  # fmt: skip
    rng = np.random.default_rng(0)
    shared = AutoEstimator(jaxpr, SIZES)
    for _ in range(12):
        ins = [options[2][rng.integers(len(options[2]))] if i % 2 == 0
               else options[3][rng.integers(len(options[3]))] for i in range(8)]  # fmt: skip
        ins.append((("data",), ()))
        args = (ins, ins[:8], [False] * 9)
        assert shared.run(*args) == AutoEstimator(jaxpr, SIZES).run(*args)
    one = AutoEstimator(jaxpr, SIZES)
    same = [options[2][1], options[3][1]] * 4 + [(("data",), ())]
    one.run(same, same[:8], [False] * 9)
    # four equal layers: the rules ran for about one of them
    assert one.applied < len(jaxpr.jaxpr.eqns) / 2


def test_a_while_counting_to_a_literal_bound_counts_its_trips(mesh: MeshFactory):
    """A ``while`` counting ``i`` from a literal to a literal bound runs its body that many
    times, in the model as in XLA's program (``known_trip_count``)."""

    def body(w, x):
        def step(c):
            i, x = c
            return i + 1, jnp.tanh(x @ w)

        return jax.lax.while_loop(lambda c: c[0] < 3, step, (0, x))[1]

    w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(
        body, in_axis_resources=(P("model", None), P("data")), out_axis_resources=P("data")
    )
    with jax.set_mesh(m):
        report = f.lower(w, x).report()
    in_loop = [c for c in report.collectives if c.count == 3]
    estimate, _ = AutoEstimator(jax.make_jaxpr(body)(w, x), SIZES).run(
        [(("model",), ()), (("data",), ())], [(("data",), ())], [False, False]
    )
    assert estimate.collectives == sum(c.count for c in in_loop) == 3
    assert estimate.collective_bytes == sum(c.bytes_per_run for c in in_loop)


def test_a_partial_sum_reduced_once_is_read_again_as_reduced(mesh: MeshFactory):
    """A partial sum two elementwise operations read: the first reduces it to the batch's
    split; the second, whose other operand is whole (a scale), reads that copy, as XLA
    does, rather than reducing the sum again over every axis (NOTE [elementwise reads a
    copy]). The bytes are XLA's."""
    h, w, x, s = jnp.ones((8, 16, 64)), jnp.ones((64, 128)), jnp.ones((8, 16, 128)), jnp.ones(128)
    both = ("data", "model")  # the contraction split over both axes: a sum over both
    in_specs = (P(None, None, both), P(both), P("data"), P())

    def twice(h, w, x, s):
        partial = h @ w
        return partial * x + partial * s

    m = mesh((4, 2), ORDER)
    f = partitioner.pjit(twice, in_axis_resources=in_specs, out_axis_resources=P("data"))
    with jax.set_mesh(m):
        report = f.lower(h, w, x, s).report()
    jaxpr = jax.make_jaxpr(twice)(h, w, x, s)
    ins = [_layout(spec, jnp.ndim(a)) for spec, a in zip(in_specs, (h, w, x, s), strict=True)]
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(ins, [ins[2]], [False] * 4)
    assert estimate.collective_bytes == report.collective_bytes, str(report)


def test_an_open_dimension_of_a_constraint_keeps_its_split(mesh: MeshFactory):
    """A constraint's UNCONSTRAINED dimension keeps the split its operand has there, as
    XLA's partitioners propagate through it: a stacked weight split over 'model' on its
    features and constrained over 'data' on its layer dimension alone (a pipeline's
    staging) moves nothing, where gathering the open dimension would move the weight."""
    w = jnp.ones((8, 64, 32))
    in_spec = P(None, None, "model")

    def staged(w):
        free = partitioner.UNCONSTRAINED
        return partitioner.with_sharding_constraint(w, P("data", free, free)) * 2

    m = mesh((4, 2), ORDER)
    out_spec = P("data", None, "model")
    f = partitioner.pjit(staged, in_axis_resources=in_spec, out_axis_resources=out_spec)
    with jax.set_mesh(m):
        report = f.lower(w).report()
        jaxpr = jax.make_jaxpr(staged)(w)
    estimate, _ = AutoEstimator(jaxpr, SIZES).run(
        [_layout(in_spec, 3)], [_layout(out_spec, 3)], [False]
    )
    assert estimate.collective_bytes == report.collective_bytes == 0, str(report)
