"""Dispatch: fast paths, the executable cache (compile once, bounded, weak) and the CPU window."""

from __future__ import annotations

import gc
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner as pt
from partitioner import PartitionSpec as P
from partitioner._testing import (
    MAX_IN_FLIGHT,
    ExecutableCache,
    current_mesh,
    executable_cache,
    runs_windowed,
)
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, arange


@pytest.fixture(params=["cpp", "python"])
def dispatch_path(request):
    with pt.options.fast_path(request.param == "cpp"):
        yield request.param


@pytest.fixture
def mesh8(mesh: MeshFactory):
    ab = mesh(*MESH_2D)
    with pt.mesh(ab.devices, ab.axis_names) as m:
        yield m


def _f(x, y):
    return jnp.sin(x) * 2 + y, x.sum()


def test_fast_paths_match_jax_jit(dispatch_path, mesh8, partitioner_mode):
    f = pt.pjit(_f, in_axis_resources=(P("a"), P("a", "b")), out_axis_resources=(P("a", "b"), None))
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    want = jax.jit(_f)(x, x)
    for _ in range(3):  # miss, then hits
        got = jax.block_until_ready(f(x, x))
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    assert got[0].sharding.is_equivalent_to(NamedSharding(mesh8, P("a", "b")), 2)


def test_cached_calls_skip_planning(dispatch_path, mesh8):
    f = pt.pjit(lambda x: x * 3, in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = jax.device_put(np.ones((8, 2), np.float32), NamedSharding(mesh8, P("a")))
    jax.block_until_ready(f(x))
    with pt.recording() as events:
        for _ in range(20):
            jax.block_until_ready(f(x))
    assert events["dispatch_miss"] == 0 and events["trace"] == 0 and events["compile"] == 0


def test_new_signature_misses_and_reshard_still_hits_executable(dispatch_path, mesh8):
    pt.clear_caches()  # no equal program compiled by an earlier test (NOTE [executable cache])
    f = pt.pjit(lambda x: x + 1, in_axis_resources=P("a"), out_axis_resources=P("a"))
    base = np.arange(16, dtype=np.float32).reshape(8, 2)
    jax.block_until_ready(f(base))
    # A committed input laid out differently (moving it opted into) is resharded
    # on the slow path every time, but never recompiled. It is traced once: typed
    # over the mesh (as jax.jit types a committed value), lowered as the numpy call.
    other = jax.device_put(base, NamedSharding(mesh8, P(None, "b")))
    with pt.recording() as events, pt.options.reshard_committed():
        for _ in range(3):
            out = jax.block_until_ready(f(other))
    np.testing.assert_array_equal(np.asarray(out), base + 1)
    assert events["compile"] == 0 and events["trace"] == 1
    assert events["dispatch_miss"] == 3
    # A new shape is a new signature: traced and compiled once.
    with pt.recording() as events:
        jax.block_until_ready(f(np.ones((16, 2), np.float32)))
        jax.block_until_ready(f(np.ones((16, 2), np.float32)))
    assert events["trace"] == 1 and events["compile"] == 1


def test_static_and_keyword_arguments_on_fast_path(dispatch_path, mesh8):
    def g(x, n, *, scale):
        return x * n * scale

    f = pt.pjit(g, in_axis_resources=P("a"), out_axis_resources=P("a"), static_argnums=1)
    x = np.ones((8,), np.float32)
    for n in (2, 3, 2):
        np.testing.assert_allclose(np.asarray(f(x, n, scale=0.5)), x * n * 0.5)
    with pt.recording() as events:
        np.testing.assert_allclose(np.asarray(f(x, 3, scale=0.5)), x * 1.5)
    assert events["compile"] == 0


def test_partitioner_choice_is_part_of_the_key(mesh8):
    pt.clear_caches()  # no equal program compiled by an earlier test
    f = pt.pjit(lambda x: x + 2, in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = np.ones((8,), np.float32)
    with pt.spmd_partitioner("shardy"):
        jax.block_until_ready(f(x))
    with pt.spmd_partitioner("gspmd"), pt.recording() as events:
        jax.block_until_ready(f(x))
        jax.block_until_ready(f(x))
    assert events["compile"] == 1
    with pt.spmd_partitioner("gspmd"):
        assert "mhlo.sharding" in f.lower(x).as_text()


def test_compile_once_under_threads(mesh8):
    pt.clear_caches()  # no equal program compiled by an earlier test

    def body(x):
        return jnp.cos(x) + 1

    f = pt.pjit(body, in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = np.ones((8, 4), np.float32)
    barrier = threading.Barrier(6)
    results, errors = [], []
    current = current_mesh("test")

    def worker():
        try:
            with pt.mesh(current.devices, current.axis_names):
                barrier.wait()
                results.append(np.asarray(jax.block_until_ready(f(x))))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    with pt.recording() as events:
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert len(results) == 6
    assert events["compile"] == 1
    for r in results:
        np.testing.assert_allclose(r, np.cos(x) + 1, rtol=1e-6)


def test_cache_compile_error_reaches_every_waiter_and_is_cached():
    cache = ExecutableCache()
    owner = type("Owner", (), {})()
    calls = []
    started = threading.Event()

    def failing():
        calls.append(1)
        started.set()
        time.sleep(0.2)
        raise ValueError("XLA said no: original message")

    errors = []

    def call():
        try:
            cache.get_or_compile(owner, "k", failing)
        except ValueError as e:
            errors.append(str(e))

    first = threading.Thread(target=call)
    first.start()
    started.wait(5)
    waiters = [threading.Thread(target=call) for _ in range(3)]
    for t in waiters:
        t.start()
    for t in [first, *waiters]:
        t.join(10)
    assert errors == ["XLA said no: original message"] * 4
    with pytest.raises(ValueError, match="original message"):
        cache.get_or_compile(owner, "k", failing)
    assert len(calls) == 1


def test_cache_reentrant_compile_does_not_deadlock():
    cache = ExecutableCache()
    owner = type("Owner", (), {})()

    def inner():
        return "inner"

    def outer():
        # A compile that needs another entry compiles it inline...
        value, _ = cache.get_or_compile(owner, "inner", inner)
        return f"outer({value})"

    assert cache.get_or_compile(owner, "outer", outer) == ("outer(inner)", True)

    def recursive():
        # ...but one that needs *itself* is an error, not a hang.
        return cache.get_or_compile(owner, "self", recursive)

    with pytest.raises(RuntimeError, match="re-entered"):
        cache.get_or_compile(owner, "self", recursive)


def test_pjit_traced_inside_another_pjit_compile_path(mesh8):
    inner = pt.pjit(lambda x: x * 2, in_axis_resources=P("a"), out_axis_resources=P("a"))

    def outer_body(x):
        # Tracing this body calls an eager pjit on a constant: a compile
        # nested in a trace must not deadlock the caches.
        c = inner(np.ones((8,), np.float32))
        return x + c.sum()

    outer = pt.pjit(outer_body, in_axis_resources=P("a"), out_axis_resources=P("a"))
    np.testing.assert_allclose(np.asarray(outer(np.zeros((8,), np.float32))), np.full((8,), 16.0))


def test_cache_is_bounded_lru():
    cache = ExecutableCache(capacity=2)
    owner = type("Owner", (), {})()
    for k in "abc":
        cache.get_or_compile(owner, k, lambda k=k: k)
    assert len(cache) == 2
    _, missed = cache.get_or_compile(owner, "a", lambda: "a2")
    assert missed  # "a" was the least recently used, so it was evicted


def test_dropped_function_frees_its_executables(mesh8):
    gc.collect()
    before = len(executable_cache)

    def make_and_call():
        def local(x):
            return x * 5 + 1

        f = pt.pjit(local, in_axis_resources=P("a"), out_axis_resources=P("a"))
        jax.block_until_ready(f(np.ones((8,), np.float32)))

    make_and_call()
    gc.collect()
    assert len(executable_cache) == before


def test_clear_caches_forces_recompile(mesh8):
    f = pt.pjit(lambda x: x - 1, in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = np.ones((8,), np.float32)
    jax.block_until_ready(f(x))
    pt.clear_caches()
    with pt.recording() as events:
        jax.block_until_ready(f(x))
    assert events["trace"] == 1 and events["compile"] == 1


def test_many_unblocked_collective_launches_do_not_hang(dispatch_path, mesh8):
    """NOTE [CPU collective window]: 500 in-flight calls of a program with an all-reduce.

    Plain jax.jit hangs XLA's CPU rendezvous past ~32 in flight; the collective
    timeout flags in conftest.py turn a regression into an abort, not a hang.
    """
    f = pt.pjit(lambda x: x - x.sum(), in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = jax.block_until_ready(f(np.ones((64,), np.float32)))
    assert runs_windowed(f, x)
    with pt.recording() as events:
        outs = [f(x) for _ in range(500)]
    jax.block_until_ready(outs)
    # One wait per MAX_IN_FLIGHT launches, whichever dispatch path ran them.
    assert abs(events["window_wait"] - 500 // MAX_IN_FLIGHT) <= 2
    want = np.ones(64, np.float32) - 64
    want = want - want.sum()
    np.testing.assert_allclose(np.asarray(outs[-1]), want)


def test_programs_without_collectives_are_not_windowed(mesh8):
    f = pt.pjit(lambda x: x * 2, in_axis_resources=P("a"), out_axis_resources=P("a"))
    x = np.ones((8,), np.float32)
    assert not runs_windowed(f, x)


def test_calling_with_a_donated_array_raises_not_crashes(dispatch_path, mesh8):
    f = pt.pjit(
        lambda x: x * 2, in_axis_resources=P("a"), out_axis_resources=P("a"), donate_argnums=0
    )
    x = jax.device_put(np.ones((8,), np.float32), NamedSharding(mesh8, P("a")))
    jax.block_until_ready(f(x))
    assert x.is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        f(x)


def test_vmap_of_pjit_and_pjit_of_vmap_share_one_executable(mesh8):
    """Equal layouts, equal keys (NOTE [executable cache]): one compile serves both."""
    pt.clear_caches()  # no equal program compiled by an earlier test

    def f(x):
        return jnp.sin(x) * 2 + x.sum()

    x = arange(3, 8)
    want = jax.vmap(f)(x)
    with pt.recording() as events:
        a = jax.vmap(pt.pjit(f, P("a"), P("a")))(x)  # the batch dim inserted by our rule
        b = pt.pjit(jax.vmap(f), P(None, "a"), P(None, "a"))(x)  # written by the user
    assert events["compile"] == 1, events
    np.testing.assert_allclose(np.asarray(a), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(b), np.asarray(want), rtol=1e-6)
    assert a.sharding.is_equivalent_to(b.sharding, 2)


def test_a_windowed_call_traced_inside_jax_jit_leaves_no_tracer_in_the_window(mesh8):
    """Called under jax.jit, the guarded C++ path binds the primitive: its tracer output is
    no launch to wait for (a small tracer kept as the marker made a later call raise)."""
    f = pt.pjit(lambda x: x.sum(), in_axis_resources=P("a"))
    x = np.ones((64,), np.float32)
    assert runs_windowed(f, x)
    jax.block_until_ready(f(x))
    jax.block_until_ready(f(x))  # the C++ path is guarded from here on
    for n in range(1, 2 * MAX_IN_FLIGHT):  # a new jax.jit each time: f traced inside it
        jax.block_until_ready(jax.jit(lambda v, n=n: f(v) * n)(x))
        out = f(x)
    np.testing.assert_allclose(np.asarray(out), np.float32(64))
