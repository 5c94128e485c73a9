"""Sharding in types: partitioner over meshes with Explicit axes, side by side with jax.jit.

An adaptation of the scenarios of jax's ``ShardingInTypesTest`` (``tests/pjit_test.py``):
jax's inputs, its expected types and shardings, our code. Every case runs the same
body through ``jax.jit`` and through partitioner and compares

- the types the body sees (``jax.typeof`` of the values it records, collected in a list),
- the results: values and ``.sharding``, also against the sharding jax's test expects,
- gradients (``jax.grad``, eager and under ``jax.jit``) where jax's test takes them,
- and, for programs jax rejects, the kind of error and its message.

The front doors: ``partitioner.pjit`` is given the argument shardings as ``in_shardings``
(the arguments are committed, so the specs are theirs) and, as ``out_shardings``, the
sharding jax.jit's result has. ``partitioner.jit`` (where it exists) takes nothing, as
``jax.jit`` does, so its results must follow the types on their own.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner

E, A = AxisType.Explicit, AxisType.Auto
# jax 0.10.2 exports no name for the error its sharding rules raise; the tests only
# need its type to check that partitioner raises the same one.
from jax._src.core import ShardingTypeError  # noqa: E402

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

FRONT_DOORS = ["pjit"] + (["jit"] if hasattr(partitioner, "jit") else [])
reshard, auto_axes, explicit_axes = (
    jax.sharding.reshard,
    jax.sharding.auto_axes,
    jax.sharding.explicit_axes,
)


def make_mesh(shape: Sequence[int], names: Sequence[str], types: Sequence[AxisType] | None = None):
    n = math.prod(shape)
    return jax.make_mesh(
        tuple(shape),
        tuple(names),
        axis_types=tuple(types) if types is not None else (E,) * len(names),
        devices=jax.devices()[:n],
    )


@pytest.fixture(params=FRONT_DOORS)
def front(request: pytest.FixtureRequest) -> str:
    return request.param


# --- the harness ---


def _spec_of(x: Any) -> Any:
    return x.sharding.spec if isinstance(x, jax.Array) else None


def _ours(front: str, fun: Callable[..., Any], args: Sequence[Any], out_specs: Any, **kw: Any):
    if front == "jit":
        return partitioner.jit(fun, **kw)  # type: ignore[attr-defined]
    return partitioner.pjit(
        fun, in_shardings=tuple(_spec_of(a) for a in args), out_shardings=out_specs, **kw
    )


def _blocked(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def _assert_same_results(ours: Any, want: Any) -> None:
    o_leaves, o_tree = jax.tree.flatten(ours)
    w_leaves, w_tree = jax.tree.flatten(want)
    assert o_tree == w_tree
    for o, w in zip(o_leaves, w_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-6)
        assert o.sharding == w.sharding, (o.sharding, w.sharding)


def _types_equal(ours: list[Any], want: list[Any]) -> None:
    assert len(ours) == len(want), (ours, want)
    for o, w in zip(ours, want, strict=True):
        assert o == w, (o, w)
        assert o.sharding.spec == w.sharding.spec


def check(
    front: str,
    body: Callable[..., Any],
    args: Sequence[Any],
    *,
    expect: Any = None,
    expect_types: Sequence[Any] | None = None,
    grad: bool = False,
    jit_grad: bool = False,
    static_argnums: tuple[int, ...] = (),
    mesh: Any = None,
) -> Any:
    """Run ``body(seen, *args)`` through jax.jit and partitioner; compare everything.

    ``expect``: jax's test's expected output spec(s) (a tree of PartitionSpecs);
    ``expect_types``: the specs jax's test asserts on the recorded types, in order.
    """
    want_seen: list[Any] = []
    ours_seen: list[Any] = []
    dyn = [a for i, a in enumerate(args) if i not in static_argnums]
    want = _blocked(
        jax.jit(functools.partial(body, want_seen), static_argnums=static_argnums)(*args)
    )
    out_specs = jax.tree.map(lambda o: o.sharding.spec, want)
    ours_fn = _ours(
        front,
        functools.partial(body, ours_seen),
        dyn,
        out_specs,
        **({"static_argnums": static_argnums} if static_argnums else {}),
    )
    got = _blocked(ours_fn(*args))
    _assert_same_results(got, want)
    _types_equal(ours_seen, want_seen)
    if expect_types is not None:
        assert [t.sharding.spec for t in ours_seen] == list(expect_types)
    if expect is not None:
        m = mesh or jax.tree.leaves(got)[0].sharding.mesh
        jax.tree.map(
            lambda o, s: _assert_sharding(o, NamedSharding(m, s)),
            got,
            expect,
            is_leaf=lambda s: isinstance(s, P),
        )
    if grad or jit_grad:
        argnums = tuple(i for i in range(len(args)) if i not in static_argnums)

        def loss(f: Callable[..., Any]) -> Callable[..., Any]:
            return lambda *a: sum(jnp.sum(o) for o in jax.tree.leaves(f(*a)))

        # The same shardings as ours are given (pjit's): a given spec is spelled as given.
        given = (
            {"in_shardings": tuple(_spec_of(a) for a in dyn), "out_shardings": out_specs}
            if front == "pjit"
            else {}
        )
        jax_f = jax.jit(functools.partial(body, []), static_argnums=static_argnums, **given)
        our_f = _ours(
            front,
            functools.partial(body, []),
            dyn,
            out_specs,
            **({"static_argnums": static_argnums} if static_argnums else {}),
        )
        wraps = ([lambda g: g] if grad else []) + ([jax.jit] if jit_grad else [])
        for wrap in wraps:
            g_want = _blocked(wrap(jax.grad(loss(jax_f), argnums=argnums))(*args))
            g_ours = _blocked(wrap(jax.grad(loss(our_f), argnums=argnums))(*args))
            _assert_same_results(g_ours, g_want)
            # jax's tests: each cotangent is laid out as its primal (spelled as its type).
            for g, i in zip(g_ours, argnums, strict=True):
                if isinstance(args[i], jax.Array):
                    assert g.sharding.is_equivalent_to(args[i].sharding, g.ndim)
    return got


def _assert_sharding(x: Any, sharding: Any) -> None:
    assert x.sharding == sharding, (x.sharding, sharding)


def check_error(
    front: str,
    body: Callable[..., Any],
    args: Sequence[Any],
    exc: type[BaseException],
    match: str,
    *,
    static_argnums: tuple[int, ...] = (),
) -> None:
    """jax.jit rejects the program with ``exc`` matching ``match``, and so does partitioner."""
    with pytest.raises(exc, match=match):
        jax.jit(functools.partial(body, []), static_argnums=static_argnums)(*args)
    dyn = [a for i, a in enumerate(args) if i not in static_argnums]
    ours = _ours(
        front,
        functools.partial(body, []),
        dyn,
        None,
        **({"static_argnums": static_argnums} if static_argnums else {}),
    )
    with pytest.raises(exc, match=match):
        _blocked(ours(*args))


@pytest.fixture
def mesh22() -> Iterator[Any]:
    mesh = make_mesh((2, 2), ("x", "y"))
    with jax.set_mesh(mesh):
        yield mesh


def put(x: Any, spec: P) -> jax.Array:
    return jax.device_put(x, spec)


def inp(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.arange(math.prod(shape), dtype=dtype).reshape(shape)


# --- elementwise ---


def test_basic_mul(front, partitioner_mode, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        seen.append(jax.typeof(x))
        x = x * 2
        seen.append(jax.typeof(x))
        x = x * x
        seen.append(jax.typeof(x))
        return x

    check(front, f, [arr], expect=P("x", "y"), expect_types=[P("x", "y")] * 3, grad=True)


def test_fully_replicated_array_mul(front, mesh22) -> None:
    arr1 = put(inp(8, 2), P("x", "y"))

    def f(seen, x, y):
        out = x * y
        seen.append(jax.typeof(out))
        return out

    for other in (
        put(inp(1, 2), P(None, None)),
        put(inp(8, 2), P(("x",), ("y",))),
        put(inp(1, 2), P()),
    ):
        check(front, f, [arr1, other], expect=P("x", "y"), expect_types=[P("x", "y")])


@pytest.mark.parametrize("spec", [P("y", "x"), P(("x", "y"))], ids=["yx", "xy_merged"])
def test_mul_incompatible_shardings_error(front, mesh22, spec) -> None:
    arr1 = put(inp(8, 2), P("x", "y"))
    check_error(
        front,
        lambda seen, x, y: x * y,
        [arr1, put(inp(8, 2), spec)],
        ShardingTypeError,
        "mul got incompatible shardings for broadcasting",
    )


@pytest.mark.parametrize("power", [2, 3])
def test_integer_pow(front, mesh22, power) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        y = x**power
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=P("x", "y"), expect_types=[P("x", "y")])


def test_sin_unop(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        y = lax.sin(x)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=P("x", "y"), expect_types=[P("x", "y")], grad=True)


def test_convert_dtype_keeps_sharding(front, mesh22) -> None:
    arr = put(inp(8, 2, dtype=np.int32), P("x", "y"))

    def f(seen, x):
        y = jnp.array(x, dtype=jnp.float32)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=P("x", "y"), expect_types=[P("x", "y")])


def test_broadcasting_different_mesh_error(front) -> None:
    mesh = make_mesh((1,), ("x",))
    mesh2 = jax.sharding.Mesh([jax.devices()[0]], "y", axis_types=(E,))
    with jax.set_mesh(mesh):
        arr1 = jax.device_put(np.arange(8.0), NamedSharding(mesh, P()))
        arr2 = jax.device_put(np.arange(8.0), NamedSharding(mesh2, P()))
        check_error(
            front, lambda seen, x, y: x + y, [arr1, arr2], ValueError, "context mesh.*aval mesh"
        )


def test_select(front, mesh22) -> None:
    s = P("x", "y")
    arr1, arr2 = put(inp(8, 2), s), put(inp(8, 2), s)

    def f(seen, pred, on_true, on_false):
        y = lax.select(pred, on_true, on_false)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr1 == arr2, arr1, arr2], expect=s, expect_types=[s])
    check_error(
        front,
        f,
        [arr1 == arr2, arr1, put(inp(8, 2), P("y", "x"))],
        ShardingTypeError,
        "select cases must have the same shardings",
    )


def test_add_transpose(front, mesh22) -> None:
    x, y = put(jnp.arange(4.0), P()), put(jnp.arange(4.0), P("x"))
    check(front, lambda seen, a, b: a + b, [x, y], expect=P("x"), grad=True, jit_grad=True)


# --- dot ---


@pytest.mark.parametrize(
    "spec1, spec2, out_spec",
    [
        (P("x", None), P(None, "y"), P("x", "y")),
        (P("x", None), P(None, None), P("x", None)),
        (P("x", "y"), P(None, None), P("x", None)),
        (P("x", None), P("x", None), P("x", None)),
        (P(None, "y"), P(None, "y"), P(None, "y")),
    ],
    ids=["x_y", "x_None", "contracting2", "fsdp", "half_tp"],
)
def test_dot_general(front, partitioner_mode, mesh22, spec1, spec2, out_spec) -> None:
    arr1, arr2 = put(inp(8, 2), spec1), put(inp(8, 2).T, spec2)

    def f(seen, x, y):
        out = x @ y
        seen.append(jax.typeof(out))
        return out

    check(front, f, [arr1, arr2], expect=out_spec, expect_types=[out_spec], grad=True)


@pytest.mark.parametrize(
    "spec1, spec2, match",
    [
        (P("x", None), P(None, "x"), "dot_general operation.*produces an illegally sharded result"),
        # jax 0.10.2's wording (later jax says "Contracting dimensions are sharded").
        (P("x", "y"), P("x", "y"), "contracting dimensions to have consistent sharding"),
        (P("x", "y"), P("y", None), "Contracting dimensions are sharded"),
        (P(None, "y"), P("y", None), "Contracting dimensions are sharded"),
    ],
    ids=["fail1", "fail2", "contracting1", "other_half_tp"],
)
def test_dot_general_error(front, mesh22, spec1, spec2, match) -> None:
    arr1, arr2 = put(inp(8, 2), spec1), put(inp(8, 2).T, spec2)
    check_error(front, lambda seen, x, y: x @ y, [arr1, arr2], ShardingTypeError, match)


def test_dot_general_out_sharding(front) -> None:
    mesh = make_mesh((4,), ("x",))
    with jax.set_mesh(mesh):
        arr1, arr2 = put(inp(8, 2), P("x", None)), put(inp(8, 2).T, P(None, "x"))

        def f(seen, x, y):
            out = jnp.einsum("xy,yz->xz", x, y, out_sharding=P("x", None))
            seen.append(jax.typeof(out))
            return jnp.sum(out)

        check(front, f, [arr1, arr2], expect=P(), expect_types=[P("x", None)], jit_grad=True)


def test_dot_general_batch_error(front) -> None:
    mesh = make_mesh((2, 2, 1), ("x", "y", "z"))
    with jax.set_mesh(mesh):
        arr1 = put(np.ones((8, 4, 2)), P("x", "y", "z"))
        arr2 = put(np.ones((8, 2, 4)), P("y", "z", "x"))
        check_error(
            front,
            lambda seen, a, b: lax.dot_general(a, b, (([2], [1]), ([0], [0]))),
            [arr1, arr2],
            ShardingTypeError,
            "dot_general requires lhs batch dimensions and rhs batch dimensions to have the "
            "consistent sharding",  # jax 0.10.2's wording
        )


def test_einsum_with_out_sharding(front, partitioner_mode, mesh22) -> None:
    arr3, arr4 = put(inp(8, 2), P("x", "y")), put(inp(8, 2).T, P("x", "y"))

    def g(seen, x, y):
        out = jnp.einsum("xy,yz->xz", x, y, out_sharding=P("x", None))
        seen.append(jax.typeof(out))
        return out

    check(front, g, [arr3, arr4], expect=P("x", None), expect_types=[P("x", None)], jit_grad=True)


def test_einsum_inverse(front, mesh22) -> None:
    spec = P("x", None, "y", None)
    arr1 = put(inp(64).reshape(8, 4, 2), P("x", "y", None))
    arr2 = put(inp(64).reshape(2, 4, 8), P(None, "x", "y"))

    def h(seen, x, y):
        out = jnp.einsum("btd,dhq->bhtq", x, y, out_sharding=spec)
        seen.append(jax.typeof(out))
        return out

    check(front, h, [arr1, arr2], expect=spec, expect_types=[spec], grad=True)


# --- reductions ---


@pytest.mark.parametrize(
    "axis, in_spec, out_spec",
    [
        (None, P("x", "y"), P()),
        (0, P("x", "y"), P("y")),
        (1, P("x", "y"), P("x")),
        (0, P(("x", "y"), None), P(None)),
        (1, P(("x", "y"), None), P(("x", "y"))),
    ],
    ids=["all", "first", "second", "first2", "second2"],
)
def test_reduce_sum(front, mesh22, axis, in_spec, out_spec) -> None:
    arr = put(inp(8, 2), in_spec)

    def f(seen, x):
        seen.append(jax.typeof(x))
        y = jnp.sum(x, axis=axis)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=out_spec, expect_types=[in_spec, out_spec])


@pytest.mark.parametrize(
    "axis, out_spec", [(None, P()), (0, P("y")), (1, P("x"))], ids=["all", "first", "second"]
)
def test_reduce_max(front, mesh22, axis, out_spec) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        y = jnp.max(x, axis=axis)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=out_spec, expect_types=[out_spec], grad=True)


def test_argminmax(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        z = jnp.argmax(x, axis=0)
        a = jnp.argmin(x, axis=1)
        seen.extend([jax.typeof(z), jax.typeof(a)])
        return z, a

    check(front, f, [arr], expect=(P("y"), P("x")), expect_types=[P("y"), P("x")])


def test_cumsum(front, mesh22) -> None:
    def f(seen, x):
        return jnp.cumsum(x, axis=0)

    check(front, f, [put(inp(2, 8), P(None, "x"))], expect=P(None, "x"))
    check_error(
        front,
        f,
        [put(inp(2, 8), P("x", None))],
        ShardingTypeError,
        "Input should be unsharded over the axis being reduced",
    )


# --- shapes: broadcast, transpose, reshape, slicing ---


@pytest.mark.parametrize(
    "axis, out_spec",
    [
        (0, P(None, "x", "y")),
        (1, P("x", None, "y")),
        (2, P("x", "y", None)),
        (-1, P("x", "y", None)),
    ],
    ids=["0", "1", "2", "-1"],
)
def test_broadcast_in_dim(front, mesh22, axis, out_spec) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        y = jnp.expand_dims(x, axis=axis)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr], expect=out_spec, expect_types=[out_spec])


def test_lax_transpose_rule(front) -> None:
    mesh = make_mesh((2, 2, 1), ("x", "y", "z"))
    with jax.set_mesh(mesh):
        arr = put(inp(4, 2, 2), P("x", "y", "z"))

        def f(seen, x):
            y = jnp.transpose(x, (1, 2, 0))
            seen.append(jax.typeof(y))
            return y

        check(front, f, [arr], expect=P("y", "z", "x"), expect_types=[P("y", "z", "x")], grad=True)


@pytest.mark.parametrize(
    "src_shape, dst_shape, src_spec, dst_spec",
    [
        ((16, 1), (1, 16, 1), P("x", None), P(None, "x", None)),
        ((1, 4, 1, 6, 1), (1, 4, 6), P(None, "x", None, None, None), P(None, "x", None)),
        ((8, 32), (8, 1, 1, 32), P(None, "x"), P(None, None, None, "x")),
        ((8, 16, 2, 1, 1, 1), (8, 32), P("x", None, None, None, None, None), P("x", None)),
    ],
    ids=["split_leading", "squeeze_units", "insert_units", "merge"],
)
def test_reshape(front, src_shape, dst_shape, src_spec, dst_spec) -> None:
    mesh = make_mesh((2,), ("x",))
    with jax.set_mesh(mesh):
        arr = put(inp(*src_shape), src_spec)

        def f(seen, x):
            y = jnp.reshape(x, dst_shape)
            seen.append(jax.typeof(y))
            y = y * 2
            seen.append(jax.typeof(y))
            return y

        check(front, f, [arr], expect=dst_spec, expect_types=[dst_spec] * 2, jit_grad=True)


def test_reshape_split_merge_error(front, mesh22) -> None:
    arr = put(inp(4, 6, 8), P("x", "y", None))
    check_error(
        front,
        lambda seen, x: lax.reshape(x, (4, 3, 2, 8)),
        [arr],
        ShardingTypeError,
        "This reshape is not supported",
    )


def test_slice(front, mesh22) -> None:
    def f(seen, x):
        y = lax.slice(x, (0, 0), (4, 3))
        seen.append(jax.typeof(y))
        return y

    check(
        front,
        f,
        [put(inp(4, 4), P("x", None))],
        expect=P("x", None),
        expect_types=[P("x", None)],
        grad=True,
    )
    check_error(
        front, f, [put(inp(4, 4), P("x", "y"))], ShardingTypeError, "slicing on sharded dims"
    )


def test_squeeze(front, mesh22) -> None:
    def f(seen, x):
        y = lax.squeeze(x, (2,))
        seen.append(jax.typeof(y))
        return y

    arr = put(inp(4, 4, 1), P("x", None, None))
    check(front, f, [arr], expect=P("x", None), expect_types=[P("x", None)], jit_grad=True)


def test_pad(front, mesh22) -> None:
    arr = put(inp(8), P("x"))

    def f(seen, x, config):
        y = lax.pad(x, 0.0, config)
        seen.append(jax.typeof(y))
        return y

    check(front, f, [arr, ((2, 2, 0),)], static_argnums=(1,), expect=P("x"), grad=True)
    check_error(
        front,
        f,
        [arr, ((2, 3, 0),)],
        ShardingTypeError,
        "padding on sharded dims",
        static_argnums=(1,),
    )


def test_concatenate(front) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    with jax.set_mesh(mesh):
        s = P("x", "y")
        arr1, arr2 = put(inp(4, 4), s), put(inp(4, 1), s)

        def f(seen, x, y):
            out = jnp.concatenate([x, y], axis=1)
            seen.append(jax.typeof(out))
            return out

        check(front, f, [arr1, arr2], expect=s, expect_types=[s], grad=True)


def test_split(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x, sizes, axis):
        ys = lax.split(x, sizes, axis=axis)
        seen.extend(jax.typeof(y) for y in ys)
        return ys

    check(front, f, [arr, (4, 4), 0], static_argnums=(1, 2), expect_types=[P("x", "y")] * 2)
    check_error(
        front,
        f,
        [arr, (1, 1), 1],
        ShardingTypeError,
        "split on sharded dims",
        static_argnums=(1, 2),
    )


# --- reshard, auto_axes, explicit_axes, mixed meshes ---


def test_reshard(front, partitioner_mode, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        y = reshard(x, P("x", None))
        seen.append(jax.typeof(y))
        return y

    check(
        front, f, [arr], expect=P("x", None), expect_types=[P("x", None)], grad=True, jit_grad=True
    )


def test_reshard_under_vmap_inside(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        def row(r):
            seen.append(jax.typeof(r))
            y = reshard(r, P(None))
            seen.append(jax.typeof(y))
            return y

        return jax.vmap(row)(x)

    check(front, f, [arr], expect=P("x", None), expect_types=[P("y"), P(None)])


def test_auto_axes_inside(front, partitioner_mode, mesh22) -> None:
    arr1, arr2 = put(inp(8, 2), P("x", "y")), put(inp(8, 2).T, P("y", "x"))

    @functools.partial(auto_axes, out_sharding=P("x", None))
    def auto_matmul(a, b):
        return a @ b

    def f(seen, a, b):
        z = auto_matmul(jnp.sin(a), b)
        seen.append(jax.typeof(z))
        return z + 1

    check(front, f, [arr1, arr2], expect=P("x", None), expect_types=[P("x", None)], grad=True)


def test_auto_axes_one_axis(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        @auto_axes(axes="x", out_sharding=P("x", None))
        def h(y):
            seen.append(jax.typeof(y))
            a = jnp.einsum("xy,yz->xz", jnp.sin(y), jnp.sin(y).T, out_sharding=P(None, None))
            seen.append(jax.typeof(a))
            return a

        a = h(x * 2)
        seen.append(jax.typeof(a))
        return a

    check(
        front,
        f,
        [arr],
        expect=P("x", None),
        expect_types=[P(None, "y"), P(None, None), P("x", None)],
    )


def test_explicit_axes_on_auto_mesh(front) -> None:
    mesh = make_mesh((2, 2), ("x", "y"), (A, A))
    with jax.set_mesh(mesh):
        arr1 = jax.device_put(inp(8, 2), NamedSharding(mesh, P("x", "y")))
        arr2 = jax.device_put(inp(8, 2).T, NamedSharding(mesh, P("y", "x")))

        def f(seen, a, b):
            @functools.partial(explicit_axes, in_sharding=(P("x", None), P("x", None)))
            def matmul(u, v):
                out = u @ v
                seen.append(jax.typeof(out))
                return out

            return matmul(jnp.sin(a), b) + 1

        got = check(front, f, [arr1, arr2], expect_types=[P("x", None)])
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)


@pytest.mark.parametrize("axes", [None, "y"], ids=["all-axes", "axis-y"])
def test_auto_axes_around_the_call(front, partitioner_mode, mesh22, axes) -> None:
    """``auto_axes(jitted, out_sharding=...)(a, b)``: the whole call runs over the Auto
    axes, the body typed over them (the abstract mesh ``auto_axes`` set), as jax.jit's."""
    a, b = put(inp(8, 2), P("x", "y")), put(inp(8, 2).T, P("y", None))

    def body(seen, u, v):
        seen.append(jax.typeof(u))
        if jax.sharding.get_abstract_mesh().axis_types[0] == E:  # x stayed Explicit
            out = jnp.einsum("ab,bc->ac", jnp.sin(u), v, out_sharding=P("x", None))
        else:
            out = jnp.sin(u) @ v
        seen.append(jax.typeof(out))
        return out

    def around(f: Callable[..., Any]) -> Callable[..., Any]:
        return auto_axes(f, axes=axes, out_sharding=P("x", None))

    want_seen: list[Any] = []
    ours_seen: list[Any] = []
    want = _blocked(around(jax.jit(functools.partial(body, want_seen)))(a, b))
    ours = _ours(front, functools.partial(body, ours_seen), [a, b], P("x", None))
    got = _blocked(around(ours)(a, b))
    _assert_same_results(got, want)
    assert jax.typeof(got) == jax.typeof(want)
    _types_equal(ours_seen, want_seen)
    assert ours_seen[0].sharding.mesh.axis_types[1] == A  # traced over the Auto axis


