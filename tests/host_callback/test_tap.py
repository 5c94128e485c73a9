"""Host callbacks: ``id_tap`` semantics (seed 003).

Every tap's values are compared with numpy on the same inputs; orders are
compared with the program and call order. ``id_print``'s text is in test_print.py,
``call`` in test_call.py, the receiver in test_receiver.py, and what code written
for jax's own host_callback relies on in test_dropin.py.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import host_callback as hcb
from partitioner import pjit
from partitioner.host_callback import barrier_wait, id_print, id_tap
from partitioner.testing.plugin import MeshFactory
from tests.helpers import devices


class Recorder:
    """A tap function keeping ``(what, value, transforms, other kwargs)`` per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, tuple[str, ...], dict[str, Any]]] = []

    def __call__(self, arg: Any, *, transforms: tuple[str, ...], **kwargs: Any) -> None:
        what = kwargs.pop("what", None)
        self.calls.append((what, arg, transforms, kwargs))

    def values(self) -> list[Any]:
        return [v for _, v, _, _ in self.calls]

    def whats(self) -> list[Any]:
        return [w for w, _, _, _ in self.calls]

    def take(self) -> list[tuple[Any, Any, tuple[str, ...], dict[str, Any]]]:
        barrier_wait()
        calls, self.calls = self.calls, []
        return calls


def mesh8() -> Any:
    return partitioner.mesh(devices(8), ("x",))


# --- the identity, eagerly and under jax.jit ---


def test_eager_tap_is_the_identity_and_calls_the_tap_function() -> None:
    rec = Recorder()
    x = {"a": np.arange(3.0), "b": (np.float32(2.0), jnp.ones((2, 2)))}
    out = id_tap(rec, x, what="eager", extra=[1, {"k": "any object"}])
    jax.tree.map(np.testing.assert_array_equal, out, x)
    [(what, value, transforms, kwargs)] = rec.take()
    assert what == "eager" and transforms == () and kwargs == {"extra": [1, {"k": "any object"}]}
    assert jax.tree.structure(value) == jax.tree.structure(x)
    jax.tree.map(np.testing.assert_array_equal, value, x)
    assert all(isinstance(v, np.ndarray) for v in jax.tree.leaves(value))


def test_result_is_returned_and_arg_tapped(jax_partitioner_mode) -> None:
    rec = Recorder()

    def f(x: Any, y: Any) -> Any:
        return id_tap(rec, x * 2, result=(y + 1, y * 3)) if True else None

    x, y = np.arange(4.0), np.arange(4.0) + 10
    got = jax.jit(f)(x, y)
    np.testing.assert_array_equal(got[0], y + 1)
    np.testing.assert_array_equal(got[1], y * 3)
    [(_, value, _, _)] = rec.take()
    np.testing.assert_array_equal(value, x * 2)


def test_jax_jit_taps_once_per_call_in_call_order(jax_partitioner_mode) -> None:
    rec = Recorder()
    f = jax.jit(lambda x: id_tap(rec, x * 2, what="jit") + 1)
    outs = [f(np.arange(3.0) + i) for i in range(20)]
    calls = rec.take()
    assert rec.whats() == [] and [c[0] for c in calls] == ["jit"] * 20
    for i, (_, value, _, _) in enumerate(calls):
        np.testing.assert_array_equal(value, (np.arange(3.0) + i) * 2)
    np.testing.assert_array_equal(outs[-1], (np.arange(3.0) + 19) * 2 + 1)


# --- pjit over 8 devices ---


def test_pjit_tap_sees_the_global_value_once_per_execution(partitioner_mode) -> None:
    rec = Recorder()
    with mesh8():
        f = pjit(lambda x: id_tap(rec, x * 2, what="g") + 1, P("x"), P("x"))
        xs = [np.arange(16.0).reshape(8, 2) + i for i in range(5)]
        outs = [f(x) for x in xs]
    calls = rec.take()
    assert len(calls) == 5
    for x, out, (_, value, transforms, kwargs) in zip(xs, outs, calls, strict=True):
        np.testing.assert_array_equal(value, x * 2)
        np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
        assert transforms == () and kwargs == {}


