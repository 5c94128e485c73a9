"""jax's ``tests/host_callback_test.py`` of 2020 (the seed's module), ported.

Each test is one of that file's scenarios with its expected printed output, run
against ``partitioner.host_callback`` (with ``jax.jit`` where it used
``api.jit``). Dropped: jaxpr text, the outfeed rewriter, internal consumers. Where
the module behaved otherwise on purpose, the test checks our behaviour and names
the difference (docs/api.md, "Differences from jax's host_callback").
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partitioner import host_callback as hcb
from partitioner import pmap
from tests.conformance.hcb_conformance import Stream, assert_printed, lines

stream = Stream()


@pytest.fixture(autouse=True)
def _fresh_stream() -> Any:
    hcb.barrier_wait()
    stream.taps = []
    yield
    stream.taps = []


def fun1(a: Any) -> Any:
    y = hcb.id_print(a * 2.0, what="a * 2", output_stream=stream)
    y = hcb.id_print(y * 3.0, what="y * 3", output_stream=stream, result=y)
    return y**2


def maybe_jit(with_jit: bool, f: Any) -> Any:
    return jax.jit(f) if with_jit else f


def test_eval() -> None:
    with hcb.outfeed_receiver():
        np.testing.assert_allclose(fun1(5.0), (5.0 * 2.0) ** 2)
    assert_printed("what: a * 2\n10.00\nwhat: y * 3\n30.00", stream.take())


def test_with_tuple_results() -> None:
    def func2(x: Any) -> Any:
        x1, y1 = hcb.id_print((x * 2.0, x * 3.0), output_stream=stream)
        return x1 + y1

    with hcb.outfeed_receiver():
        assert func2(3.0) == 3.0 * (2.0 + 3.0)
    assert_printed("[ 6.00\n  9.00 ]", stream.take())


def test_with_dict_results() -> None:
    def func2(x: Any) -> Any:
        res = hcb.id_print(dict(a=x * 2.0, b=x * 3.0), output_stream=stream)
        return res["a"] + res["b"]

    with hcb.outfeed_receiver():
        assert func2(3.0) == 3.0 * (2.0 + 3.0)
    assert_printed("{ a=6.00\n  b=9.00 }", stream.take())


def test_with_result() -> None:
    def func2(x: Any) -> Any:
        return hcb.id_print((x * 2.0, x * 3.0), result=x * 4.0, output_stream=stream)

    with hcb.outfeed_receiver():
        assert func2(3.0) == 3.0 * 4.0
    assert_printed("[ 6.00\n  9.00 ]", stream.take())


def _tap_err(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError


def _with_error(x: Any) -> Any:
    x1 = hcb.id_print(x + 1, what="x1", output_stream=stream)
    x2 = hcb.id_tap(_tap_err, x1 + 1, what="err")
    return hcb.id_print(x2 + 1, what="x3", output_stream=stream)


@pytest.mark.parametrize("with_jit", [False, True])
def test_tap_exception(with_jit: bool) -> None:
    with pytest.raises(hcb.TapFunctionException), hcb.outfeed_receiver():
        res = maybe_jit(with_jit, _with_error)(0)
    assert res == 3  # the computation finished; the error came at the receiver's exit
    assert_printed("what: x1\n1\nwhat: x3\n3", stream.take())


def test_jit_simple() -> None:
    jit_fun1 = jax.jit(lambda x: 3.0 * hcb.id_print(2.0 * x, what="here", output_stream=stream))
    with hcb.outfeed_receiver(receiver_name="test_jit_simple"):
        res = jit_fun1(5.0)
    np.testing.assert_allclose(res, 6.0 * 5.0)
    assert_printed("what: here\n10.00", stream.take())


def test_jit_constant() -> None:
    def func(x: Any) -> Any:
        return hcb.id_print(42, result=x, output_stream=stream)

    with hcb.outfeed_receiver():
        assert jax.jit(func)(5) == 5
    assert_printed("42", stream.take())


def _where_1_2(x: Any) -> Any:
    x1 = hcb.id_print(x, where="1", output_stream=stream)
    return hcb.id_print(x1 + 1, where="2", output_stream=stream)


def test_jit_sequence1() -> None:
    with hcb.outfeed_receiver():
        assert jax.jit(_where_1_2)(1) == 2
    assert_printed("where: 1\n1\nwhere: 2\n2", stream.take())


def test_jit2() -> None:
    with hcb.outfeed_receiver():
        assert jax.jit(_where_1_2)(1) == 2
        assert jax.jit(_where_1_2)(10) == 11
    assert_printed(
        "where: 1\n1\nwhere: 2\n2\nwhere: 1\n10\nwhere: 2\n11",
        stream.take(),
    )


def test_jit_nested() -> None:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1", output_stream=stream)

        def func_nested(x: Any) -> Any:
            return hcb.id_print(x + 1, where="nested", output_stream=stream)

        x3 = jax.jit(func_nested)(x1)
        return hcb.id_print(x3 + 1, where="3", output_stream=stream)

    with hcb.outfeed_receiver():
        assert jax.jit(func)(1) == 3
    assert_printed("where: 1\n1\nwhere: nested\n2\nwhere: 3\n3", stream.take())


def test_jit_devices() -> None:
    # The module jitted with device=d; today a committed argument places the program.
    def func(x: Any, device_id: int) -> Any:
        x1 = hcb.id_print(x, dev=str(device_id), output_stream=stream)
        return hcb.id_print(x1 + 1, dev=str(device_id), output_stream=stream)

    devices = jax.local_devices()
    with hcb.outfeed_receiver():
        for d in devices:
            f = jax.jit(func, static_argnums=1)
            assert f(jax.device_put(np.int32(111), d), d.id) == 112
    out = stream.take()
    assert len(re.findall("111", out)) == len(devices)
    assert len(re.findall("112", out)) == len(devices)


def _pytree(x: Any, what: str) -> Any:
    if what == "pair_1_x":
        return (1, x)
    if what == "pair_x_2x":
        return (x, 2 * x)
    return dict(a=2 * x, b=3 * x)


@pytest.mark.parametrize("with_jit", [False, True])
def test_pytree(with_jit: bool) -> None:
    taps: list[Any] = []

    def tap_func(a: Any, what: str = "") -> None:  # the seed's convention: no transforms
        taps.append((what, a))

    with hcb.outfeed_receiver():
        for what in ("pair_1_x", "pair_x_2x", "dict"):
            f = maybe_jit(
                with_jit,
                lambda x, what=what: hcb.id_tap(
                    tap_func, _pytree(x, what), result=_pytree(x * 2, what), what=what
                ),
            )
            assert f(5) == _pytree(10, what)
    assert [w for w, _ in taps] == ["pair_1_x", "pair_x_2x", "dict"]
    for what, a in taps:
        assert jax.tree.map(int, a) == _pytree(5, what)


@pytest.mark.parametrize("with_jit", [False, True])
def test_cond(with_jit: bool) -> None:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1", output_stream=stream)
        x2 = hcb.id_print(x1 + 1, where="2", output_stream=stream)
        x4 = lax.cond(
            x % 2 == 0,
            lambda x: hcb.id_print(x, where="cond_t", output_stream=stream),
            lambda x: hcb.id_print(-1, where="cond_f", result=x, output_stream=stream),
            x2 + 1,
        )
        return hcb.id_print(x4 + 1, where="end", output_stream=stream)

    with hcb.outfeed_receiver():
        assert maybe_jit(with_jit, func)(1) == 4
    assert_printed(
        "where: 1\n1\nwhere: 2\n2\nwhere: cond_f\n-1\nwhere: end\n4",
        stream.take(),
    )


@pytest.mark.parametrize("with_jit", [False, True])
def test_while_cond(with_jit: bool) -> None:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1", output_stream=stream)
        x2 = hcb.id_print(x1 + 1, where="2", output_stream=stream)

        def body(x: Any) -> Any:
            x3 = hcb.id_print(x, where="w_b_1", output_stream=stream)
            x4 = lax.cond(
                x % 2 == 0,
                lambda x: hcb.id_print(x, where="w_b_t", output_stream=stream),
                lambda x: hcb.id_print(-1, where="w_b_f", result=x, output_stream=stream),
                x3 + 1,
            )
            return hcb.id_print(x4, where="w_b_2", output_stream=stream)

        x10 = lax.while_loop(lambda x: x <= 3, body, x2)
        return hcb.id_print(x10, where="end", output_stream=stream)

    with hcb.outfeed_receiver():
        assert maybe_jit(with_jit, func)(1) == 4
    assert_printed(
        """where: 1\n1\nwhere: 2\n2\nwhere: w_b_1\n2\nwhere: w_b_t\n3\nwhere: w_b_2\n3
        where: w_b_1\n3\nwhere: w_b_f\n-1\nwhere: w_b_2\n4\nwhere: end\n4""",
        stream.take(),
    )


def test_jit_while_pred_tap() -> None:
    # Skipped in the seed's file ("not yet implemented"); the expectation is the
    # module's, from its next revision.
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1")
        x10 = lax.while_loop(
            lambda x: hcb.id_print(x < 3, where="w_p", output_stream=stream),
            lambda x: hcb.id_print(x + 1, where="w_b", output_stream=stream),
            x1,
        )
        return hcb.id_print(x10, where="3", output_stream=stream)

    with hcb.outfeed_receiver():
        assert jax.jit(func)(1) == 3
    assert_printed(
        """where: w_p\nTrue\nwhere: w_b\n2\nwhere: w_p\nTrue\nwhere: w_b\n3
        where: w_p\nFalse\nwhere: 3\n3""",
        stream.take(),
    )


@pytest.mark.parametrize("with_jit", [False, True])
def test_scan_cond(with_jit: bool) -> None:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1", output_stream=stream)
        x2 = hcb.id_print(x1 + 1, where="2", output_stream=stream)

        def body(c: Any, x: Any) -> Any:
            x3 = hcb.id_print(x, where="s_1", output_stream=stream)
            x4 = lax.cond(
                x % 2 == 0,
                lambda x: hcb.id_print(x, where="s_t", output_stream=stream),
                lambda x: hcb.id_print(-1, where="s_f", result=x, output_stream=stream),
                x3 + 1,
            )
            return (c, hcb.id_print(x4, where="s_2", output_stream=stream))

        _, x10 = lax.scan(body, x2, jnp.arange(3))
        return hcb.id_print(x10, where="10", output_stream=stream)

    with hcb.outfeed_receiver():
        res = maybe_jit(with_jit, func)(1)
    np.testing.assert_array_equal(res, [1, 2, 3])
    assert_printed(
        """where: 1\n1\nwhere: 2\n2\nwhere: s_1\n0\nwhere: s_t\n1\nwhere: s_2\n1
        where: s_1\n1\nwhere: s_f\n-1\nwhere: s_2\n2\nwhere: s_1\n2\nwhere: s_t\n3
        where: s_2\n3\nwhere: 10\n[1 2 3]""",
        stream.take(),
    )


DTYPES = [
    jnp.bool_,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.uint8,
    jnp.uint32,
    jnp.float16,
    jnp.bfloat16,
    jnp.float32,
    jnp.complex64,
    jnp.float8_e4m3fn,
    jnp.int4,
]


@pytest.mark.parametrize("nr_args", [1, 2])
@pytest.mark.parametrize("shape", [(), (2, 3)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_jit_types(nr_args: int, shape: tuple[int, ...], dtype: Any) -> None:
    # The seed skipped complex and bool; every jax dtype taps here.
    arg = (np.arange(np.prod(shape, dtype=int)) % 2).astype(dtype).reshape(shape)
    args = [arg] * nr_args
    seen: list[Any] = []
    res = jax.jit(lambda xs: hcb.id_tap(lambda a, **kw: seen.append(a), xs, what="types"))(args)
    hcb.barrier_wait()
    assert len(seen) == 1 and len(seen[0]) == nr_args
    for got, want in zip(seen[0], args, strict=True):
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        np.testing.assert_array_equal(got.astype(np.complex64), want.astype(np.complex64))
    for r in res:
        np.testing.assert_array_equal(np.asarray(r), arg)


def test_jit_large() -> None:
    arg = jnp.arange(10000, dtype=jnp.int32).reshape((10, 10, 5, -1))
    with hcb.outfeed_receiver():
        jax.jit(lambda x: hcb.id_print(x, output_stream=stream))(arg)
    assert lines(stream.take())[0].startswith("[[[[")


def test_jit_several_together() -> None:
    arg = jnp.arange(50, dtype=jnp.int32).reshape((10, 5))
    with hcb.outfeed_receiver():
        jax.jit(lambda x, y: hcb.id_print((x, y, x * 2.0), output_stream=stream))(
            arg, jnp.ones(100, dtype=jnp.int32)
        )
    assert len(stream.take_untransformed()) > 0


def test_jit_interleaving() -> None:
    count = 0
    nr_arrays = 5

    def tap_func(arg: Any, **kwargs: Any) -> None:
        nonlocal count
        assert len(arg) == nr_arrays
        count += 1

    def func(x: Any, count: int) -> Any:
        for i in range(count):
            x = hcb.id_tap(tap_func, [x + i for i in range(nr_arrays)], i=i)[-1]
        return x

    with hcb.outfeed_receiver():
        x = jnp.array(1, dtype=np.int32)
        res = 0
        for _ in range(10):
            res += jax.jit(lambda x: func(x, 10))(x)
    assert count == 100


def test_jit_without_receiver_is_fine() -> None:
    # Difference: the module raised "outfeed_receiver is not started" (also for an
    # eager while, which ran compiled code); here the first tap starts a receiver.
    assert jax.jit(lambda x: hcb.id_print(x, output_stream=stream))(0) == 0
    y = jnp.ones(5)
    lax.while_loop(
        lambda c: c[1] < 5,
        lambda c: (y, hcb.id_print(c[1], output_stream=stream) + 1),
        (y, 1),
    )
    assert_printed("0\n1\n2\n3\n4", stream.take())


def test_while() -> None:
    y = jnp.ones(5)

    def func(x: Any) -> Any:
        return lax.while_loop(
            lambda c: c[1] < 5,
            lambda c: (y, hcb.id_print(c[1], output_stream=stream) + 1),
            (x, 1),
        )

    with hcb.outfeed_receiver():
        func(y)
    assert_printed("1\n2\n3\n4", stream.take())


def test_jvp() -> None:
    with hcb.outfeed_receiver():
        res_primals, res_tangents = jax.jvp(fun1, (jnp.float32(5.0),), (jnp.float32(0.1),))
    np.testing.assert_allclose(res_primals, 100.0)
    np.testing.assert_allclose(res_tangents, 4.0, rtol=1e-6)
    assert_printed(
        """what: a * 2\n10.00\ntransforms: ('jvp',) what: a * 2\n0.20
        what: y * 3\n30.00\ntransforms: ('jvp',) what: y * 3\n0.60""",
        stream.take(),
    )


def test_grad_primal_unused() -> None:
    def func(x: Any) -> Any:
        return 2.0 * hcb.id_print(x * 3.0, what="x * 3", output_stream=stream)

    # The seed's make_jaxpr ran the cotangent tap once (an artefact of its
    # tracing); tracing runs no tap here.
    jax.make_jaxpr(jax.grad(func))(5.0)
    assert stream.take() == ""
    with hcb.outfeed_receiver():
        res_grad = jax.grad(func)(jnp.float32(5.0))
    np.testing.assert_allclose(res_grad, 6.0)
    assert_printed(
        "what: x * 3\n15.00\ntransforms: ('jvp', 'transpose') what: x * 3\n2.00",
        stream.take(),
    )


def test_grad_simple() -> None:
    def func(x: Any) -> Any:
        y = hcb.id_print(x * 2.0, what="x * 2", output_stream=stream)
        return x * hcb.id_print(y * 3.0, what="y * 3", output_stream=stream)

    with hcb.outfeed_receiver():
        res_grad = jax.grad(func)(jnp.float32(5.0))
    np.testing.assert_allclose(res_grad, 2.0 * 5.0 * 6.0)
    assert_printed(
        """what: x * 2\n10.00\nwhat: y * 3\n30.00
        transforms: ('jvp', 'transpose') what: y * 3\n5.00
        transforms: ('jvp', 'transpose') what: x * 2\n15.00""",
        stream.take(),
    )


def test_grad_double() -> None:
    def func(x: Any) -> Any:
        y = hcb.id_print(x * 2.0, what="x * 2", output_stream=stream)
        return x * (y * 3.0)

    with hcb.outfeed_receiver():
        res_grad = jax.grad(jax.grad(func))(jnp.float32(5.0))
    np.testing.assert_allclose(res_grad, 12.0)
    assert_printed(
        """what: x * 2\n10.00
        transforms: ('jvp', 'transpose') what: x * 2\n15.00
        transforms: ('jvp', 'transpose', 'jvp', 'transpose') what: x * 2\n2.00
        transforms: ('jvp', 'transpose') what: x * 2\n3.00""",
        stream.take(),
    )


def test_vmap() -> None:
    vargs = jnp.array([4.0, 5.0], jnp.float32)
    with hcb.outfeed_receiver():
        res = jax.vmap(fun1)(vargs)
    np.testing.assert_allclose(res, (vargs * 2) ** 2)
    # batch_dims lists the tapped value's dims: (0,) for id_print(y * 3, result=y), as
    # the module recorded from 2021 on; the 2020 module's test expected (0, 0) there
    # (it listed the result= operand too, which the tap function never receives).
    assert_printed(
        """batch_dims: (0,) transforms: ('batch',) what: a * 2\n[ 8.00 10.00]
        batch_dims: (0,) transforms: ('batch',) what: y * 3\n[24.00 30.00]""",
        stream.take(),
    )


def test_vmap_not_batched() -> None:
    x = 3.0

    def func(y: Any) -> Any:
        _, y = hcb.id_print((x, y), output_stream=stream)
        return x + y

    with hcb.outfeed_receiver():
        jax.vmap(func)(jnp.array([4.0, 5.0], jnp.float32))
    assert_printed(
        "batch_dims: (None, 0) transforms: ('batch',)\n[ 3.00\n  [4.00 5.00] ]",
        stream.take(),
    )


def test_double_vmap() -> None:
    # From the module's next revision (transforms in the seed's layout).
    def add(x: Any, y: Any) -> Any:
        return hcb.id_print(x + y, output_stream=stream)

    def sum_all(xv: Any, yv: Any) -> Any:
        rows = jax.vmap(lambda xv, y: jax.vmap(add, in_axes=(0, None))(xv, y), (None, 0))
        return rows(xv, yv)

    with hcb.outfeed_receiver():
        sum_all(jnp.arange(5, dtype=np.int32), jnp.arange(3, dtype=np.int32))
    assert_printed(
        """batch_dims: (0,) transforms: ('batch', 'batch')
        [[0 1 2 3 4]\n[1 2 3 4 5]\n[2 3 4 5 6]]""",
        stream.take(),
    )


def _max_2(with_cond_tap: bool) -> Any:
    def func(x: Any) -> Any:
        x1 = hcb.id_print(x, where="1", output_stream=stream)

        def cond(x: Any) -> Any:
            return (
                hcb.id_print(x < 2, where="w_c", output_stream=stream) if with_cond_tap else x < 2
            )

        x2 = lax.while_loop(
            cond, lambda x: hcb.id_print(x + 1, where="w_b", output_stream=stream), x1
        )
        return hcb.id_print(x2, where="3", output_stream=stream)

    return func


def test_vmap_while() -> None:
    with hcb.outfeed_receiver():
        res = jax.jit(jax.vmap(_max_2(False)))(np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(res, [2, 2, 2, 3, 4])
    head = "batch_dims: (0,) transforms: ('batch',) where:"
    assert_printed(
        f"""{head} 1\n[0 1 2 3 4]\n{head} w_b\n[1 2 3 4 5]\n{head} w_b\n[2 3 3 4 5]
        {head} 3\n[2 2 2 3 4]""",
        stream.take(),
    )


@pytest.mark.parametrize("with_jit", [False, True])
def test_vmap_while_tap_cond(with_jit: bool) -> None:
    # jax 0.10.2 alone gives [2 3 4 5 6] here (NOTE [tap in a batched while condition]).
    with hcb.outfeed_receiver():
        res = maybe_jit(with_jit, jax.vmap(_max_2(True)))(np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(res, [2, 2, 2, 3, 4])
    head = "batch_dims: (0,) transforms: ('batch',) where:"
    assert_printed(
        f"""{head} 1\n[0 1 2 3 4]\n{head} w_c\n[ True  True False False False]
        {head} w_b\n[1 2 3 4 5]\n{head} w_c\n[ True False False False False]
        {head} w_b\n[2 3 3 4 5]\n{head} w_c\n[False False False False False]
        {head} 3\n[2 2 2 3 4]""",
        stream.take(),
    )


def test_pmap() -> None:
    n = jax.local_device_count()
    vargs = 2.0 + jnp.arange(n, dtype=jnp.float32)
    with hcb.outfeed_receiver():
        res = pmap(fun1, axis_name="i")(vargs)
    np.testing.assert_allclose(res, jnp.stack([(2.0 * (2.0 + a)) ** 2 for a in range(n)]))
    printed = lines(stream.take())
    assert sorted(printed[1::2]) == sorted(
        [f"{2.0 * (2.0 + a):.2f}" for a in range(n)] + [f"{6.0 * (2.0 + a):.2f}" for a in range(n)]
    )