@pytest.mark.parametrize("context", ["none", "set_mesh"])
def test_typeof_names_the_auto_mesh_of_the_call(front, context) -> None:
    """An argument committed to an all-Auto mesh is typed over that mesh inside the body
    (no axis in its spec), with no mesh in context (pjit's mesh from its NamedShardings)
    as under ``jax.set_mesh``: the mesh jax.jit's ``jax.typeof`` names, on the arguments
    and on values computed from them."""
    mesh = make_mesh((2, 2), ("x", "y"), (A, A))
    sharding = NamedSharding(mesh, P("x", None))
    arr = jax.device_put(inp(8, 2), sharding)

    def body(seen, x):
        seen.append(jax.typeof(x))
        y = jnp.sin(x) * 2
        seen.append(jax.typeof(y))
        return y

    want_seen: list[Any] = []
    ours_seen: list[Any] = []
    with jax.set_mesh(mesh) if context == "set_mesh" else contextlib.nullcontext():
        want = jax.jit(functools.partial(body, want_seen))(arr)
        fun = functools.partial(body, ours_seen)
        ours = (
            partitioner.pjit(fun, sharding, sharding) if front == "pjit" else partitioner.jit(fun)
        )
        got = _blocked(ours(arr))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    assert got.sharding.is_equivalent_to(want.sharding, 2)
    _types_equal(ours_seen, want_seen)
    assert [t.sharding.mesh for t in ours_seen] == [mesh.abstract_mesh] * 2


