"""jax's current pjit tests, adapted: optional shardings, the jit front door, committed inputs.

Scenarios and expected behaviour from jax's ``tests/pjit_test.py`` (``ArrayPjitTest``,
``PJitErrorTest``) as of jax 0.10.2, rewritten here. Where jax's ``jax.jit`` and its
current ``pjit`` agree (shardings omitted, or given as ``Sharding`` objects), a case runs
through both of partitioner's front doors (the ``door`` fixture: ``partitioner.pjit``
and ``partitioner.jit``) and is compared side by side with ``jax.jit`` on the same
inputs: values, output shardings (equivalence and type) and committedness. jax-internal
counters (``_pjit_lower.cache_info``, ``count_pjit_cpp_cache_miss``) become partitioner's
observable events (``partitioner.recording``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import partitioner

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    n = math.prod(shape)
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def _array(shape: tuple[int, ...], mesh: Mesh, spec: P) -> tuple[jax.Array, np.ndarray]:
    data = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    return jax.device_put(data, NamedSharding(mesh, spec)), data


def _same(ours: Any, theirs: Any) -> None:
    """Values, sharding (type and layout) and committedness as jax.jit's."""
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert type(a.sharding) is type(b.sharding), (a.sharding, b.sharding)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
        assert a.committed == b.committed, (a.committed, b.committed)


