"""The trace cache (``trace/tracing.py``, NOTE [trace cache key]): what retraces, what
does not, and that it keeps no user function alive.

Traces are counted with ``partitioner.recording()`` events, under each SPMD partitioner.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import jax
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, arange, devices, mesh_ctx

pytestmark = pytest.mark.usefixtures("partitioner_mode")


def test_fresh_wrapper_around_same_function_does_not_retrace() -> None:
    def f(x: Any) -> Any:
        return x + 3

    x = arange(8, 4)
    with mesh_ctx(*MESH_2D):
        jax.block_until_ready(pjit(f, P("a"), P("a"))(x))
        with partitioner.recording() as events:
            jax.block_until_ready(pjit(f, P("a"), P("a"))(x))
            jax.block_until_ready(pjit(f, jax.sharding.PartitionSpec("a"), P(("a",)))(x))
    assert events["trace"] == 0 and events["compile"] == 0


def test_equal_recreated_mesh_does_not_retrace() -> None:
    def f(x: Any) -> Any:
        return x * x

    x = arange(8, 4)
    g = pjit(f, P("a", "b"), P("a"))
    with partitioner.mesh(devices(4, 2), ("a", "b")):
        jax.block_until_ready(g(x))
    with partitioner.recording() as events:
        with partitioner.mesh(devices(4, 2), ("a", "b")):  # equal, newly built
            jax.block_until_ready(g(x))
        with partitioner.mesh(np.array(jax.devices()[:8]).reshape(4, 2), ["a", "b"]):
            jax.block_until_ready(g(x))
    assert events["trace"] == 0 and events["compile"] == 0


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
def test_jax_mesh_equal_to_ours_does_not_retrace(mesh: MeshFactory) -> None:
    def f(x: Any) -> Any:
        return x - 1

    x = arange(8, 4)
    g = pjit(f, P("a"), P("a"))
    with partitioner.mesh(devices(4, 2), ("a", "b")):
        jax.block_until_ready(g(x))
    with partitioner.recording() as events:
        with mesh(*MESH_2D):
            jax.block_until_ready(g(x))
    assert events["trace"] == 0 and events["compile"] == 0


def test_new_shape_retraces_then_both_are_cached() -> None:
    def f(x: Any) -> Any:
        return x.sum(0)

    g = pjit(f, P("a"), None)
    with mesh_ctx(*MESH_2D):
        with partitioner.recording() as events:
            for n in (8, 16, 8, 16):
                jax.block_until_ready(g(arange(n, 2)))
    assert events["trace"] == 2 and events["compile"] == 2


def test_dropped_function_frees_its_trace() -> None:
    def make() -> Any:
        def f(x: Any) -> Any:
            return x + 1

        return f

    f = make()
    ref = weakref.ref(f)
    with mesh_ctx(*MESH_2D):
        jax.block_until_ready(pjit(f, P("a"), P("a"))(arange(8, 4)))
    del f
    gc.collect()
    assert ref() is None, "the trace cache must not keep user functions alive"
