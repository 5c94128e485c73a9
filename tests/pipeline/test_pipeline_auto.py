"""``partitioner.pipeline(layer, axis=AUTO)``: the enclosing call chooses the whole plan
(NOTE [whole plan]): a pipeline, over which axis, with which schedule, or the plain scan
with its layouts. Each choice is checked against hand plans on XLA's own figures, and
every value against jax.jit's plain scan. The stacks are the ones bench_pipeline.py and
bench_plan.py measure (benchmarks/models.py)."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from benchmarks import models
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._testing import Figures, PipelineDecision


def _sgd(forward):
    def step(params, x, y):
        grads = jax.grad(lambda p: jnp.mean((forward(p, x) - y) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads)

    return step


def _figures(report) -> Figures:
    """XLA's figures of a compiled program (no step time: dominance alone is checked)."""
    return Figures(float(report.collective_bytes), float(report.memory.total), 0.0, measured=True)


def _close(ours, theirs) -> None:
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=1e-4)


def _auto(layer, params, x, y, batch: P):
    partitioner.clear_caches()
    f = partitioner.jit(
        _sgd(partitioner.pipeline(layer, axis=AUTO)),
        in_shardings=(AUTO, batch, batch),
        out_shardings=AUTO,
    )
    report = f.lower(params, x, y).compile().report()
    _close(f(params, x, y), jax.jit(_sgd(models.plain_scan(layer)))(params, x, y))
    return report


def _hand(layer, params, x, y, batch: P, specs, schedule=None, count=None, axis=None):
    forward = (
        models.plain_scan(layer)
        if schedule is None
        else partitioner.pipeline(layer, axis=axis, schedule=schedule, microbatches=count)
    )
    f = partitioner.jit(_sgd(forward), in_shardings=(specs, batch, batch), out_shardings=specs)
    return _figures(f.lower(params, x, y).compile().report())


def _not_beaten(ours: Figures, hands: dict[str, Figures]) -> None:
    beaten = {name: figures for name, figures in hands.items() if figures.dominates(ours)}
    assert not beaten, f"AUTO's {ours} beaten on bytes and memory by {beaten}"


def test_a_pipeline_is_chosen_where_it_wins(mesh_4x2) -> None:
    """The transformer stack with its batch over "model": a gpipe pipeline over "data"
    moves a quarter of the plain scan's best layouts' bytes and holds less; no hand
    plan (Megatron over "data", FSDP over all 8, the layers over "data", pipelines of
    2 to 8 microbatches) beats it on both figures."""
    params = models.stack_block_params(jax.random.key(0))
    x, y = models.stack_block_batch(jax.random.key(1))
    batch = P("model")
    with jax.set_mesh(mesh_4x2):
        report = _auto(models.stack_block, params, x, y, batch)
        choice = report.auto.choice
        assert choice.whole_plan.decision == PipelineDecision("data", "gpipe"), str(report)
        assert report.pipelines and report.pipelines[0].axis == "data"
        assert choice.whole_plan.microbatches == (report.pipelines[0].microbatches,)
        plain = next(plan for plan in choice.whole_plans if plan.decision.axis is None)
        assert plain.candidate is not None and plain.note
        columns = {name: P(None, None, "data") for name in ("wq", "wk", "wv", "w1")}
        megatron = {**columns, "wo": P(None, "data"), "w2": P(None, "data")}
        megatron.update(ln1=P(), ln2=P())
        hands = {
            "Megatron over 'data'": _hand(models.stack_block, params, x, y, batch, megatron),
            "FSDP over all 8": _hand(
                models.stack_block, params, x, y, batch,
                {k: P(None, ("data", "model")) if k.startswith("ln") else
                 P(None, None, ("data", "model")) for k in params},
            ),
            "layers over 'data'": _hand(models.stack_block, params, x, y, batch, P("data")),
        }  # fmt: skip
        for schedule, count in (("gpipe", 2), ("gpipe", 8), ("circular", 4)):
            hands[f"{schedule} {count}"] = _hand(
                models.stack_block, params, x, y, batch, P("data"), schedule, count, "data"
            )
    _not_beaten(_figures(report), hands)