def _both(door: Callable[..., Any], fun: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run ``fun`` through ``door`` and through jax.jit with the same options; compare."""
    ours = door(fun, **kw)(*args)
    _same(ours, jax.jit(fun, **kw)(*args))
    return ours


# --- outputs and optional shardings (ArrayPjitTest) ---


@pytest.mark.parametrize(
    "out_spec, shard_shape",
    [(P("x", "y"), (2, 4)), (P(None), (8, 8))],
    ids=["sharded", "replicated"],
)
def test_single_output(
    door: Any, partitioner_mode: Any, out_spec: P, shard_shape: tuple[int, int]
) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    x, data = _array((8, 2), mesh, P("x", "y"))
    out = _both(door, lambda v: v @ v.T, x, out_shardings=NamedSharding(mesh, out_spec))
    assert out.committed and out.addressable_shards[0].data.shape == shard_shape
    for s in out.addressable_shards:
        np.testing.assert_array_equal(s.data, (data @ data.T)[s.index])


def test_numpy_input_assumed_replicated(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    data = np.arange(16, dtype=np.float32).reshape(8, 2)
    out = _both(door, lambda v: v, data, out_shardings=NamedSharding(mesh, P("x", "y")))
    assert all(s.data.shape == (2, 1) for s in out.addressable_shards)


def test_numpy_input_with_in_shardings(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    data = np.arange(16, dtype=np.float32).reshape(8, 2)
    _both(
        door,
        lambda v: v,
        data,
        in_shardings=NamedSharding(mesh, P(None)),
        out_shardings=NamedSharding(mesh, P("x", "y")),
    )


def test_unspecified_out_shardings_follow_the_input(door: Any, partitioner_mode: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    x, data = _array((8, 2), mesh, P("x", "y"))
    f = door(lambda v: v * 2)
    out = f(x)
    assert isinstance(out.sharding, NamedSharding) and out.addressable_shards[0].data.shape == (
        2,
        1,
    )
    out2 = f(out)
    np.testing.assert_array_equal(np.asarray(out2), data * 4)
    _same(out2, jax.jit(lambda v: v * 2)(jax.jit(lambda v: v * 2)(x)))


@pytest.mark.parametrize(
    "mesh_shape, s1, s2, s3, s4",
    [
        ((4, 2), (2, 8), (2, 2), (1, 2), (8, 2)),
        ((2, 2), (4, 8), (4, 2), (2, 2), (8, 2)),
        ((2, 1), (4, 8), (4, 2), (4, 2), (8, 2)),
    ],
)
def test_multi_input_multi_output(
    door: Any, mesh_shape: Any, s1: Any, s2: Any, s3: Any, s4: Any
) -> None:
    mesh = _mesh(mesh_shape, ("x", "y"))
    a1, data = _array((8, 2), mesh, P("x", "y"))
    a2, _ = _array((8, 2), mesh, P("x"))
    a3, _ = _array((8, 2), mesh, P(("x", "y")))
    a4, _ = _array((8, 2), mesh, P(None))
    tree = (a1 @ a1.T, (a2, (a3 * 2, a4)))
    out = _both(door, lambda t: t, tree)
    shapes = [o.addressable_shards[0].data.shape for o in jax.tree.leaves(out)]
    assert shapes == [s1, s2, s3, s4]
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(out)[0]), data @ data.T)


def test_bare_decorator() -> None:
    @partitioner.pjit
    def f(tree):
        return tree

    @partitioner.jit
    def g(tree):
        return tree

    x = {"a": np.ones(3, np.float32)}
    _same(f(x), jax.jit(lambda t: t)(x))
    _same(g(x), jax.jit(lambda t: t)(x))


def test_jit_as_decorator_factory() -> None:
    @partitioner.jit(static_argnums=1)
    def f(x, n):
        return x * n

    np.testing.assert_array_equal(np.asarray(f(np.ones(2), 3)), [3.0, 3.0])


def test_no_input_no_output(door: Any) -> None:
    def f():
        pass

    assert door(f)() is None


def test_in_shardings_same_as_the_array(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    x, _ = _array((8, 2), mesh, P("x", "y"))
    _both(door, lambda v: v, x, in_shardings=NamedSharding(mesh, P("x", "y")))


def test_uncommitted_array_moved_under_a_mesh(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    arr = jnp.arange(16).reshape(8, 2)
    with jax.set_mesh(mesh):
        out = door(lambda v: v, in_shardings=P("x", "y"))(arr)
        want = jax.jit(lambda v: v, in_shardings=P("x", "y"))(arr)
    _same(out, want)
    assert all(s.replica_id == 0 for s in out.addressable_shards)


def test_uncommitted_and_committed_together(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    u = jnp.arange(16, dtype=np.float32).reshape(8, 2)
    c, data = _array((8, 2), mesh, P("x", "y"))
    o1, o2 = _both(door, lambda a, b: (a, b), u, c)
    assert len(o1.addressable_shards) == 8 and len(o2.addressable_shards) == 8
    assert _both(door, lambda a, b: a @ b.T, u, c).shape == (8, 8)


def test_sds_lowered_then_compiled(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    s = NamedSharding(mesh, P("x", "y"))
    data = np.arange(16, dtype=np.int32).reshape(8, 2)
    sds = (
        jax.ShapeDtypeStruct((8, 2), np.int32, sharding=s),
        jax.ShapeDtypeStruct((8, 2), np.int32),
    )
    ours = door(lambda x, y: (x * 2, y * 2)).lower(*sds).compile()(jax.device_put(data, s), data)
    theirs = (
        jax.jit(lambda x, y: (x * 2, y * 2)).lower(*sds).compile()(jax.device_put(data, s), data)
    )
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert set(a.sharding.device_set) == set(b.sharding.device_set)


def test_aot_with_the_array_sharding(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    a1, data = _array((8, 2), mesh, P(None))
    f = door(lambda v: v, in_shardings=NamedSharding(mesh, P(None)))
    out = f.lower(jax.ShapeDtypeStruct((8, 2), jnp.float32)).compile()(a1)
    np.testing.assert_array_equal(np.asarray(out), data)


# --- one device, no mesh ---


def test_single_device_add_is_uncommitted_then_committed(door: Any) -> None:
    a = np.array([1, 2, 3], np.float32)
    b = np.array([4, 5, 6], np.float32)
    add = door(lambda x, y: x + y)
    with partitioner.recording() as counts:
        out = add(a, b)
        out2 = add(out, out)
    assert not out.committed and not out2.committed
    assert counts["compile"] <= 1 and counts["trace"] <= 1
    c = jax.device_put(a, jax.devices()[0])
    out3 = add(c, c)
    assert out3.committed and add(out3, out3).committed
    _same(out3, jax.jit(lambda x, y: x + y)(c, c))
    _same(out, jax.jit(lambda x, y: x + y)(a, b))


def test_single_device_matmul(door: Any) -> None:
    a = jnp.arange(16.0).reshape(8, 2)
    _both(door, lambda x: x @ x.T, a)


def test_single_device_output_fed_back_compiles_once(door: Any) -> None:
    a = jnp.arange(16.0).reshape(8, 2)
    f = door(lambda x: x)
    partitioner.clear_caches()
    with partitioner.recording() as counts:
        f(f(a))
    assert counts["compile"] == 1, dict(counts)


def test_different_device_recompiles(door: Any) -> None:
    a = jax.device_put(jnp.array([1.0, 2.0, 3.0]), jax.devices()[0])
    b = jax.device_put(jnp.array([4.0, 5.0, 6.0]), jax.devices()[1])
    f = door(lambda x: x)
    partitioner.clear_caches()
    with partitioner.recording() as counts:
        out1, out2 = f(a), f(b)
    assert counts["compile"] == 2
    assert out1.devices() == {jax.devices()[0]} and out2.devices() == {jax.devices()[1]}
    _same(out2, jax.jit(lambda x: x)(b))


def test_single_device_sharding_preserved(door: Any) -> None:
    x = jnp.arange(8)
    s1 = SingleDeviceSharding(jax.devices()[1])
    _both(door, lambda v: v, x)
    _both(door, lambda v: v, jax.device_put(x, jax.devices()[1]))
    _both(door, lambda v: v * 2, x)
    assert door(lambda v: v * 3, out_shardings=s1)(x).sharding == s1


def test_default_device_for_uncommitted_inputs(door: Any) -> None:
    f = door(lambda x, y: x + y)
    a = jnp.array([1.0, 2.0, 3.0])
    out = f(a, a)
    assert not out.committed and out.devices() == {jax.devices()[0]}
    with jax.default_device(jax.devices()[1]):
        b = jnp.array([4.0, 5.0, 6.0])
        out2 = f(b, b)
        assert not out2.committed and out2.devices() == {jax.devices()[1]}
        np.testing.assert_array_equal(np.asarray(out2), [8.0, 10.0, 12.0])


def test_grad_on_one_device(door: Any) -> None:
    a = jnp.array(16.0)
    f = lambda x: x * 3  # noqa: E731
    np.testing.assert_allclose(jax.grad(door(f))(a), jax.grad(f)(a))


def test_autodiff_on_one_device_with_closed_over_constant(door: Any) -> None:
    h = jnp.arange(4.0)
    f = door(lambda x: x.sum(1) * h.sum())
    g = door(lambda x: f(jnp.sin(x * 4 + 2)))
    check_grads(g, (jnp.arange(16.0).reshape((4, 4)) / 100,), order=2)


def test_device_argument(door: Any) -> None:
    mesh = _mesh((2, 2), ("x", "y"))
    x = jnp.arange(8.0).reshape(4, 2)
    f = door(lambda v: v @ v.T, device=jax.devices()[1])
    out = f(x)
    out2 = f(out)
    assert out.devices() == {jax.devices()[1]} and out2.devices() == {jax.devices()[1]}
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x @ x.T))
    # jax moves an argument committed elsewhere onto the device, and so does partitioner.
    y = jax.device_put(x, NamedSharding(mesh, P("x", "y")))
    theirs = jax.jit(lambda v: v @ v.T, device=jax.devices()[1])(y)
    ours = f(y)
    assert ours.sharding == theirs.sharding and ours.devices() == {jax.devices()[1]}
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_device_and_backend_together_is_an_error(door: Any) -> None:
    with pytest.raises(ValueError, match="can't specify both a device and a backend for jit"):
        door(lambda x: x, device=jax.devices()[0], backend="cpu")


def test_nested_output_stays_uncommitted(door: Any) -> None:
    @door
    def f(x):
        @door
        def g(y):
            return y * 2

        return g(x)

    out = f(jnp.arange(8))
    assert not out.committed
    np.testing.assert_array_equal(np.asarray(out), np.arange(8) * 2)


# --- static and keyword arguments ---


def test_static_argnames(door: Any) -> None:
    def f(x: str) -> int:
        assert x == "foo"
        return 1

    for kw in ({"static_argnums": 0}, {"static_argnames": "x"}):
        g = door(f, **kw)
        assert g("foo") == 1 and g(x="foo") == 1


def test_static_argnames_through_kwargs_compile_once(door: Any) -> None:
    def f(y, **kwargs):
        assert kwargs == {"x": "foo"}
        return y * y

    y = jnp.arange(8.0)
    g = door(f, static_argnames="x")
    with partitioner.recording() as counts:
        g(y, x="foo")
        g(y, x="foo")
    assert counts["dispatch_miss"] == 1, dict(counts)


def test_static_argnum_given_by_keyword_and_default() -> None:
    assert partitioner.pjit(lambda x: x, static_argnums=0)(x=4) == 4
    assert partitioner.jit(lambda x: x, static_argnums=0)(x=4) == 4
    assert partitioner.pjit(lambda x=4: x, static_argnums=0)() == 4
    assert partitioner.jit(lambda x=4: x, static_argnums=0)() == 4


def test_static_argnums_and_argnames_may_disagree(door: Any) -> None:
    seen: list[tuple[bool, bool]] = []

    def f(x, y):
        seen.append((isinstance(x, jax.core.Tracer), isinstance(y, jax.core.Tracer)))
        return 1

    # (Distinct static values: a trace cached on f is not traced again.)
    door(f, static_argnums=1, static_argnames=())(2, 3)
    door(f, static_argnums=(), static_argnames="y")(1, y=5)
    door(f, static_argnums=(), static_argnames="y")(1, 6)
    door(f, static_argnums=(1,), static_argnames="x")(x=2, y=7)
    assert seen == [(True, False), (True, False), (True, True), (False, True)]


def test_keyword_arguments(door: Any) -> None:
    a, b, c = jnp.arange(8.0), jnp.arange(4.0), jnp.arange(2.0)
    f = door(lambda x, y, z: (x, y, z))
    for args, kwargs in (((a,), {"y": b, "z": c}), ((), {"x": a, "y": b, "z": c}), ((a, b, c), {})):
        o1, o2, o3 = f(*args, **kwargs)
        for got, want in ((o1, a), (o2, b), (o3, c)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("keep_unused", [True, False])
def test_keep_unused(door: Any, keep_unused: bool) -> None:
    f = door(lambda x, y, z, a, b, c: c @ c.T, keep_unused=keep_unused)
    inp, unused = jnp.arange(4.0), jnp.arange(8.0)
    for _ in range(2):  # the second call takes the fast path
        np.testing.assert_array_equal(
            np.asarray(f(unused, unused, unused, unused, unused, inp)), 14.0
        )


def test_inline(door: Any) -> None:
    out = door(lambda x: door(lambda y: jnp.array(1), inline=True)(x) + x)(0)
    assert int(out) == 1


# --- None means unspecified in jit (and in pjit with no mesh) ---


def test_jit_none_shardings_are_unspecified(partitioner_mode: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    s = NamedSharding(mesh, P("x", "y"))
    data = np.arange(16).reshape(8, 2)
    inp = jax.device_put(data, s)
    for kw in (
        {"out_shardings": None},
        {"in_shardings": None},
        {"in_shardings": None, "out_shardings": None},
    ):
        assert _both(partitioner.jit, lambda x: x * 2, inp, **kw).sharding == s
        assert _both(partitioner.jit, lambda x: x * 2, data, **kw).sharding == SingleDeviceSharding(
            jax.devices()[0]
        )


def test_pjit_none_with_no_mesh_runs_on_one_device() -> None:
    out = partitioner.pjit(lambda x: x * 2, None, None)(np.arange(4.0))
    assert out.sharding == SingleDeviceSharding(jax.devices()[0]) and not out.committed


def test_pjit_none_under_a_mesh_is_replicated() -> None:
    from jax.experimental.pjit import pjit as jax_pjit

    mesh = _mesh((2, 1), ("x", "y"))
    x = jnp.arange(8)
    for context in (lambda: mesh, lambda: jax.set_mesh(mesh)):  # jax's pjit reads the first
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with context():
                out = partitioner.pjit(lambda v: v * 2, out_shardings=None)(x)
                theirs = jax_pjit(lambda v: v * 2, out_shardings=None)(x)
        assert out.sharding == theirs.sharding
    assert out.sharding != NamedSharding(mesh, P())  # set_mesh: unspecified, one device
    with mesh:
        assert partitioner.pjit(lambda v: v * 2, out_shardings=None)(x).sharding == (
            NamedSharding(mesh, P())
        )
    x2 = jax.device_put(x, NamedSharding(mesh, P()))
    out2 = partitioner.pjit(lambda v: v * 2)(x2)
    assert isinstance(out2.sharding, NamedSharding) and out2.sharding.spec == P()


def test_jit_partially_specified_out_shardings(partitioner_mode: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    fun = lambda a: (a, a.sum())  # noqa: E731
    _both(partitioner.jit, fun, x, out_shardings=(NamedSharding(mesh, P("x")), None))


def test_jit_partition_specs_need_a_mesh() -> None:
    with pytest.raises(RuntimeError, match="requires a non-empty mesh in context"):
        partitioner.jit(lambda x: x, in_shardings=P("x"))(jnp.arange(3))
    mesh = _mesh((4, 2), ("x", "y"))
    with jax.set_mesh(mesh):
        _same(
            partitioner.jit(lambda a: a * 2, in_shardings=P("x"))(np.ones((8, 2))),
            jax.jit(lambda a: a * 2, in_shardings=P("x"))(np.ones((8, 2))),
        )


def test_jit_set_mesh_and_none_out_sharding() -> None:
    mesh = _mesh((2,), ("x",))

    def make(wrap: Any) -> Any:
        @wrap(static_argnums=0, out_shardings=None)
        def f(spec):
            return jax.lax.with_sharding_constraint(jnp.arange(8), spec)

        return f

    ours, theirs = make(partitioner.jit), make(jax.jit)
    with jax.set_mesh(mesh):
        assert ours(P("x")).sharding == theirs(P("x")).sharding == NamedSharding(mesh, P("x"))
    # No mesh, no committed argument: the constraint's NamedSharding places the call.
    spec = NamedSharding(mesh, P("x"))
    assert ours(spec).sharding == theirs(spec).sharding == spec


# --- committed inputs are never moved behind the user's back ---


def test_committed_input_laid_out_otherwise_is_an_error(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    x, _ = _array((8, 2), mesh, P("x", "y"))
    f = door(lambda v: v, in_shardings=NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError) as ours:
        f(x)
    with pytest.raises(ValueError, match="does not match the sharding"):
        jax.jit(lambda v: v, in_shardings=NamedSharding(mesh, P("x")))(x)
    message = str(ours.value)
    assert message.startswith("Sharding passed to jit does not match the sharding")  # jax's
    assert "argument v " in message and "P('x', 'y')" in message and "P('x',)" in message
    assert "jax.device_put" in message


def test_committed_to_one_device_is_an_error_too(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    f = door(lambda v: v, in_shardings=NamedSharding(mesh, P(None, "y")))
    with pytest.raises(ValueError, match="committed to SingleDeviceSharding"):
        f(jax.device_put(np.ones((8, 2)), jax.devices()[0]))
    f(jnp.ones((8, 2)))  # uncommitted: moved, as jax.jit does


def test_mixed_numpy_and_committed_inputs(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    a1, data = _array((8, 2), mesh, P("x", "y"))
    with jax.set_mesh(mesh):
        f = door(lambda x, y: (x, y), in_shardings=NamedSharding(mesh, P(None)))
        with pytest.raises(ValueError, match=r"(?s)^Sharding passed to jit.*argument y\b"):
            f(data, a1)


def test_pjit_none_is_replicated_only_under_the_classic_mesh_context() -> None:
    """jax 0.10.2's pjit reads ``None`` as replicated under ``with mesh:`` (a committed
    input laid out otherwise is an error) and as unspecified under ``jax.set_mesh``
    (the input is taken as it is laid out), side by side with jax's own pjit."""
    from jax.experimental.pjit import pjit as jax_pjit

    mesh = _mesh((4, 2), ("x", "y"))
    x, _ = _array((8, 2), mesh, P("x"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with jax.set_mesh(mesh):
            ours = partitioner.pjit(lambda v: v * 2, None, None)(x)
            theirs = jax_pjit(lambda v: v * 2, None, None)(x)
        _same(ours, theirs)
        with mesh:
            with pytest.raises(ValueError):
                jax_pjit(lambda v: v, None, None)(x)
            with pytest.raises(ValueError, match="committed to NamedSharding"):
                partitioner.pjit(lambda v: v, None, None)(x)


def test_arguments_on_other_devices_than_the_mesh(door: Any) -> None:
    x, _ = _array((8, 2), _mesh((2, 2), ("x", "y")), P("x", "y"))
    mesh = _mesh((4, 2), ("x", "y"))
    # Each door's own mesh context (jax's pjit reads the classic one, jax.jit set_mesh's).
    with mesh if door is partitioner.pjit else jax.set_mesh(mesh):
        with pytest.raises(ValueError, match="Received incompatible devices"):
            door(lambda v: v)(x)


def test_committed_arguments_on_different_devices(door: Any) -> None:
    a = jax.device_put(np.array([1, 2, 3]), jax.devices()[0])
    b = jax.device_put(np.array([4, 5, 6]), jax.devices()[1])
    # jax's sentence, then each argument by the name jax gives it
    with pytest.raises(
        ValueError,
        match=r"^Received incompatible devices for p?jitted computation\..*argument x\b.*\[0\].*argument y\b.*\[1\]",
    ):
        door(lambda x, y: (x, y))(a, b)
    with pytest.raises(ValueError, match=r"argument x\[0\].*argument x\[1\]"):
        door(lambda *x: x)(a, b)


def test_pytree_argument_device_mismatch_names_both_paths(door: Any) -> None:
    mesh = _mesh((2, 2), ("x", "y"))
    a = jax.device_put(np.array([1, 2, 3]), jax.devices()[0])
    c = jax.device_put(np.arange(16).reshape(8, 2), NamedSharding(mesh, P("x", "y")))
    with pytest.raises(ValueError, match=r"argument t\[1\]\[0\]"):
        door(lambda t: t)((a, (c,)))


# --- wrap-time checks, as jax.jit ---


@pytest.mark.parametrize(
    "kw, pattern",
    [
        ({"static_argnums": 3}, "only accepts 1 positional"),
        ({"donate_argnums": 3}, "only accepts 1 positional"),
        ({"static_argnames": "y"}, "invalid argnames"),
        ({"donate_argnames": "y"}, "invalid argnames"),
    ],
)
def test_jit_checks_argnums_when_wrapping(kw: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError):
        jax.jit(lambda x: x, **kw)
    with pytest.raises(ValueError, match=pattern):
        partitioner.jit(lambda x: x, **kw)


def test_jit_rejects_a_non_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        partitioner.jit(3)


# --- donation ---


def test_donated_reshape_input_is_consumed_as_in_jax(door: Any) -> None:
    ours, theirs = jnp.ones((16, 1)), jnp.ones((16, 1))
    door(lambda x: x.reshape(16), donate_argnums=0)(ours)
    jax.jit(lambda x: x.reshape(16), donate_argnums=0)(theirs)
    assert ours.is_deleted() == theirs.is_deleted()


def _donation_warnings(f: Any, a: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(a)
    return [str(w.message) for w in caught if "donated" in str(w.message)]


def test_unusable_donation_warns_as_jax_then_names_the_front_door(door: Any) -> None:
    partitioner.clear_caches()  # the warning comes with lowering
    a, b = jnp.ones((4,)), jnp.ones((4,))
    (theirs,) = _donation_warnings(jax.jit(lambda x: x.sum(), donate_argnums=0), b)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        door(lambda x: x.sum(), donate_argnums=0)(a)
    (w,) = [w for w in caught if "donated" in str(w.message)]
    ours = str(w.message)
    assert ours.startswith(theirs), (ours, theirs)  # jax's own words first
    assert f"{door.__name__} <lambda>" in ours  # then which call
    assert w.filename == __file__
    assert not a.is_deleted() and not b.is_deleted()


# --- errors as jax's ---


def test_with_sharding_constraint_of_none_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="None"):
        partitioner.with_sharding_constraint(jnp.arange(8), None)


def test_output_tree_mismatch_names_every_place(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    bad = {
        "a": NamedSharding(mesh, P()),
        "c": NamedSharding(mesh, P()),
        "d": NamedSharding(mesh, P()),
    }
    with pytest.raises(ValueError) as info:
        door(lambda x: {"a": x, "b": x, "c": x}, out_shardings=bad)(np.ones(8))
    assert "'b'" in str(info.value) and "'d'" in str(info.value)


def test_output_tree_mismatch_in_several_subtrees_names_each(door: Any) -> None:
    mesh = _mesh((4, 2), ("x", "y"))
    s = NamedSharding(mesh, P())
    out_specs = {"a": (s, s), "b": [s], "c": s}
    with pytest.raises(ValueError) as info:
        door(lambda x: {"a": (x, x, x), "b": (x,), "c": x}, out_shardings=out_specs)(np.ones(8))
    message = str(info.value)
    assert "['a']" in message and "['b']" in message, message


def test_compiler_options_as_jax_jit(door: Any) -> None:
    x = np.arange(8.0, dtype=np.float32)
    f = door(lambda v: v * 2, compiler_options={"xla_embed_ir_in_executable": True})
    np.testing.assert_array_equal(np.asarray(f(x)), x * 2)
    bad = door(lambda v: v * 3, compiler_options={"not_an_xla_option": 1})
    with pytest.raises(Exception, match="not_an_xla_option"):
        bad(x)
    with pytest.raises(Exception, match="not_an_xla_option"):
        jax.jit(lambda v: v * 3, compiler_options={"not_an_xla_option": 1})(x)
    with pytest.raises(TypeError, match="compiler_options"):
        door(lambda v: v, compiler_options=[("a", 1)])
