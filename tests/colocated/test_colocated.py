"""colocated_python in one process over 8 devices (seed 002).

Values are compared with numpy on the same inputs. Asynchrony and ordering are
checked with events the function waits on, not with timings: a call that
returns while its function is still blocked has returned before the function
ran. The two-process semantics are in tests/distributed/test_colocated_mp.py.
"""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import Any

import flax.linen as flax_linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import _testing as testing
from partitioner import colocated_python, colocated_python_class, pjit
from partitioner.testing.plugin import MeshFactory
from tests.helpers import devices

WAIT_S = 30.0  # a bound on every wait, so a regression fails instead of hanging


def put(x: Any, mesh: Mesh, spec: P) -> jax.Array:
    return jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))


def doubled(a: jax.Array) -> jax.Array:
    """``2 * a`` computed on the host, laid out as ``a``."""
    return jax.device_put(np.asarray(a) * 2, a.sharding)


# --- semantics ---


def test_runs_once_per_call_on_the_arguments_as_given(mesh_4x2: Mesh) -> None:
    x = put(np.arange(32.0).reshape(8, 4), mesh_4x2, P("data", "model"))
    y = put(np.ones(4, np.int32), mesh_4x2, P())
    seen: list[tuple[Any, ...]] = []

    @colocated_python
    def f(a: jax.Array, *, b: jax.Array) -> dict[str, jax.Array]:
        seen.append((a.shape, a.sharding, b.shape, b.dtype))
        return {"a": doubled(a), "sum": jax.device_put(np.asarray(b).sum(), b.sharding)}

    for call in range(3):
        out = f(x, b=y)
        np.testing.assert_array_equal(np.asarray(out["a"]), np.asarray(x) * 2)
        assert out["a"].sharding.is_equivalent_to(x.sharding, 2)
        assert int(out["sum"]) == 4 and out["sum"].sharding.is_equivalent_to(y.sharding, 0)
        assert len(seen) == call + 1
    assert seen[0] == ((8, 4), x.sharding, (4,), np.int32)


def test_a_call_returns_before_the_function_has_run(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    release, started = threading.Event(), threading.Event()

    @colocated_python
    def f(a: jax.Array) -> jax.Array:
        started.set()
        assert release.wait(WAIT_S)
        return doubled(a)

    g = f.specialize(out_specs_fn=lambda a: a)  # so even the first call is asynchronous
    out = g(x)
    assert started.wait(WAIT_S)
    assert not release.is_set()  # the call returned; the function is still waiting
    assert isinstance(out, jax.Array) and out.shape == (16,)
    release.set()
    np.testing.assert_array_equal(np.asarray(out), np.arange(16.0) * 2)


def test_without_out_specs_fn_the_first_call_discovers_the_outputs_and_later_ones_are_async(
    mesh_4x2: Mesh,
) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    release = threading.Event()
    ran: list[int] = []

    @colocated_python
    def f(a: jax.Array) -> jax.Array:
        if ran:
            assert release.wait(WAIT_S)
        ran.append(1)
        return doubled(a)

    first = f(x)
    assert ran == [1]  # ran before the call returned: the output layout is learnt from it
    second = f(x)
    assert ran == [1]  # waiting for release: the call returned first
    release.set()
    np.testing.assert_array_equal(np.asarray(second), np.asarray(first))
    assert ran == [1, 1]


def test_successive_calls_on_the_same_devices_run_in_call_order(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    order: list[int] = []
    gate = threading.Event()

    @colocated_python
    def f(a: jax.Array, k: jax.Array) -> jax.Array:
        assert gate.wait(WAIT_S)
        order.append(int(k))
        return jax.device_put(np.asarray(a) * int(k), a.sharding)

    g = f.specialize(out_specs_fn=lambda a, k: a)
    ks = [put(np.int32(k), mesh_4x2, P()) for k in range(12)]
    outs = [g(x, k) for k in ks]
    assert order == []
    gate.set()
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), np.arange(16.0) * k)
    assert order == list(range(12))