def test_pjit_tap_with_device_sees_each_shard_once(partitioner_mode) -> None:
    rec = Recorder()
    with mesh8():
        f = pjit(
            lambda x: id_tap(rec, x * 2, tap_with_device=True, per_shard=True) + 1, P("x"), P("x")
        )
        xs = [np.arange(16.0).reshape(8, 2) + 100 * i for i in range(3)]
        for x in xs:
            f(x)
    calls = rec.take()
    assert len(calls) == 3 * 8
    for i, x in enumerate(xs):  # rounds in call order, each in device order
        for d in range(8):
            _, value, _, kwargs = calls[8 * i + d]
            assert kwargs["device"] == jax.devices()[d]
            np.testing.assert_array_equal(value, (x * 2)[d : d + 1])


def test_eager_tap_with_device_sees_each_addressable_shard(mesh: MeshFactory) -> None:
    rec = Recorder()
    jax_mesh = mesh((4, 2), ("a", "b"))
    x = jax.device_put(np.arange(32.0).reshape(8, 4), NamedSharding(jax_mesh, P("a", "b")))
    id_tap(rec, x, tap_with_device=True, per_shard=True)
    calls = rec.take()
    assert [c[3]["device"] for c in calls] == sorted(jax.devices(), key=lambda d: d.id)
    by_device = {s.device: np.asarray(s.data) for s in x.addressable_shards}
    for _, value, _, kwargs in calls:
        np.testing.assert_array_equal(value, by_device[kwargs["device"]])


def test_global_and_device_taps_keep_program_order(partitioner_mode) -> None:
    rec = Recorder()

    def f(x: Any) -> Any:
        x = id_tap(rec, x + 1, what="first")
        x = id_tap(rec, x * 2, what="per-device", tap_with_device=True, per_shard=True)
        return id_tap(rec, x.sum(), what="last", result=x)

    with mesh8():
        g = pjit(f, P("x"), P("x"))
        for i in range(6):
            g(np.arange(8.0) + i)
    calls = rec.take()
    expected = (["first"] + ["per-device"] * 8 + ["last"]) * 6
    assert [c[0] for c in calls] == expected
    for i in range(6):
        x = np.arange(8.0) + i
        np.testing.assert_array_equal(calls[10 * i][1], x + 1)
        assert [calls[10 * i + 1 + d][1].item() for d in range(8)] == list((x + 1) * 2)
        np.testing.assert_array_equal(calls[10 * i + 9][1], ((x + 1) * 2).sum())


def test_nested_pjits_tap_in_program_order(partitioner_mode) -> None:
    rec = Recorder()
    with mesh8():
        inner = pjit(lambda x: id_tap(rec, x * 3, what="inner"), P("x"), P(None))

        def outer(x: Any) -> Any:
            x = id_tap(rec, x + 1, what="outer-before")
            y = inner(x)
            return id_tap(rec, y - 1, what="outer-after")

        f = pjit(outer, P("x"), P("x"))
        for i in range(3):
            out = f(np.arange(8.0) + i)
    calls = rec.take()
    assert [c[0] for c in calls] == ["outer-before", "inner", "outer-after"] * 3
    x = np.arange(8.0) + 2
    np.testing.assert_array_equal(calls[-2][1], (x + 1) * 3)
    np.testing.assert_array_equal(np.asarray(out), (x + 1) * 3 - 1)


def test_pjit_inside_jax_jit_taps(jax_partitioner_mode) -> None:
    rec = Recorder()
    with mesh8():
        inner = pjit(lambda x: id_tap(rec, x * 2, what="inner"), P("x"), P("x"))
        f = jax.jit(lambda x: id_tap(rec, inner(x) + 1, what="jit"))
        out = f(np.arange(8.0))
    calls = rec.take()
    assert [c[0] for c in calls] == ["inner", "jit"]
    np.testing.assert_array_equal(calls[1][1], np.arange(8.0) * 2 + 1)
    np.testing.assert_array_equal(np.asarray(out), np.arange(8.0) * 2 + 1)


# --- control flow ---