def test_full_user_to_full_auto(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))
    auto = mesh22.abstract_mesh.update_axis_types({"x": A, "y": A})

    def f(seen, x):
        y = x * 2
        with jax.sharding.use_abstract_mesh(auto):
            y = reshard(y, P(None, None))
            seen.append(jax.typeof(y))
            a = jnp.sin(y) @ jnp.sin(y).T
            seen.append(jax.typeof(a))
        a = reshard(a, P("x", None))
        seen.append(jax.typeof(a))
        return a

    check(
        front,
        f,
        [arr],
        expect=P("x", None),
        expect_types=[P(None, None), P(None, None), P("x", None)],
    )


def test_full_user_to_auto_user_mix(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))
    mixed = mesh22.abstract_mesh.update_axis_types({"x": A})

    def f(seen, x):
        y = x * 2
        with jax.sharding.use_abstract_mesh(mixed):
            y = reshard(y, P(None, "y"))
            seen.append(jax.typeof(y))
            z = jnp.sin(y)
            a = jnp.einsum("xy,yz->xz", z, z.T, out_sharding=P(None, None))
            seen.append(jax.typeof(a))
        a = reshard(a, P("x", None))
        seen.append(jax.typeof(a))
        return a

    check(
        front,
        f,
        [arr],
        expect=P("x", None),
        expect_types=[P(None, "y"), P(None, None), P("x", None)],
    )