def test_device_work_on_the_same_devices_goes_on_while_the_function_runs(mesh_4x2: Mesh) -> None:
    x = put(np.arange(32.0).reshape(8, 4), mesh_4x2, P("data", "model"))
    release = threading.Event()

    @colocated_python
    def slow(a: jax.Array) -> jax.Array:
        assert release.wait(WAIT_S)
        return doubled(a)

    g = slow.specialize(out_specs_fn=lambda a: a)
    step = pjit(lambda v: jnp.tanh(v @ v.T).sum(0), P("data", "model"), P("data"))
    with partitioner.mesh(mesh_4x2.devices, mesh_4x2.axis_names):
        pending = g(x)
        for _ in range(3):  # collectives over all 8 devices, while every device's callback waits
            got = step(x).block_until_ready()
    assert not release.is_set()
    xs = np.asarray(x)
    np.testing.assert_allclose(np.asarray(got), np.tanh(xs @ xs.T).sum(0), rtol=1e-6)
    release.set()
    np.testing.assert_array_equal(np.asarray(pending), xs * 2)


def test_outputs_feed_a_pjit_step(mesh_4x2: Mesh) -> None:
    """The loader idiom in one process: a colocated function makes the batch."""
    step_no = put(np.int32(0), mesh_4x2, P())

    @colocated_python
    def batch(k: jax.Array) -> jax.Array:
        rows = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) + int(k)
        return jax.device_put(rows, NamedSharding(mesh_4x2, P("data")))

    train = pjit(lambda b, w: jnp.sum(jnp.tanh(b @ w)), (P("data"), P()), P())
    w = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    with partitioner.mesh(mesh_4x2.devices, mesh_4x2.axis_names):
        for k in range(3):
            loss = train(batch(step_no + k), w)
            rows = np.arange(32, dtype=np.float32).reshape(8, 4) + k
            np.testing.assert_allclose(float(loss), np.tanh(rows @ w).sum(), rtol=1e-5)


def test_outputs_may_live_on_another_layout_of_the_devices(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    one = NamedSharding(mesh_4x2, P())

    @colocated_python
    def stats(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        v = np.asarray(a)
        first = jax.device_put(v[:1], jax.sharding.SingleDeviceSharding(devices(8)[3]))
        return jax.device_put(np.stack([v.min(), v.max()]), one), first

    (bounds, first) = stats(x)
    np.testing.assert_array_equal(np.asarray(bounds), [0.0, 15.0])
    assert bounds.sharding.is_equivalent_to(one, 1)
    assert first.devices() == {devices(8)[3]} and float(first[0]) == 0.0


@pytest.mark.needs_devices(8)
def test_a_call_without_inputs_runs_on_the_devices_it_was_specialized_to() -> None:
    dev = devices(8)[5]

    @colocated_python
    def make() -> jax.Array:
        return jax.device_put(np.arange(6, dtype=np.int32), dev)

    out = make.specialize(devices=[dev])()
    np.testing.assert_array_equal(np.asarray(out), np.arange(6))
    assert out.devices() == {dev}


# --- errors ---


def test_an_exception_surfaces_where_an_output_is_consumed_and_does_not_poison_later_calls(
    mesh_4x2: Mesh,
) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    fail = [True]

    @colocated_python
    def flaky(a: jax.Array) -> jax.Array:
        if fail[0]:
            raise KeyError("no such shard")
        return doubled(a)

    g = flaky.specialize(out_specs_fn=lambda a: a)
    out = g(x)  # returns: the error is not raised at the call
    message = "colocated_python function 'flaky' raised KeyError: 'no such shard'"
    with pytest.raises(Exception, match=message):
        out.block_until_ready()
    with pytest.raises(Exception, match=message):
        np.asarray(g(x))
    fail[0] = False
    np.testing.assert_array_equal(np.asarray(g(x)), np.arange(16.0) * 2)


def test_an_exception_in_the_discovery_call_is_raised_at_the_call(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))

    @colocated_python
    def broken(a: jax.Array) -> jax.Array:
        raise ZeroDivisionError("bad batch")

    with pytest.raises(ZeroDivisionError, match="bad batch"):
        broken(x)


@pytest.mark.parametrize(
    ("args", "where"),
    [((np.ones(4),), r"args\[0\] is ndarray"), ((3.0,), r"args\[0\] is float")],
)
def test_an_argument_that_is_not_a_jax_array_is_a_value_error(args: Any, where: str) -> None:
    f = colocated_python(lambda a: a)
    with pytest.raises(ValueError, match=f"only supports jax.Array.*{where}"):
        f(*args)


def test_arguments_on_different_device_lists_are_a_value_error(
    mesh_4x2: Mesh, mesh: MeshFactory
) -> None:
    a = put(np.arange(8.0), mesh_4x2, P("data"))
    other = mesh((4,), ("x",))
    b = put(np.arange(8.0), other, P("x"))
    with pytest.raises(ValueError, match="same device list.*multiple device lists"):
        colocated_python(lambda a, b: a)(a, b)


def test_a_call_without_inputs_and_without_devices_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="without input arguments.*specialized with devices"):
        colocated_python(lambda: None)()


