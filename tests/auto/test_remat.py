"""AUTO under a memory limit no layout meets: it recomputes scan bodies to fit.

The model is an activation-heavy train step: a ``lax.scan`` of 8 transformer blocks
over stacked parameters, differentiated inside the call, so the forward scan's
stacked residuals are most of what memory holds. Every figure is XLA's (memory
analysis, cost analysis); every value is compared with jax.jit's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import partitioner
from benchmarks import models
from partitioner import AUTO, NoLayoutFits
from partitioner import PartitionSpec as P
from partitioner._src.auto.remat import policies, scans
from partitioner._src.auto.search import confirm

LAYERS, BATCH_SIZE, SEQ, WIDTH, HIDDEN, HEADS = 8, 16, 32, 32, 128, 2
BATCH = (P("data"), P("data"))


def stacked_params() -> dict[str, jax.Array]:
    return models.remat_params(LAYERS, WIDTH, HIDDEN)


def block(x: jax.Array, p: dict[str, jax.Array], tag: bool = True) -> tuple[jax.Array, None]:
    """bench_auto's remat block (benchmarks/models.py) at these sizes, its MLP's hidden
    activations named ``"hidden"`` unless ``tag`` is False."""
    return models.remat_block(x, p, HEADS, "hidden" if tag else None)


def train_step(body):
    """A train step scanning ``body`` over the stacked parameters."""

    def step(params, batch):
        def loss(p, batch):
            x, y = batch
            h, _ = jax.lax.scan(body, x, p)
            return jnp.mean((h - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    return step


step = train_step(block)


def batch_of() -> tuple[jax.Array, jax.Array]:
    return models.batch((BATCH_SIZE, SEQ, WIDTH), jax.random.key(2))


def auto_step(body=block, **kw):
    return partitioner.pjit(
        train_step(body), in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P()), **kw
    )


# --- the rewrite, on jax's own traced program ---


@pytest.mark.slow
def test_each_policy_rewrite_computes_what_the_program_computes():
    params, batch = stacked_params(), batch_of()
    closed = jax.make_jaxpr(step)(params, batch)
    (found,) = scans.blocks(closed)
    assert found.length == LAYERS and found.names == ("hidden",)
    plans = policies.policies_to_try([found])
    assert [p.policies for p in plans] == [
        ("save_only_these_names:hidden",),
        ("dots_saveable",),
        ("dots_with_no_batch_dims_saveable",),
        ("nothing_saveable",),
    ]
    leaves = jax.tree.leaves((params, batch))
    expected = jax.jit(step)(params, batch)

    def stacked_bytes(c) -> int:  # what the forward scan stacks for the backward one
        eqn = c.jaxpr.eqns[found.forward]
        return sum(v.aval.size for v in eqn.outvars[eqn.params["num_carry"] :])

    for plan in plans:
        body = scans.rewrite(closed, plan)
        assert body.in_avals == closed.in_avals and body.out_avals == closed.out_avals
        assert stacked_bytes(body) < stacked_bytes(closed), plan
        got = jax.jit(lambda *a, body=body: jax.core.eval_jaxpr(body.jaxpr, body.consts, *a))(
            *leaves
        )
        for a, b in zip(got, jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_flax_nn_scan_stack_is_a_block_whose_rewrites_keep_its_values():
    """flax's ``nn.scan`` traces to a ``lax.scan``: its train step has one block, and
    every policy's rewrite computes what the step computes."""
    nn = pytest.importorskip("flax.linen")

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
            return x + nn.Dense(WIDTH)(jax.nn.gelu(nn.Dense(HIDDEN)(x))), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            layers = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True},
                             length=LAYERS)  # fmt: skip
            return layers()(x, None)[0]

    x, y = batch_of()
    params = jax.jit(Stack().init)(jax.random.key(0), x)

    def flax_step(params, x, y):
        return jax.grad(lambda p: jnp.mean((Stack().apply(p, x) - y) ** 2))(params)

    closed = jax.make_jaxpr(flax_step)(params, x, y)
    (found,) = scans.blocks(closed)
    assert found.length == LAYERS
    leaves = jax.tree.leaves((params, x, y))
    expected = jax.tree.leaves(jax.jit(flax_step)(params, x, y))
    for plan in policies.policies_to_try([found]):
        body = scans.rewrite(closed, plan)
        got = jax.jit(functools.partial(jax.core.eval_jaxpr, body.jaxpr, body.consts))(*leaves)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=str(plan.policies))


def test_a_program_without_a_differentiated_scan_has_no_block():
    def forward(params, batch):
        h, _ = jax.lax.scan(block, batch[0], params)
        return h.sum()

    assert scans.blocks(jax.make_jaxpr(forward)(stacked_params(), batch_of())) == []


