"""``host_callback.call``: a host function whose result comes back.

Values are compared with numpy on the same inputs; errors name the call; an
ordered call keeps program order with the taps around it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partitioner
from partitioner import PartitionSpec as P
from partitioner import host_callback as hcb
from partitioner import pjit
from tests.helpers import devices

F32 = np.float32


def test_call_eager_jit_and_pjit_give_the_host_result(partitioner_mode) -> None:
    x = np.arange(16, dtype=F32).reshape(8, 2)

    def f(x: Any) -> Any:
        return 1 + hcb.call(lambda a: np.sin(a) * 2, x * 3, result_shape=x)

    want = 1 + np.sin(x * 3) * 2
    np.testing.assert_allclose(f(x), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(f)(x), want, rtol=1e-6)
    with partitioner.mesh(devices(8), ("x",)):
        got = pjit(f, P("x"), P("x"))(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_call_with_device_runs_on_device_index_of_the_program() -> None:
    seen = []

    def host(a: Any, device: Any) -> Any:
        seen.append(device)
        return a + 1

    x = np.arange(8, dtype=F32)
    with partitioner.mesh(devices(8), ("x",)):
        f = pjit(
            lambda x: hcb.call(host, x, result_shape=x, call_with_device=True, device_index=5),
            P("x"),
            P("x"),
        )
        np.testing.assert_array_equal(np.asarray(f(x)), x + 1)
        bad = pjit(lambda x: hcb.call(host, x, result_shape=x, device_index=8), P("x"), P("x"))
        with pytest.raises(ValueError, match="device_index=8 but the program runs on 8"):
            bad(x)
    assert seen == [jax.devices()[5]]


def test_call_keeps_program_order_with_taps() -> None:
    log: list[str] = []

    def f(x: Any) -> Any:
        x = hcb.id_tap(lambda a, _: log.append(f"tap {a}"), x)
        y = hcb.call(lambda a: log.append(f"call {a}") or a * 2, x, result_shape=x)
        return hcb.id_tap(lambda a, _: log.append(f"tap {a}"), y + 1)

    jax.jit(f)(np.int32(3))
    f(np.int32(5))
    hcb.barrier_wait()
    assert log == ["tap 3", "call 3", "tap 7", "tap 5", "call 5", "tap 11"]


def test_call_in_loops_and_conditionals_matches_numpy() -> None:
    def body(i: Any, acc: Any) -> Any:
        return lax.cond(
            i % 2 == 1,
            lambda a: hcb.call(lambda v: v * F32(1.5), a, result_shape=a),
            lambda a: a + 1,
            acc,
        )

    got = jax.jit(lambda x: lax.fori_loop(0, 6, body, x))(F32(1.0))
    want = F32(1.0)
    for i in range(6):
        want = want * F32(1.5) if i % 2 == 1 else want + 1
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("flavor", [hcb.CallbackFlavor.IO_CALLBACK, hcb.CallbackFlavor.PURE])
def test_vmap_of_call_runs_once_per_element(flavor: Any) -> None:
    calls = []

    def host(a: Any) -> Any:
        calls.append(a.shape)
        return a.sum(keepdims=True)

    x = np.arange(12, dtype=F32).reshape(3, 4)
    spec = jax.ShapeDtypeStruct((1,), F32)
    got = jax.jit(jax.vmap(lambda r: hcb.call(host, r, result_shape=spec, callback_flavor=flavor)))(
        x
    )
    np.testing.assert_allclose(got, x.sum(axis=1, keepdims=True))
    assert calls == [(4,)] * 3
    # Batched on axis 1, with an unbatched operand passing by whole.
    both = jax.vmap(
        lambda c, w: hcb.call(lambda t: t[0] * t[1], (c, w), result_shape=c), in_axes=(1, None)
    )
    np.testing.assert_allclose(both(x, F32(2.0)), (x * 2).T)


def test_call_errors_fail_the_computation_then_the_barrier() -> None:
    # NOTE [call errors]: a RuntimeError where the computation runs (eagerly with the
    # host function's error as the cause), then CallbackException at barrier_wait().
    def boom(a: Any) -> Any:
        raise ZeroDivisionError("boom")

    x = np.ones(3, F32)
    with pytest.raises(jax.errors.JaxRuntimeError, match="ZeroDivisionError: boom") as info:
        hcb.call(boom, x, result_shape=x)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "host_callback.call(" in "".join(info.value.__cause__.__notes__)
    with pytest.raises(hcb.CallbackException, match="Last one was: ZeroDivisionError") as bar:
        hcb.barrier_wait()
    assert bar.value.__cause__ is info.value.__cause__
    with pytest.raises(RuntimeError, match="ZeroDivisionError: boom"):
        jax.jit(lambda x: hcb.call(boom, x, result_shape=x))(x)
    with pytest.raises(hcb.TapFunctionException) as bar:
        hcb.barrier_wait()
    assert isinstance(bar.value.__cause__, ZeroDivisionError)
    cases = [
        (
            lambda a: a[:1],
            r"abstract values float32\[3\] at result leaf 0 .* returned float32\[1\]",
        ),
        (lambda a: a.astype(np.int8), r"float32\[3\] at result leaf 0 .* returned int8\[3\]"),
        (lambda a: (a, a), "should have returned a result with pytree"),
    ]
    for host, message in cases:
        with pytest.raises(RuntimeError, match=message) as info:
            hcb.call(host, x, result_shape=x)
        assert isinstance(info.value.__cause__, TypeError)
        with pytest.raises(RuntimeError, match=message):
            jax.jit(lambda x, host=host: hcb.call(host, x, result_shape=x))(x)
        with pytest.raises(hcb.CallbackException, match=message):
            hcb.barrier_wait()
    hcb.barrier_wait()  # each error is reported once


def test_call_bad_arguments_are_clear_errors() -> None:
    x = np.ones(2, F32)
    with pytest.raises(TypeError, match="callback_func must be callable"):
        hcb.call("f", x, result_shape=x)
    with pytest.raises(TypeError, match="DEBUG cannot return values"):
        hcb.call(lambda a: a, x, result_shape=x, callback_flavor=hcb.CallbackFlavor.DEBUG)
    with pytest.raises(ValueError, match="must have 'shape' and 'dtype'"):
        hcb.call(lambda a: a, x, result_shape={"a": "f32"})
    with pytest.raises(TypeError, match=r"arg\[1\] must be an array or a scalar"):
        hcb.call(lambda a: a, (x, "s"), result_shape=x)
    with pytest.raises(TypeError, match="has no derivative"):
        jax.grad(lambda v: hcb.call(lambda a: a, v, result_shape=v))(F32(1.0))


def test_call_result_shape_from_scalars_and_arrays() -> None:
    got = jax.jit(lambda v: hcb.call(lambda a: F32(a * 2), v, result_shape=F32(0)))(F32(4.0))
    assert got == 8.0 and got.dtype == F32
    assert hcb.call(lambda a: None, 1.0) is None
    np.testing.assert_array_equal(
        hcb.call(lambda a: np.int32(7), (), result_shape=jnp.zeros((), jnp.int32)), 7
    )


def test_call_in_a_pmap_body_runs_per_device(partitioner_mode) -> None:
    seen = []

    def host(block: Any, device: Any) -> Any:
        seen.append(device.id)
        return block * 10

    x = np.arange(16, dtype=F32).reshape(8, 2)
    got = partitioner.pmap(
        lambda b: hcb.call(host, b + 1, result_shape=b, call_with_device=True) - 1
    )(x)
    np.testing.assert_allclose(np.asarray(got), (x + 1) * 10 - 1)
    assert sorted(seen) == list(range(8))