def test_outputs_that_disagree_with_out_specs_fn_are_a_clear_error(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))

    @colocated_python
    def half(a: jax.Array) -> jax.Array:
        return jax.device_put(np.asarray(a)[:8], a.sharding)

    g = half.specialize(out_specs_fn=lambda a: a)
    with pytest.raises(
        Exception, match=r"output 0 is float32\[8\].*output spec says float32\[16\]"
    ):
        np.asarray(g(x))

    wrong_tree = colocated_python(lambda a: (a, a)).specialize(out_specs_fn=lambda a: a)
    with pytest.raises(Exception, match="returned PyTreeDef.*output specs say PyTreeDef"):
        np.asarray(wrong_tree(x))

    no_sharding = colocated_python(lambda a: a).specialize(
        out_specs_fn=lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    )
    with pytest.raises(ValueError, match="has no sharding"):
        no_sharding(x)


def test_each_field_can_be_specialized_once(mesh_4x2: Mesh) -> None:
    f = colocated_python(lambda a: a)
    spec = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(mesh_4x2, P("data")))
    g = f.specialize(in_specs=((spec,), {}), out_specs_fn=lambda a: a, devices=devices(8))
    with pytest.raises(ValueError, match="in_specs already specified"):
        g.specialize(in_specs=((spec,), {}))
    with pytest.raises(ValueError, match="out_specs_fn already specified"):
        g.specialize(out_specs_fn=lambda a: a)
    with pytest.raises(ValueError, match="devices already specified"):
        g.specialize(devices=devices(8))
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    np.testing.assert_array_equal(np.asarray(g(x)), np.arange(16.0))
    with pytest.raises(ValueError, match=r"argument leaf 0 is .*\(8,\).*specialized to in_specs"):
        g(put(np.arange(8.0), mesh_4x2, P("data")))