def test_user_auto_mix_error(front) -> None:
    mesh = make_mesh((2, 1), ("x", "y"))
    with jax.set_mesh(mesh):
        arr = put(inp(8, 2), P("x", "y"))
        auto_x = mesh.abstract_mesh.update_axis_types({"x": A})

        def f(seen, x, y):
            x = x * 2
            with jax.sharding.use_abstract_mesh(auto_x):
                return x @ y

        check_error(
            front, f, [arr, arr.T], ValueError, "For primitive dot_general, context mesh.*aval mesh"
        )


@pytest.mark.parametrize(
    "types, spec1, spec2, out_spec",
    [
        ((E, A), P("x", "y"), P("y", None), P("x", None)),
        ((A, E), P("x", "y"), P(None, "x"), P("x")),
    ],
    ids=["explicit_auto", "auto_explicit"],
)
def test_mixed_mesh_auto_user(front, partitioner_mode, types, spec1, spec2, out_spec) -> None:
    mesh = make_mesh((2, 2), ("x", "y"), types)
    with jax.set_mesh(mesh):
        arr1 = jax.device_put(inp(8, 2), NamedSharding(mesh, spec1))
        arr2 = jax.device_put(inp(8, 2).T, NamedSharding(mesh, spec2))

        def f(seen, x, x2):
            seen.append(jax.typeof(x))
            y = jnp.sin(x * 2)
            seen.append(jax.typeof(y))
            return y @ x2

        got = check(front, f, [arr1, arr2])
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 2)


