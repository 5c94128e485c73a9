"""AUTO under a memory limit recomputes the layers of an unrolled stack to fit.

The model is test_remat's train step with its 8 transformer blocks written as a
Python loop over a list of parameter dicts: after ``jax.grad`` one flat program, no
scan to recompute in (NOTE [auto remat unrolled]). Every figure is XLA's, every
value is compared with jax.jit's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import tree_flatten_with_path

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.auto.remat import policies, unrolled

from .test_remat import BATCH, LAYERS, _fewer_finalists, batch_of, block, stacked_params


def unrolled_step(params, batch, tag=True):
    def loss(layers, batch):
        x, y = batch
        for p in layers:
            x, _ = block(x, p, tag)
        return jnp.mean((x - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def layer_params(n: int = LAYERS) -> list[dict[str, jax.Array]]:
    stacked = stacked_params()
    return [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(n)]


def traced(step, *args):
    closed = jax.make_jaxpr(step)(*args)
    return closed, [path for path, _ in tree_flatten_with_path(args)[0]]


def run(closed, leaves):
    return jax.jit(functools.partial(jax.core.eval_jaxpr, closed.jaxpr, closed.consts))(*leaves)


def test_a_state_tuples_index_is_not_taken_for_a_layer():
    """``(params, momentum)`` in one argument: its index is the first key that may name
    a layer, but two entries holding different leaves are no stack; the layers are the
    parameters' (the momentum's, read only by the update, have nothing to recompute)."""

    def step(state, batch):
        params, momentum = state
        new, value = unrolled_step(params, batch)
        momentum = jax.tree.map(lambda m, p, q: 0.9 * m + p - q, momentum, params, new)
        return (new, momentum), value

    params = layer_params()
    state = (params, jax.tree.map(jnp.zeros_like, params))
    closed, paths = traced(step, state, batch_of())
    found = unrolled.layers(closed, paths)
    assert [layer.name for layer in found] == [f"args[0][0][{k}]" for k in range(LAYERS - 1)]


def test_the_layers_of_an_unrolled_stack_are_found_but_not_its_last_or_the_batch():
    """Every layer but the last (its residuals are read first, at the peak); the batch
    tuple ``(x, y)`` looks like a stack of two but is not one."""
    closed, paths = traced(unrolled_step, layer_params(), batch_of())
    found = unrolled.layers(closed, paths)
    assert [layer.name for layer in found] == [f"args[0][{k}]" for k in range(LAYERS - 1)]
    assert all(layer.names == ("hidden",) for layer in found)
    sizes = {layer.end - layer.start for layer in found}
    assert len(sizes) == 1, sizes  # equal layers, equal spans of equations
    assert found[-1].end <= found[-1].late < len(closed.jaxpr.eqns)


def test_a_scanned_stack_or_a_forward_only_program_has_no_layer_to_rewrite():
    def forward(params, batch):
        x = batch[0]
        for p in params:
            x, _ = block(x, p)
        return x.sum()

    closed, paths = traced(forward, layer_params(), batch_of())
    layers = unrolled.layers(closed, paths)
    plan = policies.RecomputePolicy(tuple(layers), ("nothing_saveable",) * len(layers))
    assert str(unrolled.rewrite(closed, plan).jaxpr) == str(closed.jaxpr)  # no residual


@pytest.mark.slow
def test_each_policy_rewrite_keeps_the_values_and_lowers_xlas_memory():
    """Every plan computes what the step computes, in less memory by XLA's figure. The
    recomputation survives XLA:CPU's common-subexpression pass (an
    ``optimization_barrier`` does not: jax.checkpoint on each block leaves the memory as
    it was). Four layers: XLA's compile of an unrolled program grows faster than it."""
    params, batch = layer_params(4), batch_of()
    closed, paths = traced(unrolled_step, params, batch)
    leaves = jax.tree.leaves((params, batch))
    expected = jax.tree.leaves(jax.jit(unrolled_step)(params, batch))

    def compiled(c):
        f = jax.jit(functools.partial(jax.core.eval_jaxpr, c.jaxpr, c.consts))
        return f.lower(*leaves).compile()

    def memory(program) -> int:
        return program.memory_analysis().temp_size_in_bytes

    plain = memory(compiled(closed))
    for plan in policies.policies_to_try(unrolled.layers(closed, paths)):
        body = unrolled.rewrite(closed, plan)
        assert body.in_avals == closed.in_avals and body.out_avals == closed.out_avals
        program = compiled(body)
        for a, b in zip(program(*leaves), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=str(plan.policies))
        assert memory(program) < 0.7 * plain, plan.policies