def test_scan_while_cond_tap_once_per_iteration_in_order(partitioner_mode) -> None:
    rec = Recorder()

    def f(xs: Any) -> Any:
        def body(carry: Any, x: Any) -> Any:
            carry = carry + id_tap(rec, x.sum(), what="scan")
            return carry, carry

        total, _ = jax.lax.scan(body, 0.0, xs)

        def cond(state: Any) -> Any:
            return state[0] < 3

        def step(state: Any) -> Any:
            i, v = state
            return i + 1, id_tap(rec, v * 2, what="while")

        _, v = jax.lax.while_loop(cond, step, (0, total))
        return jax.lax.cond(
            v > 0,
            lambda v: id_tap(rec, v + 1, what="cond-true"),
            lambda v: id_tap(rec, v - 1, what="cond-false"),
            v,
        )

    xs = np.arange(32.0).reshape(4, 8)
    with mesh8():
        out = pjit(f, P(None, "x"), None)(xs)
    calls = rec.take()
    assert [c[0] for c in calls] == ["scan"] * 4 + ["while"] * 3 + ["cond-true"]
    sums = xs.sum(axis=1)
    np.testing.assert_allclose([c[1] for c in calls[:4]], sums)
    total = sums.sum()
    np.testing.assert_allclose([c[1] for c in calls[4:7]], [total * 2, total * 4, total * 8])
    np.testing.assert_allclose(np.asarray(out), total * 8 + 1)


# --- transformations ---


def test_vmap_taps_the_batched_value_with_batch_dims(partitioner_mode) -> None:
    rec = Recorder()

    def f(x: Any, y: Any) -> Any:
        return id_tap(rec, (x * 2, y), what="v")[0].sum()

    xs = np.arange(32.0).reshape(4, 8)
    with mesh8():
        g = pjit(jax.vmap(f, in_axes=(1, None)), (P(None, "x"), None), None)
        out = g(xs, np.float32(5.0))
    [(_, value, transforms, kwargs)] = rec.take()
    assert transforms == ("batch",) and kwargs == {"batch_dims": (1, None)}
    np.testing.assert_array_equal(value[0], xs * 2)
    np.testing.assert_array_equal(value[1], 5.0)
    np.testing.assert_allclose(np.asarray(out), (xs * 2).sum(axis=0))


def _level(*dims: int | None) -> tuple[str, dict[str, Any]]:
    return ("batch", {"batch_dims": dims})


# (how f(x, r) is vmapped, the seed's transforms= and batch_dims= (its kwargs),
# the 2021-2024 tap function's transforms): only the tapped value's dims, as jax's
# host_callback recorded them from 2021 on; the result= operand passes by unrecorded.
RESULT_BATCHING = [
    pytest.param(
        lambda f: jax.vmap(f, in_axes=(1, 0)),
        {"transforms": ("batch",), "batch_dims": (1,)},
        (_level(1),),
        id="result-batched-on-another-axis",
    ),
    pytest.param(
        lambda f: jax.vmap(f, in_axes=(1, None)),
        {"transforms": ("batch",), "batch_dims": (1,)},
        (_level(1),),
        id="result-unbatched",
    ),
    pytest.param(lambda f: jax.vmap(f, in_axes=(None, 0)), {}, (), id="only-the-result-batched"),
    pytest.param(
        lambda f: jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(1, 0)),
        {"transforms": ("batch", "batch"), "batch_dims": (1,)},
        (_level(0), _level(1)),
        id="nested",
    ),
    pytest.param(
        lambda f: jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(1, 0)),
        {"transforms": ("batch",), "batch_dims": (1,)},
        (_level(1),),
        id="nested-inner-batches-only-the-result",
    ),
]