def test_only_auto_mesh_keeps_untyped_model(front) -> None:
    """Under all-Auto axes nothing is typed: the 2022 model, as before this change."""
    mesh = make_mesh((2, 2), ("x", "y"), (A, A))
    with jax.set_mesh(mesh):
        arr = jax.device_put(inp(8, 2), NamedSharding(mesh, P("x", None)))
        seen: list[Any] = []

        def f(x, x2):
            y = jnp.sin(x * 2)
            seen.append(jax.typeof(y))
            return y @ x2

        want = jax.jit(f)(arr, arr.T)
        got = partitioner.pjit(f, in_shardings=(P("x", None), P(None, "x")), out_shardings=P("x"))(
            arr, arr.T
        )
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        assert got.sharding.is_equivalent_to(want.sharding, 2)
        assert all(t.sharding.spec == P(None, None) for t in seen)


# --- control flow and transformations ---


def test_scan(front, partitioner_mode, mesh22) -> None:
    carry = put(inp(2, 8), P(None, "x"))
    arr = put(inp(8, 8, 2), P(None, "x", "y"))

    def f(seen, carry, xs):
        def g(c, x):
            seen.extend([jax.typeof(c), jax.typeof(x)])
            y = jnp.einsum("xy,yz->xz", c, x, out_sharding=P(None, "y"))
            z = jax.nn.relu(y)
            a = jnp.einsum("xy,yz->xz", z, x.T, out_sharding=P(None, "x"))
            seen.extend([jax.typeof(y), jax.typeof(a)])
            return a, y

        return lax.scan(g, carry, xs)

    check(
        front,
        f,
        [carry, arr],
        expect=(P(None, "x"), P(None, None, "y")),
        expect_types=[P(None, "x"), P("x", "y"), P(None, "y"), P(None, "x")],
        jit_grad=True,
    )


