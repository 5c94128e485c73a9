"""Memory kinds (device / pinned_host / unpinned_host) through pjit, beside jax.jit.

Each case runs the same program through ``partitioner.pjit`` and ``jax.jit`` and
compares values, result shardings (memory kind included) and errors.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from partitioner import pjit

pytestmark = pytest.mark.usefixtures("partitioner_mode")

MESH = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
DEV = NamedSharding(MESH, P("x"))
HOST = DEV.with_memory_kind("pinned_host")
UNPINNED = DEV.with_memory_kind("unpinned_host")
X = np.arange(16.0, dtype=np.float32)


def _both(fun: Any, **kw: Any) -> tuple[Any, Any]:
    return pjit(fun, **kw), jax.jit(fun, **kw)


def _same(ours: Any, theirs: Any) -> None:
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b))
        assert a.sharding == b.sharding, (a.sharding, b.sharding)
        assert a.sharding.memory_kind == b.sharding.memory_kind


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host", "device"])
def test_output_memory_kind(kind: str) -> None:
    ours, theirs = _both(
        lambda x: x * 2, in_shardings=DEV, out_shardings=DEV.with_memory_kind(kind)
    )
    x = jax.device_put(X, DEV)
    _same(ours(x), theirs(x))
    assert ours(x).sharding.memory_kind == kind


def test_host_input_to_device_output() -> None:
    ours, theirs = _both(lambda x: x + 1, in_shardings=HOST, out_shardings=DEV)
    x = jax.device_put(X, HOST)
    _same(ours(x), theirs(x))


def test_lowered_module_marks_memory_kinds() -> None:
    f = pjit(lambda x: x * 2, in_shardings=DEV, out_shardings=HOST)
    text = f.lower(jax.ShapeDtypeStruct((16,), jnp.float32, sharding=DEV)).as_text()
    assert 'mhlo.memory_kind = "device"' in text
    assert 'mhlo.memory_kind = "pinned_host"' in text
    assert "annotate_device_placement" in text
    assert '_xla_buffer_placement = "pinned_host"' in text


def test_default_memory_adds_nothing() -> None:
    text = pjit(lambda x: x * 2, in_shardings=DEV, out_shardings=DEV).lower(X).as_text()
    assert "memory_kind" not in text and "annotate_device_placement" not in text


@pytest.mark.parametrize("target", [HOST, jax.memory.Space.Host], ids=["sharding", "memory-space"])
def test_device_put_inside_the_body(target: Any) -> None:
    # A PartitionSpec/None output leaf says nothing about memory: the body's kind wins.
    def f(x: Any) -> Any:
        return jax.device_put(x * 2, target)

    x = jax.device_put(X, DEV)
    with jax.set_mesh(MESH):
        ours = pjit(f, in_shardings=P("x"), out_shardings=P("x"))(x)
    theirs = jax.jit(f)(x)
    _same(ours, theirs)
    assert ours.sharding.memory_kind == "pinned_host"


def test_device_put_to_host_and_back() -> None:
    def f(x: Any) -> Any:
        h = jax.device_put(x, HOST)
        return jax.device_put(h, DEV) * 3, h

    x = jax.device_put(X, DEV)
    with jax.set_mesh(MESH):
        ours = pjit(f, in_shardings=P("x"), out_shardings=(P("x"), P("x")))(x)
    _same(ours, jax.jit(f, in_shardings=DEV)(x))
    assert [o.sharding.memory_kind for o in ours] == ["device", "pinned_host"]


def test_stated_output_kind_wins_over_the_body() -> None:
    ours, theirs = _both(lambda x: jax.device_put(x, HOST), in_shardings=DEV, out_shardings=DEV)
    x = jax.device_put(X, DEV)
    _same(ours(x), theirs(x))
    assert ours(x).sharding.memory_kind == "device"


def test_compiled_shardings_report_memory_kinds() -> None:
    args = (jax.ShapeDtypeStruct((16,), jnp.float32, sharding=HOST),)
    ours, theirs = _both(lambda x: (x, x * 2), in_shardings=HOST, out_shardings=(DEV, UNPINNED))
    c_ours, c_theirs = ours.lower(*args).compile(), theirs.lower(*args).compile()
    assert c_ours.input_shardings == c_theirs.input_shardings
    assert c_ours.output_shardings == c_theirs.output_shardings
    (arg_sharding,), _ = c_ours.input_shardings
    assert arg_sharding.memory_kind == "pinned_host"
    assert [s.memory_kind for s in c_ours.output_shardings] == ["device", "unpinned_host"]


def test_argument_in_another_memory_is_an_error_as_in_jax() -> None:
    ours, theirs = _both(lambda x: x, in_shardings=HOST, out_shardings=HOST)
    x = jax.device_put(X, DEV)
    with pytest.raises(ValueError, match="Memory kinds"):
        theirs(x)
    with pytest.raises(
        ValueError,
        match=r"(?s)^Memory kinds passed to jax.jit.*argument x:.*'pinned_host'.*'device'",
    ):
        ours(x)


def test_numpy_argument_is_placed_in_the_stated_memory() -> None:
    ours, theirs = _both(lambda x: x * 2, in_shardings=HOST, out_shardings=HOST)
    _same(ours(X), theirs(X))


def test_memory_kinds_key_the_executable_cache() -> None:
    f = pjit(lambda x: x + 1, in_shardings=P("x"), out_shardings=P("x"))
    with jax.set_mesh(MESH):
        a = f(jax.device_put(X, DEV))
        b = f(jax.device_put(X, HOST))
    assert a.sharding.memory_kind == "device"
    assert b.sharding.memory_kind == "pinned_host"  # a host input keeps its kind
    np.testing.assert_allclose(np.asarray(a), np.asarray(b))


def test_memory_kind_survives_jvp_and_vmap() -> None:
    f = pjit(lambda x: x * 2, in_shardings=DEV, out_shardings=HOST)
    x = jax.device_put(X, DEV)
    primal, tangent = jax.jvp(f, (x,), (x,))
    assert primal.sharding.memory_kind == tangent.sharding.memory_kind == "pinned_host"
    batched = jax.vmap(f)(jnp.ones((3, 16)))
    np.testing.assert_allclose(np.asarray(batched), 2.0)


def test_an_unknown_memory_kind_is_jax_error() -> None:
    with pytest.raises(ValueError, match="memory kind"):
        pjit(lambda x: x, in_shardings=DEV.with_memory_kind("hbm"), out_shardings=DEV)


def test_device_put_to_other_devices_inside_is_an_error() -> None:
    def f(x: Any) -> Any:
        return jax.device_put(x, jax.sharding.SingleDeviceSharding(jax.devices()[0]))

    x = jax.device_put(X, DEV)
    with pytest.raises(ValueError, match="incompatible devices"):
        jax.jit(f)(x)
    with jax.set_mesh(MESH), pytest.raises(ValueError, match=r"incompatible devices.*\[0\]"):
        pjit(f, in_shardings=P("x"), out_shardings=P("x"))(x)
