"""jax's ``tests/colocated_python_test.py`` (0.10.2), adapted to ``partitioner``.

Every user-visible case of jax's file, with its scenario and expected values,
run against ``partitioner.colocated_python`` / ``colocated_python_class`` /
``colocated_cpu_devices`` in one process over 8 CPU devices. Where jax's case
only checks that nothing deadlocks, the adaptation also blocks on the outputs,
so a function that failed inside (a broken barrier) fails the test.

Not ported, because they test jax's internals rather than the API:
``test_serialization_roundtrip`` and ``test_serialize_with_shared_obj`` (jax's
private ``serialization`` module: partitioner runs the function itself, in the
process that holds the shards, and never pickles it), and
``test_make_colocated_python_program`` (an IFRT program object, jax's
transport to a remote colocated-Python runtime). ``test_detect_invalid_mesh_device``
does not apply on a CPU client: there the colocated CPU devices *are* the
devices, so there is no non-CPU mesh to detect (jax skips it here too).

jax counts specialization-cache misses with an internal event; the equivalent
here is partitioner's ``colocated_specialize`` event.
"""

from __future__ import annotations

import base64
import struct
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import colocated_cpu_devices, colocated_python, colocated_python_class

#: This module, whose ``_testing_*`` attributes stand for jax's
#: ``colocated_python._testing_*``: state colocated functions share through a
#: module, as caches do (a module, so that jax's fallback, which pickles the
#: function, shares it by reference too).
STATE = sys.modules[__name__]

STRING = np.dtypes.StringDType()


@contextmanager
def specializations() -> Iterator[Any]:
    """How many specializations were made in the block (jax's cache-miss count)."""
    with partitioner.recording() as seen:
        yield lambda: seen.get("colocated_specialize", 0)


@pytest.fixture
def cpu() -> list[jax.Device]:
    return colocated_cpu_devices(jax.local_devices())


@pytest.fixture(autouse=True)
def clean_state() -> Iterator[None]:
    yield
    for name in [n for n in vars(STATE) if n.startswith("_testing_")]:
        value = getattr(STATE, name)
        if hasattr(value, "close"):
            value.close()
        delattr(STATE, name)


def one(value: Any, device: jax.Device) -> jax.Array:
    return jax.device_put(np.array(value), device)


# --- devices ---


def test_colocated_cpu_devices() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:1]).reshape((1, 1)), ("x", "y"))
    cpu_mesh1 = colocated_cpu_devices(mesh)
    cpu_devices = colocated_cpu_devices(jax.local_devices()[:1])
    cpu_mesh2 = jax.sharding.Mesh(np.array(cpu_devices).reshape((1, 1)), ("x", "y"))
    assert cpu_mesh1 == cpu_mesh2


# --- functions ---


def test_simple_function(cpu: list[jax.Device]) -> None:
    @colocated_python
    def add_one(x: Any) -> Any:
        return x + 1

    x = one(1, cpu[0])
    with specializations() as count:
        assert jax.device_get(add_one(x)) == np.array(2)
        assert count() == 1
        assert jax.device_get(add_one(x)) == np.array(2)
        assert count() == 1


def test_simple_function_with_tree(cpu: list[jax.Device]) -> None:
    @colocated_python
    def add_one(x: Any) -> Any:
        return jax.tree.map(lambda v: v + 1, x)

    x = [np.array(1), (np.array(2), {"v": np.array(3)})]
    x = jax.device_put(x, jax.sharding.SingleDeviceSharding(cpu[0]))
    want = [np.array(2), (np.array(3), {"v": np.array(4)})]
    with specializations() as count:
        assert jax.device_get(add_one(x)) == want
        assert count() == 1
        assert jax.device_get(add_one(x)) == want
        assert count() == 1


def test_empty_input_fails_without_specialization() -> None:
    @colocated_python
    def make_zero() -> jax.Array:
        return jnp.array(0)

    with pytest.raises(
        ValueError,
        match="No devices found. colocated_python function without input arguments must be "
        "first specialized with devices.",
    ):
        make_zero()


