"""The one flop counter (``auto/cost/flops.py``), against hand counts and XLA's cost analysis.

AUTO's cost model and the pipeline's microbatch choice both price work with it, so
a body in a ``cond``, a ``scan`` or a ``while`` must count as XLA runs it: a scan's
body ``length`` times, a ``fori_loop``'s its trips, a ``cond`` its dearest branch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partitioner._src.auto.cost import flops


def xla_flops(f, *args) -> float:
    """XLA's own count for ``f`` compiled by jax.jit (one device)."""
    return float(jax.jit(f).lower(*args).compile().cost_analysis()["flops"])


def test_a_matmul_counts_two_flops_per_multiply_add_as_xla_does() -> None:
    a, b = np.ones((32, 64), np.float32), np.ones((64, 16), np.float32)
    counted = flops.program(jax.make_jaxpr(jnp.matmul)(a, b))
    assert counted == 2 * 32 * 64 * 16 == xla_flops(jnp.matmul, a, b)


def test_a_scan_body_counts_once_per_step_as_xla_runs_it() -> None:
    w = np.ones((8, 16, 16), np.float32)
    x = np.ones((4, 16), np.float32)

    def stack(w, x):
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]

    def unrolled(w, x):
        for wi in w:
            x = jnp.tanh(x @ wi)
        return x

    counted = flops.program(jax.make_jaxpr(stack)(w, x))
    one_layer = 2 * 4 * 16 * 16 + 4 * 16  # the matmul, then tanh per element
    assert counted == 8 * one_layer
    # XLA's cost analysis counts a loop's body once: its figure for the same layers
    # unrolled (its element-wise weights differ from one per element: tanh is dear).
    assert counted == pytest.approx(xla_flops(unrolled, w, x), rel=0.05)


def test_a_cond_counts_its_dearest_branch() -> None:
    """The pipeline's old counter skipped a cond's branches (one flop per result
    element); AUTO charged the dearest. One counter now, the dearest."""
    x = np.ones((16, 16), np.float32)

    def branchy(p, x):
        return jax.lax.cond(p, lambda v: v @ v @ v, lambda v: v + 1.0, x)

    counted = flops.program(jax.make_jaxpr(branchy)(True, x))
    dear = flops.program(jax.make_jaxpr(lambda v: v @ v @ v)(x))
    assert dear == 2 * (2 * 16 * 16 * 16) == xla_flops(lambda v: v @ v @ v, x)
    # the dearest branch, and the predicate's conversion: not the cheap branch's 256 too
    assert dear <= counted < dear + 16 * 16


def test_a_fori_loop_counts_its_trips() -> None:
    x = np.ones((8, 8), np.float32)

    def loop(x):
        return jax.lax.fori_loop(0, 5, lambda i, v: v @ v, x)

    def unrolled(x):
        for _ in range(5):
            x = x @ x
        return x

    counted = flops.program(jax.make_jaxpr(loop)(x))
    assert counted >= 5 * 2 * 8 * 8 * 8  # the bodies' matmuls (and the counter's add)
    assert counted == pytest.approx(xla_flops(unrolled, x), rel=0.05)


def test_layout_moves_do_no_work_and_a_reduction_counts_its_operand() -> None:
    x = np.ones((8, 32), np.float32)
    assert flops.program(jax.make_jaxpr(lambda v: v.T.reshape(16, 16))(x)) == 0
    assert flops.program(jax.make_jaxpr(lambda v: v.sum(axis=1))(x)) == 8 * 32
