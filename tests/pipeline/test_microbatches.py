"""The microbatch choice (NOTE [pipeline microbatches]) on its own: a pure function of
the schedule's arithmetic, AUTO's rates and AUTO's flop counter, kept in AUTO's cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import partitioner
from partitioner._src.auto import choices
from partitioner._src.auto.cost import flops
from partitioner._src.auto.cost.rates import BYTES_PER_S, FLOPS_PER_S, LATENCY_S
from partitioner._src.pipeline import microbatches
from partitioner._src.pipeline.schedule import Schedule

from .test_pipeline import batch, layer, mesh_of, stacked_params


def _time(kind: str, layers: int, stages: int, count: int, work: float, traffic: float) -> float:
    """The estimate written out by hand from NOTE [pipeline microbatches]."""
    s = Schedule(kind, layers, stages, count)
    step = (s.per_visit * work / FLOPS_PER_S + traffic / BYTES_PER_S) / count + LATENCY_S
    return step * s.steps


def test_every_divisor_of_the_batch_is_priced_and_the_least_time_chosen() -> None:
    for kind, work, traffic in [("gpipe", 1e9, 1e6), ("circular", 2e8, 4e5), ("gpipe", 1e3, 1e3)]:
        chosen, options = microbatches.choose(kind, 8, 4, 32, work, traffic)
        assert [o.microbatches for o in options] == [1, 2, 4, 8, 16, 32]
        for option in options:
            want = _time(kind, 8, 4, option.microbatches, work, traffic)
            assert np.isclose(option.estimate.time_s, want, rtol=1e-12)
            s = Schedule(kind, 8, 4, option.microbatches)
            assert option.bubble_fraction == s.bubble_fraction
            assert option.estimate.collectives == s.steps  # one permute per step
        best = min(o.estimate.time_s for o in options)
        (mine,) = [o for o in options if o.microbatches == chosen]
        assert mine.estimate.time_s <= best * (1 + microbatches.TIE)
        # ties go to more microbatches (less memory per step)
        tied = [
            o.microbatches for o in options if o.estimate.time_s <= best * (1 + microbatches.TIE)
        ]
        assert chosen == max(tied)


def test_dear_layers_want_many_microbatches_and_cheap_ones_few() -> None:
    """The bubble is what dear layers pay for; the fixed cost per step is what cheap
    ones pay for."""
    dear, _ = microbatches.choose("gpipe", 8, 4, 64, 1e12, 1e3)
    cheap, _ = microbatches.choose("gpipe", 8, 4, 64, 1.0, 1.0)
    assert dear == 64 and cheap == 1


def test_a_layers_work_is_the_flop_counters() -> None:
    params, (x, _) = stacked_params(), batch()
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), params)
    h = jax.ShapeDtypeStruct(x.shape, x.dtype)
    got = microbatches.layer_flops(layer, one, h)
    assert got == flops.program(jax.make_jaxpr(layer)(one, h))
    width, hidden = params["w1"].shape[1:]
    assert got >= 2 * 2 * x.shape[0] * width * hidden  # its two matmuls at least


def test_the_choice_is_kept_with_autos_and_forgotten_by_clear_caches() -> None:
    """The pipeline kept its choices in a dict of its own, unbounded, which
    ``partitioner.clear_caches()`` did not clear."""
    params, (x, _) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage")
    partitioner.clear_caches()
    with jax.set_mesh(mesh_of(("stage", "data"))):
        first = run.plan(params, x)
        assert choices.size() == 1
        assert run.plan(params, x).estimates is first.estimates  # kept
        partitioner.clear_caches()
        assert choices.size() == 0
        again = run.plan(params, x)
    assert again.estimates is not first.estimates  # chosen anew
    assert again.estimates == first.estimates


def test_the_cache_is_bounded_least_recently_used_out_first() -> None:
    choices.clear()
    for k in range(choices.SIZE + 5):
        choices.chosen(("test", k), lambda k=k: k)
    assert choices.size() == choices.SIZE
    made = []
    assert choices.chosen(("test", 0), lambda: made.append(0) or -1) == -1  # pushed out
    assert choices.chosen(("test", choices.SIZE + 4), lambda: made.append(1)) == choices.SIZE + 4
    assert made == [0]
    choices.clear()


def test_a_layer_with_a_cond_is_priced_at_its_dearest_branch() -> None:
    w = jnp.ones((16, 16))

    def branchy(p, h):
        return jax.lax.cond(h.sum() > 0, lambda v: v @ p @ p, lambda v: v, h)

    cond_flops = microbatches.layer_flops(branchy, w, jax.ShapeDtypeStruct((8, 16), w.dtype))
    assert cond_flops >= 2 * (2 * 8 * 16 * 16)