def test_no_pipeline_where_it_loses(mesh_4x2, caplog) -> None:
    """The residual MLP stack (large weights, small activations), batch over "data":
    its weights split over all 8 devices beat any pipeline over "model" on both
    figures; the choice is the plain scan, which no pipeline beats. The search says
    which plans it weighs."""
    params = models.mlp_stack_params(jax.random.key(0))
    x, y = models.mlp_stack_batch(jax.random.key(1))
    batch = P("data")
    with jax.set_mesh(mesh_4x2):
        with caplog.at_level(logging.INFO, logger="partitioner"):
            report = _auto(models.residual_mlp, params, x, y, batch)
        choice = report.auto.choice
        assert choice.whole_plan.decision == PipelineDecision(None), str(report)
        assert not report.pipelines
        weighed = {plan.decision for plan in choice.whole_plans}
        assert {PipelineDecision("model", kind) for kind in ("gpipe", "circular")} <= weighed
        # the search says what it weighs as it goes
        assert "searching the layouts of the gpipe pipeline over 'model'" in caplog.text
        assert "to measure it" in caplog.text
        hands = {
            f"{schedule} {count}": _hand(
                models.residual_mlp, params, x, y, batch, P("model"), schedule, count, "model"
            )
            for schedule, count in (("gpipe", 4), ("gpipe", 8), ("circular", 4))
        }
        hands["replicated"] = _hand(models.residual_mlp, params, x, y, batch, P())
    _not_beaten(_figures(report), hands)


def test_outside_a_partitioner_call_the_plain_scan_runs(mesh_4x2) -> None:
    params = models.mlp_stack_params(jax.random.key(0))
    x, _ = models.mlp_stack_batch(jax.random.key(1))
    run = partitioner.pipeline(models.residual_mlp, axis=AUTO)
    _close(jax.jit(run)(params, x), jax.jit(models.plain_scan(models.residual_mlp))(params, x))
    with pytest.raises(ValueError, match="axis=AUTO"):
        run.plan(params, x)
    with jax.set_mesh(mesh_4x2), pytest.raises(ValueError, match="axis=AUTO"):
        run.stage(params)


def test_a_bad_axis_names_auto_in_its_message() -> None:
    with pytest.raises(TypeError, match="partitioner.AUTO"):
        partitioner.pipeline(models.residual_mlp, axis=3)


def _head(head_params, h, targets):
    """One microbatch's mean squared error of a linear read-out."""
    return jnp.mean((h @ head_params - targets) ** 2)


def test_a_loss_pipeline_weighs_every_schedule(mesh_4x2) -> None:
    """With ``loss=head`` the body's AUTO pipeline may run any schedule, the 1F1B family
    too (their memory does not grow with the microbatches): the whole plan weighs each
    over the free axis, takes one no weighed plan beats on both figures, and its loss and
    updated parameters are the plain scan's and head's under jax.jit."""
    params = models.mlp_stack_params(jax.random.key(0))
    x, y = models.mlp_stack_batch(jax.random.key(1))
    head_params = jax.random.normal(jax.random.key(2), (x.shape[-1], y.shape[-1])) / 16

    def sgd(forward):
        def step(params, head_params, x, y):
            loss, grads = jax.value_and_grad(forward, argnums=(0, 2))(params, x, head_params, y)
            return loss, jax.tree.map(lambda p, g: p - 1e-2 * g, (params, head_params), grads)

        return step

    def plain(params, x, head_params, y):
        return _head(head_params, models.plain_scan(models.residual_mlp)(params, x), y)

    partitioner.clear_caches()
    run = partitioner.pipeline(models.residual_mlp, axis=AUTO, loss=_head)
    f = partitioner.jit(sgd(run), in_shardings=(AUTO, AUTO, P("data"), P("data")))
    with jax.set_mesh(mesh_4x2):
        report = f.lower(params, head_params, x, y).compile().report()
        ours = f(params, head_params, x, y)
    _close(ours, jax.jit(sgd(plain))(params, head_params, x, y))
    plans = report.auto.choice.whole_plans
    weighed = {plan.decision for plan in plans}
    every = ("gpipe", "circular", "1f1b", "interleaved-1f1b", "zero-bubble")
    assert {PipelineDecision("model", kind) for kind in every} <= weighed, str(report)
    chosen = plans[0].candidate.figures
    measured = [
        p.candidate.figures for p in plans[1:] if p.candidate and p.candidate.figures.measured
    ]
    assert len(measured) >= 1  # the model's fastest pipeline was compiled beside the plain scan
    assert not [other for other in measured if other.dominates(chosen)], str(report)