def test_bad_specializations_are_rejected(mesh_4x2: Mesh) -> None:
    f = colocated_python(lambda a: a)
    with pytest.raises(TypeError, match="out_specs_fn must be callable"):
        f.specialize(out_specs_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty sequence of jax.Device"):
        f.specialize(devices=["cpu:0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="fun must be callable"):
        colocated_python(42)  # type: ignore[arg-type]


# --- caches (NOTE [specialization caches]) ---


def test_weak_and_strong_cache_hits_and_clear_caches(mesh_4x2: Mesh) -> None:
    @colocated_python
    def f(a: jax.Array) -> jax.Array:
        return doubled(a)

    x = put(np.arange(16.0), mesh_4x2, P("data"))
    with partitioner.recording() as first:
        f(x).block_until_ready()
    assert first.get("colocated_specialize") == 1 and f.cache_size() == 1
    with partitioner.recording() as again:
        f(x).block_until_ready()
    assert again.get("colocated_weak_hit") == 1 and "colocated_specialize" not in again
    # An equal layout in a new sharding object: found by value, then by id.
    y = put(np.arange(16.0) + 1, Mesh(mesh_4x2.devices, mesh_4x2.axis_names), P("data"))
    assert y.sharding is not x.sharding
    with partitioner.recording() as strong:
        np.testing.assert_array_equal(np.asarray(f(y)), (np.arange(16.0) + 1) * 2)
    assert strong.get("colocated_strong_hit") == 1 and "colocated_specialize" not in strong
    with partitioner.recording() as weak:
        f(y).block_until_ready()
    assert weak.get("colocated_weak_hit") == 1
    assert f.cache_size() == 1
    # Another layout is another specialization.
    f(put(np.arange(16.0), mesh_4x2, P())).block_until_ready()
    assert f.cache_size() == 2

    jax.clear_caches()
    assert f.cache_size() == 0
    with partitioner.recording() as after:
        np.testing.assert_array_equal(np.asarray(f(x)), np.arange(16.0) * 2)
    assert after.get("colocated_specialize") == 1 and f.cache_size() == 1


def test_a_dropped_function_frees_its_entries(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))

    def body(a: jax.Array) -> jax.Array:
        return doubled(a)

    f = colocated_python(body)
    f(x).block_until_ready()
    f(x).block_until_ready()
    gone = weakref.ref(f)
    del f
    gc.collect()
    assert gone() is None


def test_a_colocated_function_may_call_another_on_its_devices(mesh_4x2: Mesh) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    inner = colocated_python(doubled)
    inner_async = colocated_python(doubled).specialize(out_specs_fn=lambda a: a)

    @colocated_python
    def outer(a: jax.Array) -> jax.Array:
        # Both run as part of this call (no wait on the worker running it) and are
        # consumed here.
        return jax.device_put(np.asarray(inner(a)) + np.asarray(inner_async(a)), a.sharding)

    for _ in range(2):  # the discovery call, then an asynchronous one
        np.testing.assert_array_equal(np.asarray(outer(x)), np.arange(16.0) * 4)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_calls_already_made_run_before_the_interpreter_exits(tmp_path: Any) -> None:
    """NOTE [colocated exit]: an effect queued just before exit is not lost."""
    script = tmp_path / "exit_now.py"
    out = tmp_path / "written.txt"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, time
            os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
            import jax, numpy as np
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
            import partitioner

            mesh = Mesh(np.array(jax.devices()), ("x",))
            x = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))

            @partitioner.colocated_python
            def write(a):
                time.sleep(0.05)
                with open({str(out)!r}, "a") as f:
                    f.write(f"{{float(np.asarray(a).sum())}}\\n")
                return a

            write = write.specialize(out_specs_fn=lambda a: a)
            for k in range(10):
                write(x + k)
            print("RETURNED", flush=True)  # then exit, with the calls queued
            """
        )
    )
    proc = subprocess.run(
        ["timeout", "-k", "5", "120", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RETURNED" in proc.stdout
    written = [float(v) for v in out.read_text().split()]
    assert written == [float(np.arange(8.0).sum() + 8 * k) for k in range(10)]


def test_a_function_without_outputs_runs_in_order_and_logs_its_error(
    mesh_4x2: Mesh, caplog: pytest.LogCaptureFixture
) -> None:
    x = put(np.arange(16.0), mesh_4x2, P("data"))
    seen: list[float] = []

    @colocated_python
    def record(a: jax.Array) -> None:
        total = float(np.asarray(a).sum())
        if total < 0:
            raise ValueError(f"negative total {total}")
        seen.append(total)

    assert record(x) is None  # the discovery call
    for k in range(1, 4):
        assert record(x + k) is None
    assert record(-x - 1) is None  # its error has no output to travel with: it is logged
    record(x)  # and one more after the failing one
    # Another function on the same devices: its first call runs after everything queued.
    np.asarray(colocated_python(lambda a: a)(x))
    assert seen == [120.0 + 16 * k for k in range(4)] + [120.0]
    assert "colocated_python function 'record' raised ValueError: negative total" in caplog.text


# --- real clients: flax and optax states, typed PRNG keys ---


def test_flax_params_and_an_optax_state_go_through_whole(mesh_4x2: Mesh) -> None:
    model = flax_linen.Dense(8)
    params = model.init(jax.random.key(0), jnp.ones((2, 4)))
    params = jax.device_put(params, NamedSharding(mesh_4x2, P()))
    state = optax.adamw(1e-3).init(params)  # its step count is an uncommitted array

    @colocated_python
    def squared_norms(p: Any, s: Any) -> Any:
        return jax.tree.map(
            lambda a: jax.device_put(np.sum(np.asarray(a) ** 2), a.sharding), (p, s)
        )

    for _ in range(2):  # the discovery call, then an asynchronous one
        got = squared_norms(params, state)
        want = jax.tree.map(lambda a: np.sum(np.asarray(a) ** 2), (params, state))
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_typed_prng_keys_in_and_out(mesh_4x2: Mesh) -> None:
    key = jax.device_put(jax.random.key(7), NamedSharding(mesh_4x2, P()))
    rows = NamedSharding(mesh_4x2, P("data"))

    def split(k: jax.Array) -> jax.Array:
        return jax.device_put(jax.random.split(k, 8), rows)

    want = jax.random.key_data(jax.random.split(jax.random.key(7), 8))
    discovered = colocated_python(split)
    declared = colocated_python(split).specialize(
        out_specs_fn=lambda k: jax.ShapeDtypeStruct((8,), k.dtype, sharding=rows)
    )
    for f in (discovered, discovered, declared):
        out = f(key)
        assert out.dtype == key.dtype and out.shape == (8,)
        assert out.sharding.is_equivalent_to(rows, 1)
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(out)), np.asarray(want))


# --- drop-in for jax.experimental.colocated_python ---

#: A function sleeping this long is promised (a promise costs well under it); one
#: that returns at once is waited for (NOTE [colocated execution]): both paths.
SLOW_S = 0.02
PATHS = pytest.mark.parametrize("slow", [False, True], ids=["waited", "promised"])


def maybe_slow(fun: Any, slow: bool) -> Any:
    def run(*args: Any) -> Any:
        if slow:
            time.sleep(SLOW_S)
        return fun(*args)

    return run


@PATHS
def test_outputs_keep_the_sharding_memory_kind_and_dtype_the_function_gave(
    mesh_4x2: Mesh, slow: bool
) -> None:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[3])
    pinned_one = jax.sharding.SingleDeviceSharding(jax.devices()[3], memory_kind="pinned_host")
    pinned_rows = NamedSharding(mesh_4x2, P("data"), memory_kind="pinned_host")
    key = jax.device_put(jax.random.key(5), one)
    x = jax.device_put(np.arange(8.0, dtype=np.float32), one)

    def outputs(k: jax.Array, a: jax.Array) -> dict[str, jax.Array]:
        return {
            "key": jax.random.split(k)[0],  # a typed key on one device
            "one": jax.device_put(np.arange(3, dtype=np.int16), pinned_one),
            "rows": jax.device_put(np.asarray(a) + 1, pinned_rows),
            "bf16": jax.device_put(np.asarray(a).astype(jnp.bfloat16), a.sharding),
        }

    def declared(k: Any, a: Any) -> dict[str, jax.ShapeDtypeStruct]:
        return {
            "key": jax.ShapeDtypeStruct((), k.dtype, sharding=one),
            "one": jax.ShapeDtypeStruct((3,), np.int16, sharding=pinned_one),
            "rows": jax.ShapeDtypeStruct((8,), a.dtype, sharding=pinned_rows),
            "bf16": jax.ShapeDtypeStruct((8,), jnp.bfloat16, sharding=x.sharding),
        }

    want_key = jax.random.key_data(jax.random.split(jax.random.key(5))[0])
    discovered = colocated_python(maybe_slow(outputs, slow))
    specified = colocated_python(maybe_slow(outputs, slow)).specialize(out_specs_fn=declared)
    for f in (discovered, discovered, discovered, specified, specified):
        out = f(key, x)
        assert out["key"].sharding == key.sharding and out["key"].dtype == key.dtype
        assert isinstance(out["one"].sharding, jax.sharding.SingleDeviceSharding)
        assert out["one"].sharding == pinned_one and out["one"].dtype == np.int16
        assert out["rows"].sharding == pinned_rows
        assert out["bf16"].dtype == jnp.bfloat16 and out["bf16"].sharding == x.sharding
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(out["key"])), want_key)
        np.testing.assert_array_equal(np.asarray(out["one"]), np.arange(3))
        np.testing.assert_array_equal(np.asarray(out["rows"]), np.arange(8.0) + 1)
        np.testing.assert_array_equal(np.asarray(out["bf16"], np.float32), np.arange(8.0))


@PATHS
def test_string_outputs_come_back_and_why_they_run_synchronously_is_logged_once(
    mesh_4x2: Mesh, slow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    strings = np.dtypes.StringDType()
    x = put(np.arange(8), mesh_4x2, P("data"))

    def spelled(a: jax.Array) -> jax.Array:
        return jax.device_put(np.array([f"n{v}" for v in np.asarray(a)], strings), a.sharding)

    want = np.array([f"n{v}" for v in range(8)], strings)
    discovered = colocated_python(maybe_slow(spelled, slow))
    specified = colocated_python(maybe_slow(spelled, slow)).specialize(
        out_specs_fn=lambda a: jax.ShapeDtypeStruct(a.shape, strings, sharding=a.sharding)
    )
    for f in (discovered, specified):
        for _ in range(3):
            out = f(x)
            assert out.dtype == strings and out.sharding == x.sharding
            np.testing.assert_array_equal(jax.device_get(out), want)
    # A function too slow to wait for asks for a promise, and learns (once) it cannot.
    logged = caplog.text.count("cannot be promised")
    assert logged == 2 if slow else logged <= 2


@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("specified", [False, True])
def test_nesting_across_device_lists_finishes(specified: bool) -> None:
    """``h`` on device 0, ``g`` on device 1 calling it, ``f`` on device 0 calling ``g``."""
    d0, d1 = jax.devices()[:2]

    def on(fun: Any) -> Any:
        f = colocated_python(fun)
        return f.specialize(out_specs_fn=lambda a: a) if specified else f

    h = on(lambda a: jax.device_put(np.asarray(a) + 1, a.sharding))
    g = on(lambda a: jax.device_put(np.asarray(h(jax.device_put(a, d0))) * 10, a.sharding))
    f = on(lambda a: jax.device_put(np.asarray(g(jax.device_put(a, d1))) - 3, a.sharding))
    for k in range(3):
        x = jax.device_put(np.float32(k), d0)
        out = bounded(lambda x=x: jax.block_until_ready(f(x)))
        assert float(jax.device_get(out)) == (k + 1) * 10 - 3
        assert out.sharding.device_set == {d0}


def bounded(fun: Any) -> Any:
    """``fun()``, or a failure after ``WAIT_S`` instead of a hang (a deadlock regression)."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fun()), daemon=True)
    t.start()
    t.join(WAIT_S)
    assert box, f"did not finish in {WAIT_S} s"
    return box[0]


