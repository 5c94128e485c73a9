"""``id_tap`` as a drop-in for jax's host_callback: what code written for
the 2020 or the 2021-2024 module relies on.

Tap values are compared with numpy; programs with taps with the same programs
without them.
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
from partitioner import pjit, pmap
from partitioner._src.host_callback.primitive import TapParams
from tests.helpers import devices

DTYPES = [jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int4, jnp.uint4, jnp.bool_]
DTYPES += [jnp.complex64, jnp.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_jax_dtype_taps_eagerly_and_compiled(dtype: Any) -> None:
    x = jnp.asarray(np.arange(6) % 2, dtype=dtype).reshape(2, 3)
    seen: list[Any] = []
    for f in (lambda v: hcb.id_tap(lambda a, _: seen.append(a), v), jax.jit):
        out = (
            f(x)
            if f is not jax.jit
            else jax.jit(lambda v: hcb.id_tap(lambda a, _: seen.append(a), v))(x)
        )
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    hcb.barrier_wait()
    assert len(seen) == 2
    for got in seen:
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, np.asarray(x))


def test_typed_prng_key_taps_as_a_key_array(partitioner_mode) -> None:
    key = jax.random.key(7, impl="rbg")
    seen: list[Any] = []

    def f(k: Any, x: Any) -> Any:
        k, x = hcb.id_tap(lambda a, _: seen.append(a), (k, x))
        return jax.random.uniform(k, x.shape) + x

    want = jax.random.uniform(key, (8,)) + 1
    with partitioner.mesh(devices(8), ("x",)):
        got = pjit(f, (None, P("x")), P("x"))(key, np.ones(8, np.float32))
    np.testing.assert_allclose(np.asarray(got), want)
    np.testing.assert_allclose(np.asarray(f(key, np.ones(8, np.float32))), want)
    hcb.barrier_wait()
    for k, x in seen:
        assert jax.random.key_impl(k) == jax.random.key_impl(key)
        np.testing.assert_array_equal(jax.random.key_data(k), jax.random.key_data(key))
        np.testing.assert_array_equal(x, np.ones(8))


def test_an_eager_result_can_be_tapped_again() -> None:
    seen: list[Any] = []
    y = hcb.id_tap(lambda a, _: seen.append(a), 10.0)
    z = hcb.id_tap(lambda a, _: seen.append(a), 1.0, result=y)
    w = hcb.id_tap(lambda a, _: seen.append(a), (y, z))
    hcb.barrier_wait()
    assert float(z) == 10.0 and [float(v) for v in w] == [10.0, 10.0]
    assert [np.asarray(s).tolist() for s in seen] == [10.0, 1.0, [10.0, 10.0]]


def test_eager_tap_with_device_on_python_values_gets_the_default_device() -> None:
    seen: list[Any] = []
    hcb.id_tap(lambda a, _, device: seen.append(device), 1.0, tap_with_device=True)
    hcb.id_tap(lambda a, _, device: seen.append(device), np.ones(2), tap_with_device=True)
    hcb.barrier_wait()
    assert seen == [jax.local_devices()[0]] * 2


def test_tap_with_device_under_pjit_taps_the_whole_value_on_device_index() -> None:
    seen: list[Any] = []
    x = np.arange(16, dtype=np.float32).reshape(8, 2)

    def tap(a: Any, _: Any, device: Any) -> None:
        seen.append((device, a))

    with partitioner.mesh(devices(8), ("x",)):
        for index in (0, 6):
            f = pjit(
                lambda v, index=index: hcb.id_tap(
                    tap, v * 2, tap_with_device=True, device_index=index
                ),
                P("x"),
                P("x"),
            )
            np.testing.assert_array_equal(np.asarray(f(x)), x * 2)
        with pytest.raises(ValueError, match="device_index=9 but the program runs on 8"):
            pjit(lambda v: hcb.id_tap(tap, v, device_index=9), P("x"), P("x"))(x)
    hcb.barrier_wait()
    assert [d for d, _ in seen] == [jax.devices()[0], jax.devices()[6]]
    for _, a in seen:
        np.testing.assert_array_equal(a, x * 2)


# NOTE [calling conventions] in api.py: the signature picks the convention.
def _positional(arg: Any, transforms: Any) -> tuple[Any, ...]:
    return ("positional", transforms)


def _underscore(arg: Any, _: Any, *, what: str = "") -> tuple[Any, ...]:
    return ("positional", _, what)


def _varargs(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return ("positional", args[1:], kwargs)


def _seed(arg: Any, what: str = "", **kwargs: Any) -> tuple[Any, ...]:
    return ("keyword", what, kwargs)


def _names_transforms(arg: Any, *, transforms: Any, what: str = "") -> tuple[Any, ...]:
    return ("keyword", transforms, what)


CONVENTIONS = {
    _positional: (("positional", ()), ("positional", (("batch", {"batch_dims": (0,)}),))),
    _underscore: (
        ("positional", (), "w"),
        ("positional", (("batch", {"batch_dims": (0,)}),), "w"),
    ),
    _varargs: (
        ("positional", ((),), {"what": "w"}),
        ("positional", ((("batch", {"batch_dims": (0,)}),),), {"what": "w"}),
    ),
    _seed: (
        ("keyword", "w", {}),
        # The tapped leaf's dims only: result=(v, 2.0) passes by unrecorded.
        ("keyword", "w", {"transforms": ("batch",), "batch_dims": (0,)}),
    ),
    _names_transforms: (("keyword", (), "w"), ("keyword", ("batch",), "w")),
}


@pytest.mark.parametrize("func", list(CONVENTIONS), ids=lambda f: f.__name__)
def test_the_tap_functions_signature_picks_its_calling_convention(func: Any) -> None:
    got: list[Any] = []

    def recorded(*args: Any, **kwargs: Any) -> None:
        got.append(func(*args, **kwargs))

    recorded.__signature__ = __import__("inspect").signature(func)  # type: ignore[attr-defined]
    kwargs = {} if func is _positional else {"what": "w"}
    hcb.id_tap(recorded, 1.0, **kwargs)
    jax.vmap(lambda v: hcb.id_tap(recorded, v, result=(v, 2.0), **kwargs))(jnp.ones(2))
    hcb.barrier_wait()
    assert tuple(got) == CONVENTIONS[func]


def _with_taps(tap: bool) -> dict[str, Any]:
    def t(x: Any) -> Any:
        return hcb.id_tap(lambda a, _: None, x) if tap else x

    return {
        "cond": lambda x: lax.cond(x % 2 == 0, lambda x: t(x * 2), lambda x: t(x - 1), x),
        "cond_pred": lambda x: lax.cond(t(x % 2 == 0), lambda x: x * 2, lambda x: x - 1, x),
        "scan": lambda x: lax.scan(lambda c, i: (t(c + i * x), t(c)), x, jnp.arange(3)),
        "while_cond": lambda x: lax.while_loop(lambda x: t(x < 3), lambda x: t(x + 1), x),
        "nested_while_cond": lambda x: lax.while_loop(
            lambda c: t(c[0] < 3),
            lambda c: (c[0] + 1, lax.while_loop(lambda y: t(y < c[0]), lambda y: y + 1, c[1])),
            (x, x),
        ),
        "remat": lambda x: jax.checkpoint(lambda x: t(x * x) + 1)(x),
        "fori_remat": lambda x: lax.fori_loop(0, 2, jax.remat(lambda i, k: k * t(k + i)), x),
    }


TRANSFORMS = {
    "vmap": (jax.vmap, (5,)),
    "jit(vmap)": (lambda f: jax.jit(jax.vmap(f)), (5,)),
    "vmap(vmap)": (lambda f: jax.vmap(jax.vmap(f)), (1, 5)),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("program", list(_with_taps(False)))
@pytest.mark.slow
def test_vmap_of_control_flow_with_taps_computes_what_it_computes_without(
    program: str, transform: str
) -> None:
    # jax 0.10.2 alone gets while_cond wrong (NOTE [tap in a batched while condition]).
    make, shape = TRANSFORMS[transform]
    xs = np.arange(5, dtype=np.int32).reshape(shape)
    want = make(_with_taps(False)[program])(xs)
    got = make(_with_taps(True)[program])(xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    hcb.barrier_wait()


def test_tap_params_are_a_checked_dataclass() -> None:
    jaxpr = jax.make_jaxpr(lambda x: hcb.id_tap(print, x, result=x + 1))(1.0)
    eqn = next(e for e in jaxpr.eqns if e.primitive.name == "id_tap")
    p = TapParams.of(eqn.params)
    assert p.nr_untapped == 1 and p.transforms == () and p.batch_levels == ()
    assert p.with_transform("jvp").transforms == ("jvp",)
    with pytest.raises(ValueError, match="batch_levels"):  # a vmap level records its dims
        p.with_transform("batch")
    with pytest.raises(ValueError, match="nr_untapped"):
        p.replace(nr_untapped=-1)
    with pytest.raises(TypeError, match="transforms"):
        p.replace(transforms=(1,))


def test_outfeed_receiver_takes_the_seeds_backends_and_devices() -> None:
    seen: list[Any] = []
    with hcb.outfeed_receiver(backends=["cpu"]):
        jax.jit(lambda v: hcb.id_tap(lambda a, _: seen.append(a), v))(1)
    with hcb.outfeed_receiver(devices=jax.devices()[:2], receiver_name="two"):
        hcb.id_tap(lambda a, _: seen.append(a), 2)
    assert [int(v) for v in seen] == [1, 2]
    with pytest.raises(ValueError, match="at most one of"):
        with hcb.outfeed_receiver(backends=["cpu"], devices=jax.devices()):
            pass
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        with hcb.outfeed_receiver(backends=["nope"]):
            pass
    with pytest.raises(TypeError, match="jax.Device"):
        with hcb.outfeed_receiver(devices=[0]):
            pass


@pytest.mark.parametrize("flavor", list(hcb.CallbackFlavor))
def test_every_callback_flavor_taps_in_order(flavor: Any) -> None:
    seen: list[Any] = []
    f = jax.jit(
        lambda v: hcb.id_tap(lambda a, _: seen.append(int(a)), v + 1, callback_flavor=flavor) * 0
    )
    for i in range(3):
        f(i)
    hcb.barrier_wait()
    assert seen == [1, 2, 3]


def test_pmap_body_taps_each_device_in_program_order(partitioner_mode) -> None:
    # NOTE [taps in manual regions]: the classic per-device log of a pmap body.
    seen: list[Any] = []

    def tap(arg: Any, _: Any, device: Any, what: str) -> None:
        seen.append((device.id, what, np.asarray(arg).tolist()))

    def body(x: Any) -> Any:
        y = hcb.id_tap(tap, x * 2, tap_with_device=True, what="a")
        z = lax.fori_loop(
            0, 2, lambda i, v: hcb.id_tap(tap, v + 1, tap_with_device=True, what="b"), y
        )
        return hcb.id_tap(tap, z.sum(), tap_with_device=True, what="c")

    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    for _ in range(2):  # call order too
        got = pmap(body)(x)
        np.testing.assert_allclose(np.asarray(got), (x * 2 + 2).sum(axis=1))
    hcb.barrier_wait()
    for d in range(8):
        row = x[d] * 2
        want = [
            ("a", row.tolist()),
            ("b", (row + 1).tolist()),
            ("b", (row + 2).tolist()),
            ("c", float((row + 2).sum())),
        ]
        assert [(w, v) for dev, w, v in seen if dev == d] == want * 2