def test_empty_input_with_devices_specialization(cpu: list[jax.Device]) -> None:
    @colocated_python
    def make_zero() -> jax.Array:
        return jnp.array(0)

    with specializations() as count:
        make_zero = make_zero.specialize(devices=cpu[:1])
        assert jax.device_get(make_zero()) == np.array(0)
        assert count() == 1
        assert jax.device_get(make_zero()) == np.array(0)
        assert count() == 1


@pytest.mark.parametrize("with_out_specs_fn", [False, True])
def test_input_polymorphism(cpu: list[jax.Device], with_out_specs_fn: bool) -> None:
    """jax's ``..._without_out_specs_fn`` and ``..._allowed_with_out_specs_fn``."""

    @colocated_python
    def add_one(x: Any) -> Any:
        return jax.tree.map(lambda v: v + 1, x)

    with specializations() as count:
        if with_out_specs_fn:
            add_one = add_one.specialize(out_specs_fn=lambda x: x)
        x: Any = one(1, cpu[0])
        for _ in range(2):
            assert jax.device_get(add_one(x)) == np.array(2)
            assert count() == 1
        # Another tree structure, dtypes and shapes: another specialization.
        x = [np.array(1), (np.array(2), {"v": np.array(3)})]
        x = jax.device_put(x, jax.sharding.SingleDeviceSharding(cpu[0]))
        for _ in range(2):
            assert jax.device_get(add_one(x)) == [np.array(2), (np.array(3), {"v": np.array(4)})]
            assert count() == 2


@pytest.mark.parametrize("on_main_thread", [True, False])
def test_sequential_execution(cpu: list[jax.Device], on_main_thread: bool) -> None:
    x = one(1, cpu[0])

    @colocated_python
    def func0(x: jax.Array) -> jax.Array:
        STATE._testing_value = 100
        return x

    @colocated_python
    def func1(x: jax.Array) -> jax.Array:
        assert STATE._testing_value == 100
        STATE._testing_value += 1
        return x

    @colocated_python
    def func2(x: jax.Array) -> jax.Array:
        assert STATE._testing_value == 101
        return x

    # With out_specs_fn every call is asynchronous: their order is the runtime's.
    func0 = func0.specialize(out_specs_fn=lambda x: x)
    func1 = func1.specialize(out_specs_fn=lambda x: x)
    func2 = func2.specialize(out_specs_fn=lambda x: x)
    results: list[Any] = []

    def calls(x: jax.Array) -> None:
        func0(x)  # no blocking before the next call
        func1(x)
        results.append(jax.device_get(func2(x)))  # raises if func2's assert failed

    if on_main_thread:
        calls(x)
    else:
        t = threading.Thread(target=calls, args=(x,))
        t.start()
        t.join(30)
        assert not t.is_alive()
    assert results == [np.array(1)]


def test_concurrent_execution(cpu: list[jax.Device]) -> None:
    x = one(1, cpu[0])

    @colocated_python
    def init(x: jax.Array) -> jax.Array:
        STATE._testing_barrier = threading.Barrier(3)
        return x

    @colocated_python
    def func(x: jax.Array) -> jax.Array:
        STATE._testing_barrier.wait(timeout=5)  # only if three calls run at once
        return x

    func = func.specialize(out_specs_fn=lambda x: x)
    jax.block_until_ready(init(x))
    results: list[Any] = []

    def call() -> None:
        results.append(jax.device_get(func(x)))  # a broken barrier raises here

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [np.array(1)] * 3