def test_calls_from_one_thread_run_in_order_and_other_threads_overlap(mesh_4x2: Mesh) -> None:
    x = put(np.arange(8.0), mesh_4x2, P("data"))
    gate = threading.Event()
    order: list[int] = []

    @colocated_python
    def step(a: jax.Array, k: jax.Array) -> jax.Array:
        if int(k) == 0:
            assert gate.wait(WAIT_S)  # holds this thread's later calls, not the others'
        order.append(int(k))
        return a

    step = step.specialize(out_specs_fn=lambda a, k: a)
    mine = [step(x, put(np.int32(k), mesh_4x2, P())) for k in range(3)]
    other = threading.Thread(
        target=lambda: step(x, put(np.int32(7), mesh_4x2, P())).block_until_ready()
    )
    other.start()
    other.join(WAIT_S)
    assert order == [7]  # the other thread's call ran while this thread's waited
    gate.set()
    jax.block_until_ready(mine)
    assert order == [7, 0, 1, 2]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_interpreter_exits_at_once_after_nested_calls(tmp_path: Any) -> None:
    script = tmp_path / "nested_exit.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time
            os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
            import jax, numpy as np
            import partitioner

            d0, d1 = jax.devices()[:2]
            cp = lambda fun: partitioner.colocated_python(fun).specialize(out_specs_fn=lambda a: a)
            h = cp(lambda a: jax.device_put(np.asarray(a) + 1, a.sharding))
            g = cp(lambda a: jax.device_put(np.asarray(h(jax.device_put(a, d0))), a.sharding))
            f = cp(lambda a: jax.device_put(np.asarray(g(jax.device_put(a, d1))), a.sharding))
            outs = [f(jax.device_put(np.float32(k), d0)) for k in range(4)]
            print("RESULT", [float(o) for o in outs], flush=True)
            outs = [f(jax.device_put(np.float32(k), d0)) for k in range(4)]  # left queued
            print("EXITING", time.monotonic(), flush=True)
            """
        )
    )
    proc = subprocess.run(
        ["timeout", "-k", "5", "120", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT [1.0, 2.0, 3.0, 4.0]" in proc.stdout
    assert "not run after" not in proc.stderr  # no call was abandoned at exit


def test_the_callable_wraps_the_function_as_functools_wraps_does() -> None:
    def scaled(a: jax.Array, factor: float = 2.0, *, bias: jax.Array | None = None) -> jax.Array:
        """Scale ``a``."""
        return a

    f = colocated_python(scaled)
    for g in (f, f.specialize(devices=jax.devices()[:1])):
        assert g.__wrapped__ is scaled
        assert g.__name__ == "scaled" and g.__doc__ == "Scale ``a``."
        assert g.__qualname__ == scaled.__qualname__ and g.__module__ == scaled.__module__
        assert inspect.signature(g) == inspect.signature(scaled)


def test_a_colocated_object_sees_its_calls_in_order_and_dies_on_a_worker(mesh_4x2: Mesh) -> None:
    died: list[str] = []

    class Plain:
        """Counts."""

        def __init__(self, start: float) -> None:
            self.total = start

        def __del__(self) -> None:
            died.append(threading.current_thread().name)

        def add(self, a: jax.Array) -> jax.Array:
            """Add ``a``'s sum."""
            time.sleep(0.002)
            self.total += float(np.asarray(a).sum())
            return jax.device_put(np.float32(self.total), a.sharding)

    Counter = colocated_python_class(Plain)
    x = put(np.ones(8, np.float32), mesh_4x2, P())
    counter = Counter(1.0)
    assert Counter.__name__ == "Plain" and Counter.__doc__ == "Counts."
    assert counter.add.__wrapped__ is Plain.add and counter.add.__doc__ == "Add ``a``'s sum."
    assert inspect.signature(counter.add) == inspect.signature(Plain.add)
    add = counter.add.specialize(
        out_specs_fn=lambda a: jax.ShapeDtypeStruct((), np.float32, sharding=a.sharding)
    )
    outs = [add(x) for _ in range(10)]  # asynchronous, each after the one before
    assert [float(o) for o in outs] == [1.0 + 8 * (k + 1) for k in range(10)]
    del counter, add
    gc.collect()
    np.asarray(colocated_python(lambda a: a)(x))  # a later call on this thread: after the release
    assert len(died) == 1 and died[0].startswith("partitioner-colocated")