def test_scan_carry_shardings_diff_error(front) -> None:
    mesh = make_mesh((2,), ("x",))
    with jax.set_mesh(mesh):

        def f(seen, x):
            return lax.scan(lambda c, _: (reshard(c, P()), None), x, None, length=1)[0]

        check_error(
            front,
            f,
            [put(np.arange(4.0), P("x"))],
            TypeError,
            "scan.*carry input and carry output must have equal types",
        )


def _mapped(front: str, fun: Callable[..., Any], in_specs: Any, out_specs: Any):
    """The same function for jax.jit and for us: specs given to both, or to neither."""
    if front == "jit":
        return jax.jit(fun), partitioner.jit(fun)  # type: ignore[attr-defined]
    return (
        jax.jit(fun, in_shardings=in_specs, out_shardings=out_specs),
        partitioner.pjit(fun, in_shardings=in_specs, out_shardings=out_specs),
    )


def test_mul_vmap_of_pjit(front, mesh22) -> None:
    """jax.vmap around the pjit-ed function (jax's test_mul_vmap)."""
    arr = put(inp(8, 2), P("x", "y"))
    seen_jax: list[Any] = []
    seen_ours: list[Any] = []

    def body(seen, x):
        seen.append(jax.typeof(x))
        return (x * 2) * (x * 2)

    ref, _ = _mapped(front, functools.partial(body, seen_jax), P("y"), P("y"))
    _, ours = _mapped(front, functools.partial(body, seen_ours), P("y"), P("y"))
    # Staged under jax.jit: eagerly, jax.jit's batched call would find the committed
    # argument laid out otherwise than its batched in_shardings and refuse it.
    _assert_same_results(jax.jit(jax.vmap(ours))(arr), jax.jit(jax.vmap(ref))(arr))
    _types_equal(seen_ours, seen_jax)
    assert [t.sharding.spec for t in seen_ours] == [P("y")]
    g_want = jax.jit(jax.grad(lambda a: jnp.sum(jax.vmap(ref)(a))))(arr)
    g_ours = jax.jit(jax.grad(lambda a: jnp.sum(jax.vmap(ours)(a))))(arr)
    _assert_same_results(g_ours, g_want)
    _assert_sharding(g_ours, arr.sharding)


