"""What the schedules that run by actions pay, on XLA's figures: memory, bytes, flops.

A stage of 1F1B holds at most ``S`` microbatches, whatever ``M``; zero bubble as many,
its weight gradients beside them; both move what gpipe moves. Each test compiles
training steps of a residual MLP stack whose activations outweigh its weights (a batch of 512), on the
("stage", "data") 4x2 mesh, and reads XLA's figures (partitioner's report); what a
schedule *saves* is its temporary bytes above gpipe's with ``saves="inputs"``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from partitioner._src.auto.cost import flops

from .test_pipeline import layer

LAYERS, BATCH, WIDTH, HIDDEN = 8, 512, 32, 128
IN = (P("stage"), P("data"), P(), P("data"))


def params_of() -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.key(9), 3)
    return {
        "w1": jax.random.normal(k1, (LAYERS, WIDTH, HIDDEN)) / math.sqrt(WIDTH),
        "w2": jax.random.normal(k2, (LAYERS, HIDDEN, WIDTH)) / math.sqrt(HIDDEN),
        "b": jax.random.normal(k3, (LAYERS, WIDTH)) * 0.1,
    }


def head(scale: jax.Array, h: jax.Array, targets: jax.Array) -> jax.Array:
    return jnp.mean((scale * h - targets) ** 2)


def figures(mesh, schedule: str, saves: str, count: int) -> tuple[int, int, float]:
    """XLA's temporary bytes and collective bytes per device, and the flop counter's
    flops, of a training step (the stack's gradient)."""
    params = params_of()
    x, y = jax.random.normal(jax.random.key(10), (2, BATCH, WIDTH))
    scale = jnp.ones(())
    run = partitioner.pipeline(
        layer, axis="stage", microbatches=count, schedule=schedule, saves=saves, loss=head
    )
    train = jax.grad(run)
    f = partitioner.jit(train, in_shardings=IN)
    with jax.set_mesh(mesh):
        report = f.lower(params, x, scale, y).compile().report()
        work = flops.program(jax.make_jaxpr(train)(params, x, scale, y))
    return report.memory.temporaries, report.collective_bytes, work


@pytest.fixture(scope="module")
def measured(request) -> dict[tuple[str, str, int], tuple[int, int, float]]:
    """The figures of the programs the tests below compare, each compiled once."""
    del request
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("stage", "data"))
    wanted = [
        ("gpipe", "inputs", 16),
        ("gpipe", "activations", 16),
        ("1f1b", "activations", 4),
        ("1f1b", "activations", 16),
        ("zero-bubble", "activations", 16),
    ]
    return {key: figures(mesh, *key) for key in wanted}


def saved(measured, key: tuple[str, str, int]) -> int:
    """What a schedule saves: its temporaries above gpipe's saving inputs, at its ``M``."""
    return measured[key][0] - measured[("gpipe", "inputs", key[2])][0]


def test_1f1b_keeps_a_few_microbatches_where_gpipe_keeps_them_all(measured) -> None:
    """At 16 microbatches a stage holds at most 4 of them (ideal: a quarter of gpipe's
    activations); a stage that kept every microbatch's values would save as much as
    gpipe does."""
    ours, gpipe = (
        saved(measured, ("1f1b", "activations", 16)),
        saved(measured, ("gpipe", "activations", 16)),
    )
    assert 0 < ours <= 0.4 * gpipe, (ours, gpipe)


def test_what_1f1b_holds_does_not_grow_with_the_microbatches(measured) -> None:
    few, many = measured[("1f1b", "activations", 4)][0], measured[("1f1b", "activations", 16)][0]
    assert many <= few, (few, many)


def test_zero_bubble_holds_what_1f1b_holds_and_computes_what_it_computes(measured) -> None:
    """Its weight gradients run beside the other actions, on what the input gradients
    left them: within 1.1x of 1F1B's memory and 1.05x of its flops (a round charged its
    dearest branch)."""
    zb, one = ("zero-bubble", "activations", 16), ("1f1b", "activations", 16)
    assert saved(measured, zb) <= 1.1 * saved(measured, one), (measured[zb], measured[one])
    assert measured[zb][2] <= 1.05 * measured[one][2], (measured[zb][2], measured[one][2])


def test_1f1b_and_zero_bubble_move_what_gpipe_moves(measured) -> None:
    """One permute a round, ``2 (M + S - 1)`` of them at most: gpipe's."""
    gpipe = measured[("gpipe", "activations", 16)][1]
    for key in (("1f1b", "activations", 16), ("zero-bubble", "activations", 16)):
        assert measured[key][1] <= 1.1 * gpipe, (key, measured[key][1], gpipe)


def test_the_report_shows_the_schedule(mesh) -> None:
    params = params_of()
    x, y = jax.random.normal(jax.random.key(10), (2, BATCH, WIDTH))
    run = partitioner.pipeline(
        layer, axis="stage", microbatches=4, schedule="zero-bubble", loss=head
    )
    f = partitioner.jit(jax.grad(run), in_shardings=IN)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        report = f.lower(params, x, jnp.ones(()), y).compile().report()
        plan = run.plan(params, x, jnp.ones(()), y)
    (table,) = report.pipelines
    assert (table.schedule, table.microbatches, table.in_flight) == ("zero-bubble", 4, 4)
    assert table.bubble_fraction == pytest.approx(3 / 15)
    assert table.chart == plan.chart()
    assert plan.chart().splitlines()[3] == (
        "stage 3 |  .  .  . F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3"
    )
    text = str(report)
    assert "the schedule (F forward, B backward, W weight gradient, . idle):" in text
    assert "    stage 3 |  .  .  . F0 B0 F1 B1" in text
    permutes = [c for c in report.collectives if c.kind == "collective-permute"]
    assert permutes and all(c.axes == ("stage",) for c in permutes)