def test_inputs_with_different_device_orders(cpu: list[jax.Device]) -> None:
    cpu = cpu[:2]

    @colocated_python
    def add(x: jax.Array, y: jax.Array) -> jax.Array:
        arrays = [
            x.addressable_shards[1].data + y.addressable_shards[0].data,
            x.addressable_shards[0].data + y.addressable_shards[1].data,
        ]
        return jax.make_array_from_single_device_arrays(y.shape, y.sharding, arrays)

    # The arguments use two orders of the devices: name them, not the arguments' list.
    add = add.specialize(devices=cpu)
    sharding1 = jax.sharding.NamedSharding(
        jax.sharding.Mesh([cpu[0], cpu[1]], "x"), jax.sharding.PartitionSpec("x")
    )
    sharding2 = jax.sharding.NamedSharding(
        jax.sharding.Mesh([cpu[1], cpu[0]], "x"), jax.sharding.PartitionSpec("x")
    )
    x = jax.device_put(np.array([0, 2]), sharding1)
    y = jax.device_put(np.array([4, 8]), sharding2)

    for _ in range(2):  # the discovery call, then an asynchronous one
        out = add(x, y)
        assert out.sharding == sharding2
        assert [shard.device for shard in out.addressable_shards] == [cpu[1], cpu[0]]
        np.testing.assert_equal(jax.device_get(out), np.array([2 + 4, 0 + 8]))


def test_module_variable_access(cpu: list[jax.Device]) -> None:
    # Something no pickle could carry, beside the state: nothing may try to.
    STATE._testing_non_serializable = tempfile.TemporaryFile()

    @colocated_python
    def set_global_state(x: jax.Array) -> jax.Array:
        STATE._testing_value = x
        return x + 1

    @colocated_python
    def get_global_state(x: jax.Array) -> jax.Array:
        del x
        return STATE._testing_value

    x = one(1, cpu[0])
    y = one(2, cpu[0])
    jax.block_until_ready(set_global_state(x))
    np.testing.assert_equal(jax.device_get(get_global_state(y)), np.array(1))


# --- strings and bytes ---