@pytest.mark.parametrize("vmapped, seed_record, levels", RESULT_BATCHING)
def test_vmap_records_the_tapped_values_batch_dims_only(
    vmapped: Any, seed_record: dict[str, Any], levels: tuple[Any, ...]
) -> None:
    seen: list[tuple[Any, ...]] = []

    def seed(arg: Any, **kwargs: Any) -> None:
        seen.append((np.asarray(arg), kwargs))

    def positional(arg: Any, transforms: Any) -> None:
        seen.append((np.asarray(arg), transforms))

    x, r = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    for tap, record in ((seed, seed_record), (positional, levels)):
        f = vmapped(lambda a, b, tap=tap: id_tap(tap, a * 3, result=b))
        want = vmapped(lambda a, b: b)(x, r)
        np.testing.assert_array_equal(np.asarray(f(x, r)), np.asarray(want))
        barrier_wait()
        [(value, got)] = seen
        seen.clear()
        # The batched value is tapped once, whole, where its batch axes are.
        np.testing.assert_array_equal(value, x * 3)
        assert got == record, (tap.__name__, got)


def test_jvp_taps_primals_then_tangents() -> None:
    rec = Recorder()
    f = jax.jit(lambda x: id_tap(rec, jnp.sin(x), what="t") * 3)
    x, t = np.arange(3.0, dtype=np.float32), np.ones(3, np.float32)
    _, tangent_out = jax.jvp(f, (x,), (t,))
    calls = rec.take()
    assert [c[2] for c in calls] == [(), ("jvp",)]
    np.testing.assert_allclose(calls[0][1], np.sin(x), rtol=1e-6)
    np.testing.assert_allclose(calls[1][1], np.cos(x) * t, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(tangent_out), 3 * np.cos(x), rtol=1e-6)


def test_grad_of_pjit_taps_cotangents_with_jvp_transpose(partitioner_mode) -> None:
    rec = Recorder()

    def loss(w: Any, x: Any) -> Any:
        h = id_tap(rec, jnp.tanh(x @ w), what="h")
        return (h**2).sum()

    w = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    x = np.linspace(0, 1, 32, dtype=np.float32).reshape(8, 4)
    with mesh8():
        g = pjit(jax.grad(loss), (P(None, None), P("x")), P(None, None))
        got = g(w, x)
    calls = rec.take()
    assert [c[2] for c in calls] == [(), ("jvp", "transpose")]
    h = np.tanh(x @ w)
    np.testing.assert_allclose(calls[0][1], h, rtol=1e-5)
    np.testing.assert_allclose(calls[1][1], 2 * h, rtol=1e-5)  # d(sum h^2)/dh
    np.testing.assert_allclose(np.asarray(got), jax.jit(jax.grad(loss))(w, x), rtol=1e-5)
    rec.take()


def test_grad_through_pjit_boundary_taps_cotangents(partitioner_mode) -> None:
    rec = Recorder()
    with mesh8():
        f = pjit(lambda x: id_tap(rec, x * 3, what="in"), P("x"), P("x"))
        got = jax.grad(lambda x: (f(x) ** 2).sum())(np.arange(8.0, dtype=np.float32))
    calls = rec.take()
    assert [c[2] for c in calls] == [(), ("jvp", "transpose")]
    x = np.arange(8.0, dtype=np.float32)
    np.testing.assert_allclose(calls[1][1], 2 * x * 3)
    np.testing.assert_allclose(np.asarray(got), 18 * x)


def test_checkpoint_reruns_forward_taps_in_the_backward_pass(partitioner_mode) -> None:
    rec = Recorder()

    @jax.checkpoint
    def block(x: Any) -> Any:
        return jnp.sin(id_tap(rec, x * 2, what="fwd"))

    with mesh8():
        g = pjit(jax.grad(lambda x: block(x).sum()), P("x"), P("x"))
        got = g(np.arange(8.0, dtype=np.float32))
    calls = rec.take()
    # NOTE [taps under checkpoint]: the recomputation taps again (the 2024 module).
    assert [(c[0], c[2]) for c in calls] == [
        ("fwd", ()),
        ("fwd", ()),
        ("fwd", ("jvp", "transpose")),
    ]
    np.testing.assert_array_equal(calls[0][1], calls[1][1])
    x = np.arange(8.0, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(got), 2 * np.cos(2 * x), rtol=1e-5)


