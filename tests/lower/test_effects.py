"""Ordered effects inside pjit: tokens through ``main``, runtime tokens across calls.

jax's ordered effects that XLA may shard (``io_callback(ordered=True)``) run in call
order on 8 devices; those it may not (``jax.debug.callback(ordered=True)``) work on
one device and get jax.jit's clear ValueError on more.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import io_callback

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from tests.helpers import devices

pytestmark = pytest.mark.usefixtures("partitioner_mode")


def test_ordered_io_callback_on_8_devices_runs_in_call_order() -> None:
    seen: list[float] = []

    def f(x: Any) -> Any:
        io_callback(lambda v: seen.append(float(v)), None, x.sum(), ordered=True)
        return x + 1

    with partitioner.mesh(devices(8), ("x",)):
        g = pjit(f, P("x"), P("x"))
        outs = [g(np.arange(8.0) + i) for i in range(20)]
        jax.effects_barrier()
    assert seen == [float(np.sum(np.arange(8.0) + i)) for i in range(20)]
    np.testing.assert_array_equal(np.asarray(outs[-1]), np.arange(8.0) + 20)


def test_ordered_debug_callback_on_one_device() -> None:
    seen: list[float] = []

    def f(x: Any) -> Any:
        jax.debug.callback(lambda v: seen.append(float(v)), x.sum(), ordered=True)
        return x * 2

    with partitioner.mesh(devices(1), ("x",)):
        g = pjit(f, P("x"), P("x"))
        for i in range(3):
            g(np.arange(4.0) + i)
        jax.effects_barrier()
    assert seen == [6.0, 10.0, 14.0]


def test_ordered_debug_callback_on_8_devices_is_a_clear_error() -> None:
    def f(x: Any) -> Any:
        jax.debug.callback(lambda v: None, x.sum(), ordered=True)
        return x

    with partitioner.mesh(devices(8), ("x",)), pytest.raises(ValueError) as info:
        pjit(f, P("x"), P("x"))(np.arange(8.0))
    assert "ordered effects are not supported for more than 1 device" in str(info.value)