def test_colocated_cpu_devices_and_class_check_their_arguments(mesh_4x2: Mesh) -> None:
    assert partitioner.colocated_cpu_devices(jax.devices()[:3]) == jax.devices()[:3]
    assert partitioner.colocated_cpu_devices(mesh_4x2) is mesh_4x2  # CPU devices are their own
    with pytest.raises(TypeError, match="colocated_cpu_devices: expected a jax.sharding.Mesh"):
        partitioner.colocated_cpu_devices(["cpu:0"])
    with pytest.raises(TypeError, match="colocated_python_class: cls must be a class"):
        colocated_python_class(lambda: None)


def test_an_idle_lane_worker_ends_and_a_later_call_starts_another(
    mesh_4x2: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [colocated lanes]: no thread outlives its use by more than IDLE_S."""
    monkeypatch.setattr(testing.colocated_runtime, "IDLE_S", 0.05)
    x = put(np.arange(8.0), mesh_4x2, P("data"))
    workers: list[threading.Thread] = []

    @colocated_python
    def where(a: jax.Array) -> jax.Array:
        workers.append(threading.current_thread())
        return a

    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(where(x)), np.arange(8.0))
        deadline = time.monotonic() + WAIT_S
        while workers[-1].is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not workers[-1].is_alive()
    assert len({id(w) for w in workers}) == 3  # a new worker each time