@pytest.mark.slow
def test_10k_taps_from_8_devices_arrive_complete_and_in_order(partitioner_mode) -> None:
    seen: list[int] = []

    def f(x: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            return id_tap(lambda v, transforms: seen.append(int(v[0])), (i, x))[1] + 1

        return jax.lax.fori_loop(0, 2500, body, x)

    with mesh8():
        g = pjit(f, P("x"), P("x"))
        outs = [g(np.zeros(8, np.float32)) for _ in range(4)]
    barrier_wait()
    assert seen == list(range(2500)) * 4
    np.testing.assert_array_equal(np.asarray(outs[-1]), np.full(8, 2500.0))


@pytest.mark.slow
def test_10k_device_taps_arrive_complete_in_round_and_device_order(partitioner_mode) -> None:
    seen: list[tuple[int, int]] = []

    def f(x: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            tap = lambda v, transforms, device: seen.append((int(v[0]), device.id))  # noqa: E731
            return (
                id_tap(tap, x + i.astype(x.dtype), result=x, tap_with_device=True, per_shard=True)
                + 1
            )

        return jax.lax.fori_loop(0, 625, body, x)

    with mesh8():
        g = pjit(f, P("x"), P("x"))
        for _ in range(2):
            g(np.zeros(8, np.float32))
    barrier_wait()
    assert len(seen) == 10_000
    assert seen == [(2 * i, d) for i in range(625) for d in range(8)] * 2


# --- bad input ---


def test_bad_input_gets_clear_errors() -> None:
    with pytest.raises(TypeError, match="tap_func must be callable"):
        id_tap("print", np.ones(2))
    with pytest.raises(
        TypeError, match=r"arg\['name'\] must be an array or a scalar of a jax type, got str"
    ):
        id_tap(print, {"name": "loss", "value": np.ones(2)})
    with pytest.raises(TypeError, match=r"result\[1\] must be an array"):
        id_tap(print, np.ones(2), result=(np.ones(2), object()))
    with pytest.raises(TypeError, match=r"arg\['s'\] must be an array or a scalar of a jax type"):
        id_tap(print, {"s": np.array(["a"])})
    with pytest.raises(ValueError, match="device_index must be an int >= 0"):
        id_tap(print, 1.0, device_index=-1)
    with pytest.raises(ValueError, match="add tap_with_device=True"):
        id_tap(print, 1.0, per_shard=True)
    with pytest.raises(TypeError, match="callback_flavor must be"):
        id_tap(print, 1.0, callback_flavor="pure")
    with pytest.raises(TypeError, match="passed to the tap function by id_tap itself"):
        id_tap(print, np.ones(2), transforms=("mine",))
    with pytest.raises(TypeError, match="output_stream must have a write"):
        id_print(np.ones(2), output_stream="stdout")


def test_id_tap_inside_shard_map_taps_each_device(
    jax_partitioner_mode: str, mesh: MeshFactory
) -> None:
    # NOTE [taps in manual regions]: a fully manual body has per-device semantics.
    seen: list[Any] = []
    jax_mesh = mesh((8,), ("x",))
    body = jax.shard_map(
        lambda x: id_tap(
            lambda v, _, device: seen.append((device, v)), x * 2, tap_with_device=True
        ),
        mesh=jax_mesh,
        in_specs=P("x"),
        out_specs=P("x"),
    )
    x = np.arange(8.0, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(body)(x)), x * 2)
    barrier_wait()
    assert sorted((d.id, v.tolist()) for d, v in seen) == [(i, [2.0 * i]) for i in range(8)]


def test_id_tap_in_a_shard_map_over_some_axes(jax_partitioner_mode: str, mesh: MeshFactory) -> None:
    # NOTE [taps in partially manual regions]: once per index of the manual axis, on
    # the first device along the others; jax's own shard_map gives Shardy real tokens
    # there, which cannot enter: a clear error (our pmap regions work under both).
    seen: list[Any] = []
    mesh2 = mesh((4, 2), ("x", "y"))
    partial_manual = jax.shard_map(
        lambda x: id_tap(
            lambda v, _, device: seen.append((device.id, v.tolist())), x, tap_with_device=True
        ),
        mesh=mesh2,
        in_specs=P("x"),
        out_specs=P("x"),
        axis_names={"x"},
    )
    x = np.arange(8.0, dtype=np.float32)
    if jax_partitioner_mode == "shardy":
        with pytest.raises(ValueError, match=r"manual over only axes \['x'\] of a mesh with axes"):
            jax.jit(partial_manual)(x)
        return
    np.testing.assert_array_equal(np.asarray(jax.jit(partial_manual)(x)), x)
    barrier_wait()
    assert sorted(seen) == [(2 * i, [2.0 * i, 2.0 * i + 1]) for i in range(4)]


@pytest.mark.needs_devices(8)
def test_pmap_body_around_a_nested_pmap_taps_per_outer_device(partitioner_mode: str) -> None:
    # NOTE [taps in partially manual regions]: each outer index taps its whole block
    # once, on its first device, in program order with the inner map's taps there;
    # what cannot be ordered there (a tap in a loop, a call) is a clear error.
    seen: list[Any] = []

    def tap(v: Any, _: Any, device: Any, what: str) -> None:
        seen.append((device.id, what, v.tolist()))

    def body(xv: Any) -> Any:
        xv = id_tap(tap, xv + 1, tap_with_device=True, what="before")
        return partitioner.pmap(lambda x: id_tap(tap, x * 2, tap_with_device=True, what="in"))(xv)

    x = np.arange(8.0, dtype=np.float32).reshape(2, 4)
    got = partitioner.pmap(body, devices=jax.devices()[:8])(x.reshape(2, 4, 1))
    np.testing.assert_array_equal(np.asarray(got).reshape(2, 4), (x + 1) * 2)
    barrier_wait()
    for outer in (0, 1):
        first = [s for s in seen if s[0] == 4 * outer]
        assert first[0] == (4 * outer, "before", (x[outer] + 1).reshape(4, 1).tolist())
        assert first[1] == (4 * outer, "in", [2 * (x[outer, 0] + 1)])
    assert sorted(s[0] for s in seen if s[1] == "in") == list(range(8))
    assert sum(s[1] == "before" for s in seen) == 2

    def in_a_loop(xv: Any) -> Any:
        xv = jax.lax.fori_loop(0, 2, lambda i, v: id_tap(tap, v, what="loop"), xv)
        return partitioner.pmap(lambda x: x * 2)(xv)

    with pytest.raises(ValueError, match="inside `scan` in a body manual over only axes"):
        partitioner.pmap(in_a_loop)(x.reshape(2, 4, 1))

    def calling(xv: Any) -> Any:
        xv = hcb.call(lambda v: v, xv, result_shape=xv)
        return partitioner.pmap(lambda x: x * 2)(xv)

    with pytest.raises(ValueError, match="its result would have to reach every device"):
        partitioner.pmap(calling)(x.reshape(2, 4, 1))


def test_result_may_hold_prng_keys_through_jit_and_grad(partitioner_mode) -> None:
    rec = Recorder()

    def f(x: Any, key: Any) -> Any:
        y, key = id_tap(rec, x.sum(), result=(x * 2, key), what="k")
        return (y * jax.random.uniform(key, y.shape)).sum()

    key = jax.random.key(3)
    x = np.arange(8.0, dtype=np.float32)
    with mesh8():
        got = pjit(jax.grad(f), (P("x"), None), P("x"))(x, key)
    calls = rec.take()
    assert [c[2] for c in calls] == [(), ("jvp", "transpose")]
    np.testing.assert_allclose(calls[0][1], x.sum())
    want = jax.grad(lambda x: (x * 2 * jax.random.uniform(key, x.shape)).sum())(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    rec.take()


def test_a_tap_function_may_tap_eagerly() -> None:
    seen: list[str] = []

    def outer(x: Any, transforms: Any) -> None:
        seen.append("outer")
        id_tap(lambda v, transforms: seen.append("inner"), x)

    jax.jit(lambda x: id_tap(outer, x))(np.ones(2))
    barrier_wait()
    barrier_wait()  # the inner tap was queued while the outer one ran
    assert seen == ["outer", "inner"]