def test_string_processing(cpu: list[jax.Device]) -> None:
    @colocated_python
    def f(x: jax.Array) -> jax.Array:
        upper_caser = np.vectorize(lambda s: s.upper(), otypes=[STRING])
        out_arrays = [
            jax.device_put(upper_caser(jax.device_get(shard.data)), device=shard.device)
            for shard in x.addressable_shards
        ]
        return jax.make_array_from_single_device_arrays(
            sharding=x.sharding, shape=x.shape, arrays=out_arrays
        )

    strings = np.array([["abcd", "efgh"], ["ijkl", "mnop"]], dtype=STRING)
    mesh = jax.sharding.Mesh(np.array(cpu[:2]).reshape((2, 1)), ("x", "y"))
    x = jax.device_put(strings, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    want = np.array([["ABCD", "EFGH"], ["IJKL", "MNOP"]], dtype=STRING)
    for _ in range(2):  # the discovery call, then a later one
        np.testing.assert_equal(jax.device_get(f(x)), want)


def test_binary_data_processing(cpu: list[jax.Device]) -> None:
    @colocated_python
    def f(x: jax.Array) -> jax.Array:
        out_arrays = []
        for shard in x.addressable_shards:
            packed = jax.device_get(shard.data)[0].encode("ascii")
            a, b = struct.unpack("<ii", base64.b64decode(packed))
            out = base64.b64encode(struct.pack("<ii", a + 1, b + 1)).decode("ascii")
            out_arrays.append(jax.device_put(np.array([out], dtype=STRING), device=shard.device))
        return jax.make_array_from_single_device_arrays(
            sharding=x.sharding, shape=x.shape, arrays=out_arrays
        )

    packed = base64.b64encode(struct.pack("<ii", 1001, 1002)).decode("ascii")
    x = jax.device_put(np.array([packed], dtype=STRING), jax.sharding.SingleDeviceSharding(cpu[0]))
    out = jax.device_get(f(x))
    assert struct.unpack("<ii", base64.b64decode(out[0].encode("ascii"))) == (1002, 1003)


# --- objects ---


def test_object_lifecycle(cpu: list[jax.Device]) -> None:
    sharding = jax.sharding.SingleDeviceSharding(cpu[0])

    @colocated_python_class
    class Object:
        def __init__(self) -> None:
            STATE._testing_initialized = True

        def __del__(self) -> None:
            STATE._testing_destroyed = True

        def echo(self, x: jax.Array) -> jax.Array:
            return x

    @colocated_python
    def check_initialized() -> jax.Array:
        return jax.device_put(np.array(getattr(STATE, "_testing_initialized", False)), sharding)

    @colocated_python
    def check_destroyed() -> jax.Array:
        return jax.device_put(np.array(getattr(STATE, "_testing_destroyed", False)), sharding)

    check_initialized = check_initialized.specialize(devices=cpu[:1])
    check_destroyed = check_destroyed.specialize(devices=cpu[:1])

    def state() -> tuple[bool, bool]:
        return bool(jax.device_get(check_initialized())), bool(jax.device_get(check_destroyed()))

    # Built on the first method call only: a handle dropped unused builds nothing.
    obj = Object()
    assert state() == (False, False)
    del obj
    assert state() == (False, False)

    obj = Object()
    assert state() == (False, False)
    jax.block_until_ready(obj.echo(jax.device_put(np.array(1), sharding)))
    assert state() == (True, False)
    del obj  # released after this thread's earlier calls, before its later ones
    assert state() == (True, True)


def test_stateful_object(cpu: list[jax.Device]) -> None:
    @colocated_python_class
    class Value:
        def __init__(self, initial_value: np.ndarray) -> None:
            self.value = initial_value

        def add(self, x: jax.Array) -> jax.Array:
            self.value += np.asarray(x)
            return jax.device_put(self.value, x.sharding)

        def fetch_like(self, x: jax.Array) -> jax.Array:
            return jax.device_put(self.value, x.sharding)

    value = Value(np.array(5))
    x = one(1, cpu[0])
    assert jax.device_get(value.add(x)) == np.array(6)
    assert jax.device_get(value.add(x)) == np.array(7)
    assert jax.device_get(value.fetch_like(x)) == np.array(7)


def test_object_with_captured_sharding(cpu: list[jax.Device]) -> None:
    mesh = jax.sharding.Mesh(cpu[0:2], "x")
    sharding1 = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    sharding2 = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    @colocated_python_class
    class Value:
        def __init__(self, initial_value: np.ndarray) -> None:
            self.value = initial_value
            self.sharding1 = sharding1
            self.sharding2 = sharding2

        def add_sharding1(self, x: jax.Array) -> jax.Array:
            self.value += np.asarray(x)
            return jax.device_put(self.value, self.sharding1)

        def add_sharding2(self, x: jax.Array) -> jax.Array:
            self.value += np.asarray(x)
            return jax.device_put(self.value, self.sharding2)

    value = Value(np.array([5, 15]))
    x = jax.device_put(
        np.array([1]), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    )

    out = value.add_sharding1(x)
    assert out.sharding == sharding1
    np.testing.assert_array_equal(jax.device_get(out), np.array([6, 16]))
    out = value.add_sharding2(x)
    assert out.sharding == sharding2
    np.testing.assert_array_equal(jax.device_get(out), np.array([7, 17]))


def test_object_method_specialization(cpu: list[jax.Device]) -> None:
    cpu = cpu[:1]
    sharding = jax.sharding.SingleDeviceSharding(cpu[0])

    @colocated_python_class
    class Object:
        def __init__(self, sharding: jax.sharding.Sharding) -> None:
            self.sharding = sharding

        def fetch_with_devices(self) -> jax.Array:
            return jax.device_put(np.array(1, dtype=np.int32), self.sharding)

        def fetch_with_output_spec(self) -> jax.Array:
            return jax.device_put(np.array(1, dtype=np.int32), self.sharding)

    obj = Object(sharding)
    no_devices = (
        "No devices found. colocated_python function without input arguments must be first "
        "specialized with devices."
    )
    with pytest.raises(ValueError, match=no_devices):
        jax.block_until_ready(obj.fetch_with_devices())
    with pytest.raises(ValueError, match=no_devices):
        jax.block_until_ready(obj.fetch_with_output_spec())

    obj.fetch_with_devices = obj.fetch_with_devices.specialize(devices=cpu)
    np.testing.assert_array_equal(obj.fetch_with_devices(), np.array(1, dtype=np.int32))

    obj.fetch_with_output_spec = obj.fetch_with_output_spec.specialize(
        devices=cpu,
        out_specs_fn=lambda: jax.ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=sharding),
    )
    np.testing.assert_array_equal(obj.fetch_with_output_spec(), np.array(1, dtype=np.int32))