def test_a_plan_that_keeps_less_recomputes_more():
    (found,) = scans.blocks(jax.make_jaxpr(step)(stacked_params(), batch_of()))
    named, dots, no_batch, nothing = policies.policies_to_try([found])
    assert nothing.recomputes_more_than(dots) and no_batch.recomputes_more_than(dots)
    assert not dots.recomputes_more_than(nothing)
    assert not nothing.recomputes_more_than(named) and not named.recomputes_more_than(dots)


# --- AUTO chooses it under the limit ---


@functools.cache
def measure_layout_only(mesh: Mesh) -> partitioner.inspect.Report:
    """XLA's memory for AUTO's plan over ``mesh`` without a limit, recomputing nothing (not
    even the element-wise work NOTE [auto scan residuals] recomputes without a limit);
    once per run, as its search and compiles are a good part of these tests' time."""
    params, batch = stacked_params(), batch_of()
    with jax.set_mesh(mesh), pytest.MonkeyPatch.context() as m:
        m.setattr(policies, "TRIM_FLOPS", -1.0)  # no plan costs fewer flops than none
        report = auto_step().lower(params, batch).report()
    partitioner.clear_caches()  # the signature's choice made so is not the one to reuse
    assert not report.auto.choice.remat and report.auto.choice.flops_added is None
    return report


@pytest.fixture
def layout_only(mesh_4x2: Mesh) -> partitioner.inspect.Report:
    return measure_layout_only(mesh_4x2)


def test_without_a_limit_a_scan_keeps_only_what_xla_keeps_of_its_unrolled_twin(
    layout_only, mesh_4x2
):
    """NOTE [auto scan residuals]: the layouts chosen without a limit, the scan's body
    under dots_saveable (the element-wise work recomputed, as XLA recomputes it in an
    unrolled stack): less memory for at most 2% more flops, and jax.jit's values."""
    params, batch = stacked_params(), batch_of()
    f = auto_step()
    with jax.set_mesh(mesh_4x2):
        report = f.lower(params, batch).report()
        ours = f(params, batch)
    choice, plain = report.auto.choice, layout_only.auto.choice
    assert choice.chosen.specs == plain.chosen.specs
    assert (
        choice.remat == ((f"scan #1 ({LAYERS} steps)", policies.TRIM),) and not choice.remat_to_fit
    )
    assert report.memory.total < 0.8 * layout_only.memory.total, (report.memory, layout_only.memory)
    assert choice.flops_added is not None
    assert 0 < choice.flops_added <= policies.TRIM_FLOPS * layout_only.cost.flops
    assert "rematerialized (element-wise work, as if unrolled)" in str(report)
    theirs = jax.jit(step)(params, batch)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_model_that_fits_only_rematerialized_gets_jax_jits_values(
    layout_only, monkeypatch, mesh_4x2
):
    _fewer_finalists(monkeypatch)  # the layouts-only search that fails first is not tested here
    params, batch = stacked_params(), batch_of()
    unconstrained, layout_only = layout_only.auto.choice, layout_only.memory.total
    limit = int(0.6 * layout_only)
    f = auto_step(auto_memory_limit=limit)
    with jax.set_mesh(mesh_4x2):
        report = f.lower(params, batch).report()
        ours = f(params, batch)
    theirs = jax.jit(step)(params, batch)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    choice = report.auto.choice
    assert report.memory.total <= limit < layout_only, str(report)
    # The layouts chosen without the limit fit rematerialized: kept, as a user adding
    # jax.checkpoint keeps them, and found with one compile per plan, not a search.
    assert choice.chosen.specs == unconstrained.chosen.specs, (choice, unconstrained)
    assert choice.compiles == 1, choice
    ((where, policy),) = choice.remat
    assert where == f"scan #1 ({LAYERS} steps)"
    assert policy in (*policies.POLICIES, "save_only_these_names:hidden")
    assert choice.flops_added is not None and choice.flops_added > 0
    text = str(report)
    assert "rematerialized to fit the memory limit" in text and policy in text
    assert f"{choice.flops_added:,.0f} flops added" in text
    picture = report.auto.visualize(show=False)
    assert picture.endswith(
        f"scan #1 ({LAYERS} steps) rematerialized with {policy} (+{choice.flops_added:,.0f} flops)"
    )


def _fewer_finalists(monkeypatch: pytest.MonkeyPatch) -> None:
    """One finalist of each kind under the limit (the searches' compiles are most of
    these tests' time; what they check does not need more)."""
    monkeypatch.setattr(confirm, "FINALISTS", 1)
    monkeypatch.setattr(confirm, "EXTRA_FOR_LIMIT", 1)


