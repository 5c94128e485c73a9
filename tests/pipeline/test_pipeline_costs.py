"""What a pipeline pays: the bytes it moves, the memory it holds, on XLA's figures.

A user picks pipeline stages for two reasons: each stage holds only its layers, and
only neighbouring stages talk. Each test here compiles a training step and reads
XLA's own figures (partitioner's report of the compiled program); every value is
compared with jax.jit running the plain scan.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import PartitionSpec as P

from .test_pipeline import close, layer, plain, train_step

LAYERS, BATCH, WIDTH, HIDDEN = 8, 32, 64, 256
STACK = {"w1": P("stage"), "w2": P("stage"), "b": P("stage")}


def params_of(layers: int = LAYERS) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    return {
        "w1": jax.random.normal(k1, (layers, WIDTH, HIDDEN)) / math.sqrt(WIDTH),
        "w2": jax.random.normal(k2, (layers, HIDDEN, WIDTH)) / math.sqrt(HIDDEN),
        "b": jax.random.normal(k3, (layers, WIDTH)) * 0.1,
    }


def batch_of(size: int = BATCH) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(4))
    return jax.random.normal(kx, (size, WIDTH)), jax.random.normal(ky, (size, WIDTH))


def report_of(f, *args):
    return f.lower(*args).compile().report()


def pipelined_step(run, params, spec=STACK):
    return partitioner.jit(
        train_step(run), in_shardings=(spec, P("data"), P("data")), out_shardings=None
    )


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_no_weight_gradient_is_reduced_inside_the_loop(mesh, schedule) -> None:
    """Each stage's weight gradients are reduced over "data" once per training step,
    after the loop, not at every step inside it (NOTE [pipeline gradients])."""
    params, (x, y) = params_of(), batch_of()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule=schedule)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        if schedule == "circular":
            params = run.stage(params)
        spec = jax.tree.map(lambda _: P("stage"), params)
        report = report_of(pipelined_step(run, params, spec), params, x, y)
    per_step = [
        c for c in report.collectives
        if c.kind in ("all-reduce", "reduce-scatter") and c.axes == ("data",) and c.count > 1
    ]  # fmt: skip
    assert per_step == [], [(c.shape, c.count, c.op_name) for c in per_step]
    (table,) = report.pipelines
    assert table.loop_reductions == 0 and table.loop_reduction_bytes == 0
    once = [  # the pipeline's own: not the loss's mean
        c for c in report.collectives
        if c.axes == ("data",) and c.kind == "all-reduce" and "pipeline[" in (c.op_name or "")
    ]  # fmt: skip
    stage_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params)) // 4
    reduced = sum(c.bytes_per_run for c in once)
    # the stage's weights once (XLA's combiner may fold the loss's scalar mean into it)
    assert stage_bytes <= reduced <= stage_bytes + 16, (reduced, stage_bytes)


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_memory_does_not_grow_with_the_steps(mesh, schedule) -> None:
    """Four times the microbatches, about three times the steps: what the steps save is
    activations only (a stage's weights are never saved per step), and the activations
    in all the steps together are the batch's, so XLA's memory does not grow."""
    params, (x, y) = params_of(), batch_of(64)
    figures = {}
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        for count in (4, 16):
            run = partitioner.pipeline(
                layer, axis="stage", microbatches=count, schedule=schedule, saves="activations"
            )
            staged = run.stage(params) if schedule == "circular" else params
            spec = jax.tree.map(lambda _: P("stage"), staged)
            report = report_of(pipelined_step(run, staged, spec), staged, x, y)
            figures[count] = (report.memory.total, report.pipelines[0].steps)
    (small, few), (large, many) = figures[4], figures[16]
    assert many >= 2.5 * few
    assert large <= small * 1.02, figures


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_a_pipeline_moves_fewer_bytes_than_data_parallel(mesh, schedule) -> None:
    """Only neighbours talk, and each stage's weights are reduced once: well under the
    bytes of the plain scan with the batch over every device (data parallel)."""
    params, (x, y) = params_of(), batch_of()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule=schedule)
    everywhere = P(("stage", "data"))
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        data_parallel = partitioner.jit(
            train_step(plain), in_shardings=(P(), everywhere, everywhere), out_shardings=None
        )
        theirs = report_of(data_parallel, params, x, y).collective_bytes
        staged = run.stage(params)
        spec = jax.tree.map(lambda _: P("stage"), staged)
        ours = report_of(pipelined_step(run, staged, spec), staged, x, y).collective_bytes
    assert ours <= 0.4 * theirs, (ours, theirs)


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_a_layer_count_the_stages_do_not_divide_runs(mesh, schedule) -> None:
    """Six layers on four stages: four pipelined, two after them outside the stages."""
    params, (x, y) = params_of(6), batch_of()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule=schedule)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        plan = run.plan(params, x)
        ours = partitioner.jit(train_step(run), in_shardings=(None, P("data"), P("data")))(
            params, x, y
        )
    assert (plan.schedule.layers, plan.rest_layers) == (4, 2)
    assert "2 more layers after the stages" in str(plan)
    close(ours, jax.jit(train_step(plain))(params, x, y), schedule)


def test_circular_with_staged_parameters_moves_no_parameter(mesh) -> None:
    """Given its parameters staged once (``stage()``), a circular pipeline moves no
    parameter between layer orders at the call (no all-to-all), and trains them in the
    staged form: the same values as the plain scan over the stack."""
    params, (x, y) = params_of(), batch_of()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule="circular")
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        staged = run.stage(params)
        spec = jax.tree.map(lambda _: P("stage"), staged)
        step = pipelined_step(run, staged, spec)
        kinds = {c.kind for c in report_of(step, staged, x, y).collectives}
        (value, grads) = step(staged, x, y)
    assert "all-to-all" not in kinds
    want_value, want_grads = jax.jit(train_step(plain))(params, x, y)
    close((value, grads.unstage()), (want_value, want_grads), "staged")
    np.testing.assert_array_equal(staged.unstage()["w1"], params["w1"])


def test_the_mesh_of_the_enclosing_call(mesh) -> None:
    """No mesh in context: the pipeline runs over the mesh of the call's NamedShardings
    (as jax.shard_map's ``mesh=`` defaults), or the one given."""
    params, (x, y) = params_of(), batch_of()
    m = mesh((4, 2), ("stage", "data"))
    stack = jax.tree.map(lambda s: NamedSharding(m, s), STACK)
    data = NamedSharding(m, P("data"))
    for run in (
        partitioner.pipeline(layer, axis="stage", microbatches=4),
        partitioner.pipeline(layer, axis="stage", microbatches=4, mesh=m),
    ):
        ours = partitioner.jit(train_step(run), in_shardings=(stack, data, data))(params, x, y)
        close(ours, jax.jit(train_step(plain))(params, x, y), "enclosing mesh")


def test_the_layers_own_axis_stays_its_own(mesh) -> None:
    """A layer splitting its hidden activations over "model" (tensor parallel) keeps
    that axis: the stages' batch is split over "data" alone."""
    params, (x, y) = params_of(4), batch_of()
    run = partitioner.pipeline(layer, axis="stage", microbatches=2)
    with jax.set_mesh(mesh((2, 2, 2), ("stage", "data", "model"))):
        plan = run.plan(params, x)
        ours = pipelined_step(run, params)(params, x, y)
    assert plan.placement.batch == ("data",)
    close(ours, jax.jit(train_step(plain))(params, x, y), "tensor parallel")


def test_a_layer_constraining_its_batch_with_jaxs_own_constraint(mesh) -> None:
    """jax's with_sharding_constraint naming the batch axis inside the layer: the shards
    carry that axis, the layer's constraint runs without it."""
    m = mesh((4, 2), ("stage", "data"))

    def constrained(p, h):
        h = jax.lax.with_sharding_constraint(h, NamedSharding(m, P("data")))
        return layer(p, h)

    params, (x, y) = params_of(), batch_of()
    run = partitioner.pipeline(constrained, axis="stage", microbatches=4)
    with jax.set_mesh(m):
        ours = pipelined_step(run, params)(params, x, y)
        plan = run.plan(params, x)
    assert plan.placement.batch == ("data",)
    close(ours, jax.jit(train_step(plain))(params, x, y), "jax's constraint")


def test_a_users_checkpoint_on_the_layer_holds(mesh) -> None:
    """``jax.checkpoint`` with the user's policy on the layer: the values are the plain
    scan's, and it saves less than the layer without it."""
    remat = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
    params, (x, y) = params_of(), batch_of(64)
    memory = {}
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        for name, fn in (("plain", layer), ("remat", remat)):
            run = partitioner.pipeline(fn, axis="stage", microbatches=4, saves="activations")
            step = pipelined_step(run, params)
            memory[name] = report_of(step, params, x, y).memory.total
            if name == "remat":
                close(step(params, x, y), jax.jit(train_step(plain))(params, x, y), "remat")
    assert memory["remat"] < memory["plain"], memory


def test_each_step_saves_its_inputs_when_asked(mesh) -> None:
    """``saves="inputs"`` (MaxText's and praxis' default) keeps each visit's input and
    recomputes the rest: less memory than keeping the activations, the same values."""
    params, (x, y) = params_of(), batch_of(64)
    memory = {}
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        for saves in ("activations", "inputs"):
            run = partitioner.pipeline(layer, axis="stage", microbatches=4, saves=saves)
            step = pipelined_step(run, params)
            memory[saves] = report_of(step, params, x, y).memory.total
            close(step(params, x, y), jax.jit(train_step(plain))(params, x, y), saves)
    assert memory["inputs"] < memory["activations"], memory


def test_the_choice_fits_the_calls_memory_limit(mesh) -> None:
    """Under ``auto_memory_limit`` the microbatch choice keeps to the options whose
    estimated memory fits it (without one, the fastest within 1.25x of the least)."""
    params, (x, y) = params_of(), batch_of(64)
    run = partitioner.pipeline(layer, axis="stage")
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        free = run.plan(params, x)
        smaller = [
            o for o in free.estimates if o.estimate.memory_bytes < free.estimate.memory_bytes
        ]
        limit = int(max(o.estimate.memory_bytes for o in smaller))
        step = partitioner.jit(
            train_step(run), in_shardings=(STACK, P("data"), P("data")), auto_memory_limit=limit
        )
        (table,) = report_of(step, params, x, y).pipelines
        close(step(params, x, y), jax.jit(train_step(plain))(params, x, y), "limited")
    (chosen,) = [
        o for o in free.estimates if (o.microbatches, o.saves) == (table.microbatches, table.saves)
    ]
    assert chosen.estimate.memory_bytes <= limit < free.estimate.memory_bytes


def test_fsdp_inside_a_stage_gathers_once_and_reduces_once(mesh) -> None:
    """A stage's weights also split over "data" (FSDP inside the stage): gathered once per
    training step, before the loop, and their gradients reduced once, after it; nothing
    over "data" inside the loop."""
    params, (x, y) = params_of(), batch_of()
    fsdp = {"w1": P("stage", None, "data"), "w2": P("stage", "data"), "b": P("stage")}
    run = partitioner.pipeline(layer, axis="stage", microbatches=4)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        step = pipelined_step(run, params, fsdp)
        report = report_of(step, params, x, y)
        ours = step(params, x, y)
    over_data = [c for c in report.collectives if c.axes == ("data",) and c.shape != ()]
    assert over_data and all(c.count == 1 for c in over_data), [
        (c.kind, c.shape, c.count) for c in over_data
    ]
    assert {c.kind for c in over_data} >= {"all-gather"}
    close(ours, jax.jit(train_step(plain))(params, x, y), "FSDP inside the stage")
