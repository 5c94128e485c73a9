"""The choice of microbatches and of what a step saves (NOTE [pipeline microbatches]) on its
own: pure functions of the schedule's arithmetic, AUTO's rates and AUTO's flop counter,
kept in AUTO's cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import partitioner
from partitioner._src.auto import searched
from partitioner._src.auto.cost import flops
from partitioner._src.auto.cost.rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from partitioner._src.pipeline import microbatches
from partitioner._src.pipeline.program import Saves
from partitioner._src.pipeline.schedule import Schedule

from .test_pipeline import batch, layer, stacked_params

COSTS = microbatches.LayerCosts(
    flops=1e9, activation_bytes=1e6, residual_bytes=4e6, weight_bytes=2e6
)


def test_an_options_time_is_the_notes_arithmetic() -> None:
    """Three passes of a visit's flops (four when the step recomputes), two permutes of
    a microbatch shard a step, on the shards' share of the batch."""
    for kind, count, shards, saves in [
        ("gpipe", 4, 2, Saves.ACTIVATIONS),
        ("circular", 8, 1, Saves.INPUTS),
        ("gpipe", 1, 4, Saves.INPUTS),
    ]:
        s = Schedule(kind, 8, 4, count)
        got = microbatches.estimate(s, shards, COSTS, saves)
        passes = 4 if saves is Saves.INPUTS else 3
        compute = s.steps * passes * s.per_visit * COSTS.flops / (count * shards) / FLOPS_PER_S
        moved = 2 * s.steps * COSTS.activation_bytes / (count * shards)
        reduced = COSTS.weight_bytes * 2 if shards > 1 else 0.0  # 8 layers / 4 stages
        collectives = 2 * s.steps + (1 if shards > 1 else 0)
        comm = (moved + reduced) / BYTES_PER_S + collectives * LATENCY_S
        assert got.compute_s == pytest.approx(compute)
        assert got.collective_bytes == pytest.approx(moved + reduced)
        assert got.time_s == pytest.approx(compute + comm)


def test_saving_only_inputs_holds_less_and_takes_longer() -> None:
    s = Schedule("gpipe", 8, 4, 4)
    kept = microbatches.estimate(s, 2, COSTS, Saves.ACTIVATIONS)
    inputs = microbatches.estimate(s, 2, COSTS, Saves.INPUTS)
    assert inputs.memory_bytes < kept.memory_bytes
    assert inputs.time_s > kept.time_s


def test_more_microbatches_hold_less_of_the_activations() -> None:
    """The steps' saved activations add up to about the batch's, more and smaller
    microbatches holding less: (M + S - 1) / M of it for gpipe."""
    memory = [
        microbatches.estimate(Schedule("gpipe", 8, 4, m), 2, COSTS, Saves.ACTIVATIONS).memory_bytes
        for m in (1, 2, 4, 8, 16)
    ]
    assert memory == sorted(memory, reverse=True)


def test_the_choice_is_the_fastest_within_the_memory_slack_or_the_limit() -> None:
    table = microbatches.options(
        "gpipe", 8, 4, [1, 2, 4, 8, 16, 32], lambda count: 2, COSTS, list(Saves)
    )
    assert len(table) == 12
    least = min(o.estimate.memory_bytes for o in table)
    chosen = microbatches.pick(table, None)
    near = [o for o in table if o.estimate.memory_bytes <= least * (1 + microbatches.MEMORY_SLACK)]
    assert chosen in near
    assert chosen.estimate.time_s <= min(o.estimate.time_s for o in near) * (1 + microbatches.TIE)
    # under a limit only options that fit it; the least memory where none does
    limit = int(sorted(o.estimate.memory_bytes for o in table)[3]) + 1
    under = microbatches.pick(table, limit)
    assert under.estimate.memory_bytes <= limit
    fits = [o for o in table if o.estimate.memory_bytes <= limit]
    assert under.estimate.time_s <= min(o.estimate.time_s for o in fits) * (1 + microbatches.TIE)
    assert microbatches.pick(table, 1).estimate.memory_bytes == least


def test_a_layers_costs_are_the_flop_counters_and_jaxs_residuals() -> None:
    params, (x, _) = stacked_params(), batch()
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), params)
    h = jax.ShapeDtypeStruct(x.shape, x.dtype)
    costs = microbatches.layer_costs(layer, one, h)
    assert costs.flops == flops.program(jax.make_jaxpr(layer)(one, h))
    width, hidden = params["w1"].shape[1:]
    assert costs.flops >= 2 * 2 * x.shape[0] * width * hidden  # its two matmuls at least
    assert costs.activation_bytes == x.nbytes
    assert costs.weight_bytes == sum(a.nbytes for a in jax.tree.leaves(params)) / len(params["b"])
    # the hidden activations the backward pass reads, never the weights
    assert x.shape[0] * hidden * 4 <= costs.residual_bytes < 10 * x.shape[0] * hidden * 4


def test_a_layer_with_a_cond_is_priced_at_its_dearest_branch() -> None:
    w = jnp.ones((16, 16))

    def branchy(p, h):
        return jax.lax.cond(h.sum() > 0, lambda v: v @ p @ p, lambda v: v, h)

    costs = microbatches.layer_costs(branchy, w, jax.ShapeDtypeStruct((8, 16), w.dtype))
    assert costs.flops >= 2 * (2 * 8 * 16 * 16)


def test_the_choice_is_kept_with_autos_and_forgotten_by_clear_caches(mesh) -> None:
    """The pipeline kept its choices in a dict of its own, unbounded, which
    ``partitioner.clear_caches()`` did not clear."""
    params, (x, _) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage")
    partitioner.clear_caches()
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        first = run.plan(params, x)
        assert searched.size() == 1
        assert run.plan(params, x).estimates is first.estimates  # kept
        partitioner.clear_caches()
        assert searched.size() == 0
        again = run.plan(params, x)
    assert again.estimates is not first.estimates  # chosen anew
    assert again.estimates == first.estimates


def test_the_cache_is_bounded_least_recently_used_out_first() -> None:
    searched.clear()
    for k in range(searched.SIZE + 5):
        searched.once(("test", k), lambda k=k: k)
    assert searched.size() == searched.SIZE
    made = []
    assert searched.once(("test", 0), lambda: made.append(0) or -1) == -1  # pushed out
    assert searched.once(("test", searched.SIZE + 4), lambda: made.append(1)) == searched.SIZE + 4
    assert made == [0]
    searched.clear()


def test_memory_estimates_rank_as_xla_measures_them(mesh) -> None:
    """The model's memory for two options (saving activations or inputs) ranks them as
    XLA's memory analysis of the compiled training steps does."""
    from .test_pipeline import train_step

    params, (x, y) = stacked_params(), batch()
    measured, estimated = {}, {}
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        for saves in ("activations", "inputs"):
            run = partitioner.pipeline(layer, axis="stage", microbatches=2, saves=saves)
            f = partitioner.jit(train_step(run), in_shardings=(None, None, None))
            measured[saves] = f.lower(params, x, y).compile().report().memory.total
            estimated[saves] = run.plan(params, x).estimate.memory_bytes
    assert (measured["inputs"] < measured["activations"]) == (
        estimated["inputs"] < estimated["activations"]
    )
