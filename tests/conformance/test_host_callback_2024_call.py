"""jax's ``host_callback_test.py`` (2022-2024) for ``call``: canonical results and errors, ported.

The ``call`` and error scenarios of the module's legacy implementation, which jax's
last revision (2024-10) dropped together with that implementation:

- results: jax put each result the host function returned in canonical form
  (``xla.canonicalize_dtype``: with x64 off float64 -> float32, int64 -> int32,
  Python scalars to their jax type) before comparing it with ``result_shape``;
  the tests ran the host functions eagerly on numpy arguments of any dtype, so
  an ordinary numpy function returned 64-bit values;
- errors (``helper_check_callback_errors``): the computation fails with a
  ``RuntimeError``, then ``barrier_wait()`` raises ``CallbackException``: "There
  were exceptions during callback processing. Last one was: ... ValueError: user
  exception"; tap functions that raise are reported the same way.

Values are compared with numpy on the same inputs, dtypes with jax's canonical
ones (jax's ``assertAllClose(check_dtypes=True)`` with x64 off). The same
scenarios run eagerly, under ``jax.jit`` and under ``pjit``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import dtypes

import partitioner
from partitioner import PartitionSpec as P
from partitioner import host_callback as hcb
from partitioner import pjit


@pytest.fixture(autouse=True)
def _no_error_left_behind() -> Any:
    hcb.barrier_wait()
    yield
    hcb.barrier_wait()


def staged(how: str, fun: Any, devices: int = 8) -> Any:
    """``fun`` run eagerly, under ``jax.jit``, or under ``pjit`` over ``devices`` (replicated).

    The error scenarios run pjit on one device: in a program over several, a host
    function that raises stops device 0 while the others wait for it in the
    result's broadcast, which XLA aborts (docs/api.md, host callbacks, "Limits").
    """
    if how == "eager":
        return fun
    if how == "jit":
        return jax.jit(fun)

    def run(*args: Any) -> Any:
        with partitioner.mesh(np.array(jax.devices()[:devices]), ("x",)):
            return pjit(fun, None, None)(*args)

    return run


HOW = ["eager", "jit", "pjit"]

#: jax's ``jtu.dtypes.all`` less bool, with the 64-bit types numpy functions return.
DTYPES = [
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    jnp.bfloat16,
]


# --- results in canonical form ---


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.slow
def test_call_types(dtype: Any, how: str) -> None:
    def f_outside(x: Any) -> Any:
        return x + x  # numpy: a 64-bit argument gives a 64-bit result

    def fun(x: Any) -> Any:
        return hcb.call(f_outside, x + x, result_shape=x)

    arg = np.arange(24, dtype=dtype).reshape((2, 3, 4))
    got = staged(how, fun)(arg)
    assert got.dtype == dtypes.canonicalize_dtype(dtype)
    np.testing.assert_array_equal(np.asarray(got), (arg + arg + arg + arg).astype(got.dtype))


@pytest.mark.parametrize("how", HOW)
def test_call_doc_example1_on_float64(how: str) -> None:
    # The module's first example, on np.ones' default float64 (jax's test: float32).
    def host_eig(x: Any) -> Any:
        return np.linalg.eigvals(x)

    m = np.ones((2, 5, 4, 4))

    def fun(m: Any) -> Any:
        return hcb.call(host_eig, m, result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype))

    got = staged(how, fun)(m)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), np.linalg.eigvals(m), atol=1e-5)


@pytest.mark.parametrize("how", HOW)
def test_call_64_bit_results(how: str) -> None:
    # Host code computing in numpy's default 64-bit types (an int32 times a float,
    # np.int64 arithmetic): jax canonicalized the results to float32 / int32.
    def fun(x: Any, n: Any) -> Any:
        y = hcb.call(lambda v: v * 2.5, n, result_shape=x)  # int32 * float: float64
        k = hcb.call(lambda v: np.int64(v) * 3, n, result_shape=n)
        z = hcb.call(lambda v: np.sin(np.asarray(v, np.float64)), x, result_shape=x)
        return y, k, z

    x, n = np.full((2, 3), 0.5, np.float32), np.arange(6, dtype=np.int32).reshape(2, 3)
    y, k, z = staged(how, fun)(x, n)
    assert (y.dtype, k.dtype, z.dtype) == (np.float32, np.int32, np.float32)
    np.testing.assert_allclose(np.asarray(y), n * 2.5)
    np.testing.assert_array_equal(np.asarray(k), n * 3)
    np.testing.assert_allclose(np.asarray(z), np.sin(x), rtol=1e-6)


@pytest.mark.parametrize("how", HOW)
def test_call_python_scalar_results(how: str) -> None:
    # A host function returning Python scalars (math.sin, int arithmetic): jax
    # canonicalized them to float32 / int32, the types result_shape declares.
    def fun(x: Any, n: Any) -> Any:
        s = hcb.call(lambda v: math.sin(v), x, result_shape=x)
        k, f = hcb.call(lambda v: (int(v) * 3, float(v) / 2), n, result_shape=(n, x))
        return s, k, f

    x, n = np.float32(0.5), np.int32(7)
    s, k, f = staged(how, fun)(x, n)
    assert (s.dtype, k.dtype, f.dtype) == (np.float32, np.int32, np.float32)
    np.testing.assert_allclose(np.asarray(s), math.sin(0.5), rtol=1e-6)
    assert int(k) == 21 and float(f) == 3.5


# --- errors (helper_check_callback_errors) ---


def check_callback_errors(thunk: Any, expected_exc_txt: str) -> BaseException:
    """jax's helper: the computation fails, then barrier_wait() raises CallbackException.

    Returns the ``CallbackException``'s cause (the host function's own error).
    """
    with pytest.raises(RuntimeError):
        thunk()
    with pytest.raises(
        hcb.CallbackException,
        match=re.compile(
            "There were exceptions during callback processing.*Last one was:.*" + expected_exc_txt,
            re.DOTALL,
        ),
    ) as info:
        hcb.barrier_wait("Waiting for error")
    assert info.value.__cause__ is not None
    return info.value.__cause__


@pytest.mark.parametrize("how", HOW)
def test_call_error_callback_throws_exception(how: str) -> None:
    def f_outside(x: Any) -> Any:
        raise ValueError("user exception")

    def fun(x: Any) -> Any:
        return hcb.call(f_outside, x, result_shape=x)

    cause = check_callback_errors(
        lambda: staged(how, fun, devices=1)(3.0), "ValueError: user exception"
    )
    assert isinstance(cause, ValueError) and str(cause) == "user exception"


@pytest.mark.parametrize("how", HOW)
def test_call_error_callback_returns_unexpected_shape(how: str) -> None:
    def fun(x: Any) -> Any:
        return hcb.call(lambda x: (x, x), x, result_shape=x)

    cause = check_callback_errors(
        lambda: staged(how, fun, devices=1)(3.0),
        "Callback func .* should have returned a result with pytree",
    )
    assert isinstance(cause, TypeError)


@pytest.mark.parametrize("how", HOW)
def test_call_error_result_not_in_the_declared_canonical_type(how: str) -> None:
    # Canonicalization is not conversion: an int where float32 is declared is int32.
    def fun(x: Any) -> Any:
        return hcb.call(lambda v: 2, x, result_shape=x)

    check_callback_errors(
        lambda: staged(how, fun, devices=1)(np.float32(3.0)),
        r"should have returned a result with abstract values float32\[\].*returned int32\[\]",
    )


@pytest.mark.parametrize("how", HOW)
def test_call_error_then_compute(how: str) -> None:
    def f_outside(x: Any) -> Any:
        raise ValueError("user exception")

    def fun(x: Any) -> Any:
        return hcb.call(f_outside, x, result_shape=x)

    arg = np.arange(3, dtype=np.int32)
    check_callback_errors(
        lambda: np.testing.assert_allclose(staged(how, fun, devices=1)(arg), arg),
        "ValueError: user exception",
    )
    # The process computes on afterwards.
    got = staged(how, lambda x: hcb.call(lambda v: v + 1, x, result_shape=x))(arg)
    np.testing.assert_array_equal(np.asarray(got), arg + 1)


def test_callback_exception_is_tap_function_exception() -> None:
    assert hcb.CallbackException is hcb.TapFunctionException  # as the module's alias


# --- tap errors (the legacy expectations) ---


class Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, what: str) -> None:
        self.text += what


def tapping(stream: Stream, tap_err: Any) -> Any:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x + 1, what="x1", output_stream=stream)
        x2 = hcb.id_tap(tap_err, x1 + 1)
        return hcb.id_print(x2 + 1, what="x3", output_stream=stream)

    return func


def test_tap_eval_exception() -> None:
    def tap_err(*args: Any, **kwargs: Any) -> None:
        raise ValueError("Some user message")

    stream = Stream()
    with pytest.raises(
        hcb.CallbackException,
        match=re.compile(
            "There were exceptions during callback processing. Last one was:.*"
            "ValueError: Some user message",
            re.DOTALL,
        ),
    ):
        tapping(stream, tap_err)(0)
        hcb.barrier_wait()
    assert stream.text.split() == "what: x1 1 what: x3 3".split()


def test_tap_jit_tap_exception() -> None:
    def tap_err(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    stream = Stream()
    res = jax.jit(tapping(stream, tap_err))(0)  # No error yet
    with pytest.raises(hcb.CallbackException, match="Last one was: NotImplementedError"):
        hcb.barrier_wait()
    assert res == 3  # the program computed on
    assert stream.text.split() == "what: x1 1 what: x3 3".split()


@pytest.mark.parametrize("how", HOW)
def test_call_under_pjit_over_a_sharded_argument(how: str) -> None:
    # Canonical results with the argument sharded over the mesh (the value is global).
    x = np.arange(16, dtype=np.float32).reshape(8, 2)

    def fun(x: Any) -> Any:
        return hcb.call(lambda v: np.asarray(v, np.float64) * 2, x, result_shape=x) + 1

    if how == "pjit":
        with partitioner.mesh(np.array(jax.devices()), ("x",)):
            got = pjit(fun, P("x"), P("x"))(x)
    else:
        got = staged(how, fun)(x)
    np.testing.assert_allclose(np.asarray(got), x * 2 + 1)