def test_dot_general_vmap_of_pjit(front, mesh22) -> None:
    arr1 = put(inp(4, 2, 2), P("x", None, "y"))
    arr2 = put(inp(2, 4, 2), P(None, "x", "y"))

    def f(x, y):
        return jnp.einsum("xy,yz->xz", x, y, out_sharding=P(None, "y"))

    ref, ours = _mapped(front, f, (P(None, "y"), P("x", "y")), P(None, "y"))

    def mapped(f: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(jax.vmap(f, in_axes=(0, 1), out_axes=2))  # staged: see above

    _assert_same_results(mapped(ours)(arr1, arr2), mapped(ref)(arr1, arr2))
    if front == "jit":  # jax's expectation: the batch dimension keeps its sharding
        _assert_sharding(mapped(ours)(arr1, arr2), NamedSharding(mesh22, P(None, "y", "x")))


def test_vmap_inside(front, mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(seen, x):
        def row(r):
            seen.append(jax.typeof(r))
            return jnp.sin(r) * 2

        return jax.vmap(row)(x)

    check(front, f, [arr], expect=P("x", "y"), expect_types=[P("y")], grad=True)


def test_jvp_linearize_vjp(partitioner_mode, mesh22) -> None:
    arr1, arr2 = put(inp(8, 2), P("x", None)), put(inp(8, 2).T, P(None, "y"))

    def f(x, y):
        return jnp.sin(x @ y)

    ours = partitioner.pjit(f, (P("x", None), P(None, "y")), P("x", "y"))
    ref = jax.jit(f)
    _assert_same_results(
        jax.jvp(ours, (arr1, arr2), (arr1, arr2)), jax.jvp(ref, (arr1, arr2), (arr1, arr2))
    )
    out_o, lin_o = jax.linearize(ours, arr1, arr2)
    out_w, lin_w = jax.linearize(ref, arr1, arr2)
    _assert_same_results((out_o, lin_o(arr1, arr2)), (out_w, lin_w(arr1, arr2)))
    y_o, vjp_o = jax.vjp(ours, arr1, arr2)
    y_w, vjp_w = jax.vjp(ref, arr1, arr2)
    _assert_same_results((y_o, vjp_o(y_o)), (y_w, vjp_w(y_w)))


def test_checkpoint_grad(mesh22) -> None:
    arr = put(inp(8, 2), P("x", "y"))

    def f(x):
        return jnp.sum(jax.checkpoint(lambda v: jnp.sin(v) * v)(x))

    ours = partitioner.pjit(f, P("x", "y"), None)
    g_o, g_w = jax.grad(ours)(arr), jax.grad(jax.jit(f))(arr)
    _assert_same_results(g_o, g_w)
    _assert_sharding(g_o, arr.sharding)


def test_nested_and_under_jax_jit(mesh22) -> None:
    """Our pjit nested in itself and inside jax.jit keeps the types jax.jit gives."""
    arr1, arr2 = put(inp(8, 2), P("x", None)), put(inp(8, 2).T, P(None, "y"))
    seen: list[Any] = []

    inner = partitioner.pjit(lambda x, y: x @ y, (P("x", None), P(None, "y")), P("x", "y"))

    def outer(x, y):
        z = inner(x, y)
        seen.append(jax.typeof(z))
        return jnp.sin(z)

    want = jax.jit(outer)(arr1, arr2)
    got = partitioner.pjit(outer, (P("x", None), P(None, "y")), P("x", "y"))(arr1, arr2)
    under_jit = jax.jit(outer)(arr1, arr2)
    _assert_same_results(got, want)
    _assert_same_results(under_jit, want)
    assert seen and all(t.sharding.spec == P("x", "y") for t in seen)


# --- how arguments and meshes are typed ---


def test_numpy_argument_is_typed_as_jax_types_it(front, mesh22) -> None:
    """An uncommitted argument has no sharding in its type, whatever its spec (as jax.jit)."""

    def f(seen, x):
        seen.append(jax.typeof(x))
        y = x * 2
        seen.append(jax.typeof(y))
        return y

    want_seen: list[Any] = []
    ours_seen: list[Any] = []
    want = jax.jit(functools.partial(f, want_seen), in_shardings=P("x"), out_shardings=P())(
        inp(8, 2)
    )
    got = partitioner.pjit(functools.partial(f, ours_seen), P("x"), P())(inp(8, 2))
    _assert_same_results(got, want)
    _types_equal(ours_seen, want_seen)


@pytest.mark.parametrize("context", ["set_mesh", "with_mesh", "partitioner_mesh"])
def test_mesh_contexts(front, context) -> None:
    """``jax.set_mesh``, ``with mesh:`` and ``partitioner.mesh(..., axis_types=...)`` all type."""
    mesh = make_mesh((2, 2), ("x", "y"))
    arr1 = jax.device_put(inp(8, 2), NamedSharding(mesh, P("x", None)))
    arr2 = jax.device_put(inp(8, 2).T, NamedSharding(mesh, P(None, "y")))
    seen: list[Any] = []

    def f(x, y):
        z = x @ y
        seen.append(jax.typeof(z))
        return z

    with jax.set_mesh(mesh):
        want = jax.jit(f)(arr1, arr2)
    ours = partitioner.pjit(f, (P("x", None), P(None, "y")), P("x", "y"))
    if context == "set_mesh":
        ctx: Any = jax.set_mesh(mesh)
    elif context == "with_mesh":
        ctx = mesh
    else:
        ctx = partitioner.mesh(mesh.devices, mesh.axis_names, axis_types=mesh.axis_types)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with ctx:
            got = ours(arr1, arr2)
            # Eager ops on typed values need jax.set_mesh (jax.jit's rule too), so the
            # loss around the call is jitted.
            g = jax.jit(jax.grad(lambda a, b: jnp.sum(ours(a, b)), argnums=(0, 1)))(arr1, arr2)
    _assert_same_results(got, want)
    assert seen[-1].sharding.spec == P("x", "y") and seen[-1] == seen[0]
    _assert_sharding(g[0], arr1.sharding)
    _assert_sharding(g[1], arr2.sharding)


def test_lowered_text_has_type_constraints(partitioner_mode, mesh22) -> None:
    """Each typed op is lowered with its sharding, as jax.jit lowers it."""
    arr = put(inp(8, 2), P("x", "y"))
    text = (
        partitioner.pjit(lambda x: (x * 2) * (x * 2), P("x", "y"), P("x", "y")).lower(arr).as_text()
    )
    marker = "sdy.sharding_constraint" if partitioner_mode == "shardy" else "@Sharding"
    assert text.count(marker) >= 3


# --- with_sharding_constraint over Explicit axes ---


@pytest.mark.parametrize("wsc", ["jax", "partitioner"])
def test_constraint_is_an_assert_over_explicit_axes(front, mesh22, wsc) -> None:
    """jax's test_wsc_error: over all-Explicit axes a constraint checks the type, changes nothing."""
    constrain = (
        jax.lax.with_sharding_constraint if wsc == "jax" else partitioner.with_sharding_constraint
    )
    arr = put(inp(8, 2), P("x", None))

    def ok(seen, x):
        y = constrain(x * 2, P("x", None))
        seen.append(jax.typeof(y))
        return y

    check(front, ok, [arr], expect=P("x", None), expect_types=[P("x", None)])

    def bad(seen, x):
        return constrain(x * 2, P(None, "y"))

    check_error(front, bad, [arr], AssertionError, "acts as an assert when all axes")


def test_constraint_names_only_auto_axes_of_a_mixed_mesh(front) -> None:
    mesh = make_mesh((2, 2), ("x", "y"), (E, A))
    with jax.set_mesh(mesh):
        arr = jax.device_put(inp(8, 2), NamedSharding(mesh, P("x", None)))

        def auto_ok(seen, x):
            return partitioner.with_sharding_constraint(x * 2, P(None, "y"))

        want = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P(None, "y")))(arr)
        got = _ours(front, functools.partial(auto_ok, []), [arr], P("x", "y"))(arr)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want))
        for constrain in (jax.lax.with_sharding_constraint, partitioner.with_sharding_constraint):
            with pytest.raises(ValueError, match="only refer to Auto axes"):
                _ours(front, lambda x, c=constrain: c(x, P("x", None)), [arr], P("x", None))(arr)