def test_a_flax_linen_stack_of_modules_is_rewritten_layer_by_layer():
    """flax's ``Block_0``, ``Block_1``... submodules, unrolled: their layers are found
    by their parameters' paths and every policy keeps the values."""
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            return x + nn.Dense(x.shape[-1])(jax.nn.gelu(nn.Dense(64)(x)))

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            for _ in range(4):
                x = Block()(x)
            return x

    x, y = (jax.random.normal(k, (8, 16)) for k in jax.random.split(jax.random.key(0)))
    params = Stack().init(jax.random.key(1), x)

    def flax_step(params, x, y):
        return jax.grad(lambda p: jnp.mean((Stack().apply(p, x) - y) ** 2))(params)

    closed, paths = traced(flax_step, params, x, y)
    found = unrolled.layers(closed, paths)
    assert [layer.name for layer in found] == [f"args[0]['params']['Block_{k}']" for k in range(3)]
    leaves = jax.tree.leaves((params, x, y))
    expected = jax.tree.leaves(jax.jit(flax_step)(params, x, y))
    for plan in policies.policies_to_try(found):
        got = run(unrolled.rewrite(closed, plan), leaves)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=str(plan.policies))


@pytest.mark.slow
def test_an_unrolled_model_that_fits_only_rematerialized_gets_jax_jits_values(
    monkeypatch, mesh_4x2
):
    """A limit 0.6x AUTO's layout-only memory (stated, as measured: searching the plan
    without it would double the test): the layers are recomputed to fit, and
    the step computes what jax.jit's does. One policy (the one that keeps least) on
    untagged blocks: the choice among policies is test_remat's; what is new here is the
    unrolled rewrite."""
    monkeypatch.setattr(
        policies, "POLICIES", {"nothing_saveable": policies.POLICIES["nothing_saveable"]}
    )
    _fewer_finalists(monkeypatch)
    params, batch = layer_params(), batch_of()

    def auto(**kw):
        step = functools.partial(unrolled_step, tag=False)
        return partitioner.pjit(step, (AUTO, BATCH), (AUTO, P()), **kw)

    limit = 1_950_000  # 0.6x AUTO's plan without it: 3,253,267 bytes per device
    with jax.set_mesh(mesh_4x2):
        f = auto(auto_memory_limit=limit)
        report = f.lower(params, batch).report()
        ours = f(params, batch)
    assert report.memory.total <= limit, str(report)
    choice = report.auto.choice
    assert choice.remat_to_fit  # no layout alone fitted
    assert choice.remat == tuple(
        (f"layer args[0][{k}]", "nothing_saveable") for k in range(LAYERS - 1)
    )
    assert choice.flops_added is not None and choice.flops_added > 0
    theirs = jax.jit(unrolled_step)(params, batch)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_flax_nnx_stack_trained_with_optax_fits_rematerialized(monkeypatch, mesh_4x2):
    """flax nnx layers in a list, their state and optax's adamw state AUTO: the step
    fits 0.7x its layout-only memory with its layers recomputed; values are jax.jit's."""
    _fewer_finalists(monkeypatch)
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.up, self.down = nnx.Linear(32, 128, rngs=rngs), nnx.Linear(128, 32, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return x + self.down(jax.nn.gelu(self.up(x)))

    class Stack(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.blocks = nnx.List([Block(rngs) for _ in range(4)])

        def __call__(self, x: jax.Array) -> jax.Array:
            for b in self.blocks:
                x = b(x)
            return x

    graph, state = nnx.split(Stack(nnx.Rngs(0)))
    tx = optax.adamw(1e-2)
    opt = tx.init(state)
    x = jax.random.normal(jax.random.key(1), (32, 16, 32))

    def step(state, opt, x):
        loss, grads = jax.value_and_grad(lambda s: (nnx.merge(graph, s)(x) ** 2).mean())(state)
        updates, opt = tx.update(grads, opt, state)
        return optax.apply_updates(state, updates), opt, loss

    def auto(**kw):
        return partitioner.jit(step, in_shardings=(AUTO, AUTO, P("data")), out_shardings=(AUTO, AUTO, None), **kw)  # fmt: skip

    limit = 649_000  # 0.7x AUTO's plan without it: 927,396 bytes per device
    with jax.set_mesh(mesh_4x2):
        f = auto(auto_memory_limit=limit)
        report = f.lower(state, opt, x).report()
        ours = f(state, opt, x)
    assert report.memory.total <= limit and report.auto.choice.remat_to_fit, str(report)
    assert [b for b, _ in report.auto.choice.remat] == [
        f"layer args[0]['blocks'][{k}]" for k in range(3)
    ]
    theirs = jax.jit(step)(state, opt, x)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