@pytest.mark.slow
def test_a_limit_nothing_meets_names_the_smallest_plan_and_its_size(
    layout_only, monkeypatch, mesh_4x2
):
    layout_only = layout_only.memory.total
    # A limit nothing meets makes AUTO search every plan; the policy that keeps least, on
    # a block without names, is enough to fail here (the fitting test tries them all).
    monkeypatch.setattr(
        policies, "POLICIES", {"nothing_saveable": policies.POLICIES["nothing_saveable"]}
    )
    _fewer_finalists(monkeypatch)
    limit = int(0.05 * layout_only)
    untagged = functools.partial(block, tag=False)
    f = auto_step(untagged, auto_memory_limit=limit)
    params, batch = stacked_params(), batch_of()
    with jax.set_mesh(mesh_4x2), pytest.raises(ValueError, match="rematerialization") as e:
        f.lower(params, batch)
    err = e.value
    assert isinstance(err, NoLayoutFits)
    assert "rematerialized" in err.smallest and "args[0]['w1']" in err.smallest
    assert limit < err.memory_bytes < 0.6 * layout_only
    assert f"{err.memory_bytes:,.0f} bytes per device" in str(err)


@pytest.mark.slow
@pytest.mark.parametrize("jit", [jax.jit, partitioner.jit], ids=["jax.jit", "partitioner.jit"])
def test_a_scan_differentiated_inside_a_jit_call_is_rematerialized(
    layout_only, monkeypatch, jit, mesh_4x2
):
    """A loss written as a jitted function: under grad its forward scan and its backward
    scan are in two jit calls; they are inlined, and the scan recomputed to fit."""
    monkeypatch.setattr(policies, "POLICIES", {"dots_saveable": policies.POLICIES["dots_saveable"]})
    _fewer_finalists(monkeypatch)

    @jit
    def loss(p, batch):
        h, _ = jax.lax.scan(block, batch[0], p)
        return jnp.mean((h - batch[1]) ** 2)

    def jitted_loss_step(params, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params, batch = stacked_params(), batch_of()
    assert scans.blocks(jax.make_jaxpr(jitted_loss_step)(params, batch)) == []  # in the calls
    limit = int(0.6 * layout_only.memory.total)
    f = partitioner.pjit(jitted_loss_step, (AUTO, BATCH), (AUTO, P()), auto_memory_limit=limit)
    with jax.set_mesh(mesh_4x2):
        report = f.lower(params, batch).report()
        ours = f(params, batch)
    assert report.memory.total <= limit, str(report)
    assert report.auto.choice.remat == ((f"scan #1 ({LAYERS} steps)", "dots_saveable"),)
    theirs = jax.jit(jitted_loss_step)(params, batch)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


MEGATRON = {
    "wqkv": P(None, None, "model"),
    "wo": P(None, "model", None),
    "w1": P(None, None, "model"),
    "w2": P(None, "model", None),
}


@pytest.mark.slow
def test_under_the_hand_plans_memory_auto_recomputes_no_more_than_it(monkeypatch, mesh_4x2):
    """At the memory of "Megatron + jax.checkpoint on every block", where the layouts
    chosen without a limit do not fit even rematerialized: recomputed flops are the
    price, so AUTO recomputes no more than the hand plan (a layout that moves fewer
    bytes but splits the compute less would recompute more per device). One plan, the
    hand plan's policy (the block has no names): the layouts are what is tested."""
    monkeypatch.setattr(
        policies, "POLICIES", {"nothing_saveable": policies.POLICIES["nothing_saveable"]}
    )
    _fewer_finalists(monkeypatch)
    params, batch = stacked_params(), batch_of()
    untagged = functools.partial(block, tag=False)

    def hand(body):
        f = partitioner.pjit(train_step(body), (MEGATRON, BATCH), (MEGATRON, P()))
        return f.lower(params, batch).compile().report()

    with jax.set_mesh(mesh_4x2):
        plain, checkpointed = hand(untagged), hand(jax.checkpoint(untagged))
        f = auto_step(untagged, auto_memory_limit=checkpointed.memory.total)
        report = f.lower(params, batch).report()
    hand_added = checkpointed.cost.flops - plain.cost.flops
    choice = report.auto.choice
    assert choice.compiles > 1, choice  # the layouts were searched again under the limit
    assert report.memory.total <= checkpointed.memory.total
    assert choice.flops_added is not None and 0 < choice.flops_added <= hand_added, (
        choice.flops_added,
        hand_added,
    )