def test_pjit_in_scan_body(front, mesh22) -> None:
    """The pjit-ed step inside ``lax.scan`` (eager, grad, grad under jit), as jax.jit's."""
    carry = put(inp(8, 2), P("x", None))
    xs = put(np.ones((3, 8, 2), np.float32), P(None, "x", None))
    spec = P("x", None)
    ref, ours = _mapped(front, lambda c, x: jnp.sin(c) + x, (spec, spec), spec)

    def loop(step: Callable[..., Any]) -> Callable[..., Any]:
        return lambda c, xs: lax.scan(lambda c, x: (step(c, x), None), c, xs)[0]

    _assert_same_results(jax.jit(loop(ours))(carry, xs), jax.jit(loop(ref))(carry, xs))
    for wrap in (lambda g: g, jax.jit):
        g_ours = wrap(jax.grad(lambda c, x: loop(ours)(c, x).sum()))(carry, xs)
        g_want = wrap(jax.grad(lambda c, x: loop(ref)(c, x).sum()))(carry, xs)
        _assert_same_results(g_ours, g_want)
        _assert_sharding(g_ours, carry.sharding)


def test_lower_typed_shape_dtype_structs(front, mesh22) -> None:
    """``.lower`` on ShapeDtypeStructs with shardings types the body as the arrays would."""
    s = NamedSharding(mesh22, P("x", "y"))
    sds = jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=s)
    arr = put(inp(8, 2), P("x", "y"))
    seen: list[Any] = []

    def f(x):
        seen.append(jax.typeof(x))
        return (x * 2) * (x * 2)

    _, ours = _mapped(front, f, P("x", "y"), P("x", "y"))
    compiled = ours.lower(sds).compile()
    assert seen[-1].sharding.spec == P("x", "y")
    got = compiled(arr)
    _assert_same_results(got, jax.jit(f)(arr))


def test_vmap_spmd_axis_name_of_pjit(front, mesh22) -> None:
    """``vmap(..., spmd_axis_name=...)`` around the call: the batch dim over that axis."""
    arr = put(inp(8, 2), P("x", "y"))
    seen_jax: list[Any] = []
    seen_ours: list[Any] = []

    def body(seen, x):
        seen.append(jax.typeof(x))
        return jnp.sin(x)

    ref, _ = _mapped(front, functools.partial(body, seen_jax), P("y"), P("y"))
    _, ours = _mapped(front, functools.partial(body, seen_ours), P("y"), P("y"))

    def mapped(f: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(jax.vmap(f, spmd_axis_name="x"))

    got = mapped(ours)(arr)
    _assert_same_results(got, mapped(ref)(arr))
    _types_equal(seen_ours, seen_jax)
    _assert_sharding(got, arr.sharding)


def test_train_step_matches_jax_jit(front, partitioner_mode) -> None:
    """A donated optax step over an Explicit mesh: data parallel batch, model-sharded weights."""
    mesh = make_mesh((4, 2), ("data", "model"))
    with jax.set_mesh(mesh):
        params = {
            "w1": put(
                np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8), P(None, "model")
            ),
            "w2": put(np.linspace(1, -1, 8 * 4, dtype=np.float32).reshape(8, 4), P("model", None)),
        }
        x = put(np.linspace(0, 1, 32 * 16, dtype=np.float32).reshape(32, 16), P("data", None))
        y = put(np.linspace(1, 0, 32 * 4, dtype=np.float32).reshape(32, 4), P("data", None))
        opt = optax.adam(1e-2)

        def loss(p, x, y):
            h = jnp.tanh(x @ p["w1"])  # f32[32@data,8@model]
            out = jnp.einsum("bh,ho->bo", h, p["w2"], out_sharding=P("data", None))
            return jnp.mean((out - y) ** 2)

        def step(seen, p, s, x, y):
            value, grads = jax.value_and_grad(loss)(p, x, y)
            seen.append(jax.typeof(grads["w1"]))
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s, value

        state = opt.init(params)
        p_specs = jax.tree.map(lambda a: a.sharding.spec, params)
        s_specs = jax.tree.map(lambda a: a.sharding.spec, state)
        if front == "jit":
            ours = partitioner.jit(functools.partial(step, []), donate_argnums=(0, 1))  # type: ignore[attr-defined]
        else:
            ours = partitioner.pjit(
                functools.partial(step, []),
                (p_specs, s_specs, P("data", None), P("data", None)),
                (p_specs, s_specs, P()),
                donate_argnums=(0, 1),
            )
        seen: list[Any] = []
        ref = jax.jit(functools.partial(step, seen))
        p_ref, s_ref = params, state
        p_ours = jax.tree.map(jnp.copy, params)
        s_ours = jax.tree.map(jnp.copy, state)
        for _ in range(3):
            p_ref, s_ref, v_ref = ref(p_ref, s_ref, x, y)
            p_ours, s_ours, v_ours = ours(p_ours, s_ours, x, y)
            _assert_same_results((p_ours, s_ours, v_ours), (p_ref, s_ref, v_ref))
        assert seen[0].sharding.spec == P(None, "model")
