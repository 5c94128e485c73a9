"""jax.jit's own behaviours (jax's ``tests/api_test.py``), side by side through both front doors.

Scenarios from jax's ``JitTest`` and the jit cases of ``APITest`` (plus the jit
cases of ``aot_test.py`` and ``jax_jit_test.py``), as of the jax sources this
project mirrors, rewritten here and run against installed jax 0.10.2: every case
calls ``jax.jit`` and ``partitioner.jit`` / ``partitioner.pjit`` (the ``door``
fixture) on the same inputs and compares what each did (``jit_conformance.py``):
values, shardings, committedness, consumed inputs, warnings, and errors (jax's
type and jax's own key sentence). jax's private counters (``_kept_var_idx``,
``count_pjit_cpp_cache_miss``) become what a user can see: the lowered module's
arguments, the executable's parameters, side effects counted while tracing.
"""

from __future__ import annotations

import concurrent.futures
import copy
import enum
import functools
import gc
import inspect
import operator
import re
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.conformance.jit_conformance import (
    agree_at_wrap,
    donation_warnings,
    door_name,
    executable_parameters,
    make_mesh,
    module_arguments,
    raises_like,
    same,
    same_donation,
    same_donation_warnings,
)

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

# --- donation (JitTest) ---

DONATE_XY = [
    pytest.param({"donate_argnums": (0, 1)}, id="argnums"),
    pytest.param({"donate_argnames": ("x", "y")}, id="argnames"),
]
DONATE_X = [
    pytest.param({"donate_argnums": 0}, id="argnums"),
    pytest.param({"donate_argnames": "x"}, id="argnames"),
]


@pytest.mark.parametrize("donate", DONATE_XY)
def test_donate_warning_raised(door: Any, donate: dict[str, Any]) -> None:
    def fun(x, y):
        return x.sum() + jnp.float32(y.sum())

    same_donation(
        door,
        fun,
        lambda: ((jnp.array([1.0, 2.0], jnp.float32), jnp.array([1, 2], jnp.int32)), {}),
        **donate,
    )


@pytest.mark.parametrize("donate", DONATE_X)
def test_donate_invalidates_input(door: Any, donate: dict[str, Any]) -> None:
    same_donation(door, lambda x: x + x - x, lambda: ((jnp.ones([]),), {}), **donate)


@pytest.mark.parametrize(
    "donate",
    [
        pytest.param({"donate_argnums": (2, 3)}, id="argnums"),
        pytest.param({"donate_argnames": ("c", "d")}, id="argnames"),
    ],
)
def test_donate_static_argnums(door: Any, donate: dict[str, Any]) -> None:
    def make():
        c = jax.device_put(jnp.array([2.0, 2.0]))
        d = jax.device_put(jnp.array([1.0, 1.0, 1.0, 1.0]))
        return (1, 2, c, d), {}

    same_donation(
        door, lambda a, b, c, d: ((a + b + c), (a + b + d)), make, static_argnums=(0, 1), **donate
    )


def test_donate_argnames_kwargs_static_argnums(door: Any) -> None:
    def make():
        c = jax.device_put(jnp.array([2.0, 2.0]))
        d = jax.device_put(jnp.array([1.0, 1.0, 1.0, 1.0]))
        e = jax.device_put(jnp.array([3.0, 3.0, 3.0, 3.0]))
        return (1, 2, c), {"d": d, "e": e}

    same_donation(
        door,
        lambda a, b, c, d, e: ((a + b + c), (a + b + d), (a + b + e)),
        make,
        static_argnums=(0, 1),
        donate_argnames=("d", "e"),
    )


@pytest.mark.parametrize("donate", DONATE_X)
def test_donate_weak_type(door: Any, donate: dict[str, Any]) -> None:
    same_donation(
        door, lambda x: x.astype(int), lambda: ((jnp.broadcast_to(2, (3,)),), {}), **donate
    )


@pytest.mark.parametrize(
    "donate",
    [
        pytest.param({"donate_argnums": (0,)}, id="argnums"),
        pytest.param({"donate_argnames": ("array",)}, id="argnames"),
    ],
)
def test_jnp_array_copy(door: Any, donate: dict[str, Any]) -> None:
    def _test(array):
        return array.at[0].set(77)

    x = jnp.asarray([0, 1])
    x_copy = jnp.array(x, copy=True)
    same(door(_test, **donate)(x), jax.jit(_test, **donate)(jnp.asarray([0, 1])))
    np.testing.assert_array_equal(np.asarray(x_copy), [0, 1])  # the copy survives donation


def test_specify_donate_argnums_and_argnames(door: Any) -> None:
    def make():
        return (jnp.ones((2, 5)) * 4,), {"inp2": jnp.ones((2, 5)) * 2, "inp3": jnp.ones((2, 5))}

    same_donation(
        door,
        lambda inp1, inp2, inp3: (inp1 * 2, inp2 * 2, inp3 * 2),
        make,
        donate_argnums=0,
        donate_argnames=("inp2", "inp3"),
    )


def test_donate_argnames_with_args(door: Any) -> None:
    same_donation(
        door,
        lambda inp1: inp1 * 2,
        lambda: ((jax.device_put(jnp.ones((2, 5)) * 4, jax.devices()[0]),), {}),
        donate_argnames="inp1",
    )


def test_donate_argnums_with_kwargs(door: Any) -> None:
    same_donation(
        door,
        lambda inp1: inp1 * 2,
        lambda: ((), {"inp1": jax.device_put(jnp.ones((2, 5)) * 4, jax.devices()[0])}),
        donate_argnums=0,
    )


def _donated_flags(args_info: Any) -> Any:
    return jax.tree.map(lambda info: info.donated, args_info)


@pytest.mark.parametrize("donate_argnums", [0, 1])
def test_donate_args_info_aot(door: Any, donate_argnums: int) -> None:
    def fn(x, y):
        return jax.tree.map(lambda i: i * 2, x), y * 2

    x = jax.device_put({"A": np.array(1.0), "B": np.array(2.0)}, jax.devices()[0])
    y = jax.device_put(np.array(3.0), jax.devices()[0])
    ours = door(fn, donate_argnums=donate_argnums).lower(x, y).args_info
    theirs = jax.jit(fn, donate_argnums=donate_argnums).lower(x, y).args_info
    assert _donated_flags(ours) == _donated_flags(theirs)


def test_double_donation(door: Any) -> None:
    def add(x, y):
        return x + y

    x, x2 = jnp.zeros((10,), jnp.float32), jnp.zeros((10,), jnp.float32)
    raises_like(
        lambda: door(add, donate_argnums=(0,))(x, x),
        lambda: jax.jit(add, donate_argnums=(0,))(x2, x2),
        "previously donated",
        door=door,
    )


DICT_DONATION = [
    pytest.param({"donate_argnames": ("z", "y")}, id="argnames"),
    pytest.param({"donate_argnums": (0, 1)}, id="argnums"),
]


def _dicts() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return {"c": jnp.array(3.0)}, {"b": jnp.array(2.0)}, {"a": jnp.array(1.0)}


@pytest.mark.parametrize("jit_kwargs", DICT_DONATION)
def test_dict_donation(door: Any, jit_kwargs: dict[str, Any]) -> None:
    def f(z, y, x):
        return z, y, x

    z, y, x = {"c": 3.0}, {"b": 2.0}, {"a": 1.0}
    ours = door(f, **jit_kwargs).lower(z=z, y=y, x=x).args_info
    theirs = jax.jit(f, **jit_kwargs).lower(z=z, y=y, x=x).args_info
    assert _donated_flags(ours) == _donated_flags(theirs)

    def make():
        z, y, x = _dicts()
        return (), {"z": z, "y": y, "x": x}

    same_donation(door, f, make, **jit_kwargs)


@pytest.mark.parametrize("jit_kwargs", DICT_DONATION)
def test_dict_donation_args_kwargs(door: Any, jit_kwargs: dict[str, Any]) -> None:
    def f(z, y, x):
        return z, y, x

    z, y, x = {"c": 3.0}, {"b": 2.0}, {"a": 1.0}
    ours = door(f, **jit_kwargs).lower(z, y=y, x=x).args_info
    theirs = jax.jit(f, **jit_kwargs).lower(z, y=y, x=x).args_info
    assert _donated_flags(ours) == _donated_flags(theirs)

    def make():
        z, y, x = _dicts()
        return (z,), {"y": y, "x": x}

    same_donation(door, f, make, **jit_kwargs)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"static_argnames": "x", "donate_argnames": "x"}, id="names"),
        pytest.param({"static_argnums": 0, "donate_argnums": 0}, id="nums"),
        pytest.param({"static_argnums": 0, "donate_argnames": "x"}, id="mixed"),
    ],
)
def test_intersecting_static_and_donate(door: Any, options: dict[str, Any]) -> None:
    # jax 0.10.2 words even the argnums case in terms of argnames.
    raises_like(
        lambda: door(lambda x: x, **options),
        lambda: jax.jit(lambda x: x, **options),
        "static_argnames and donate_argnames cannot intersect",
        door=door,
    )


@pytest.mark.parametrize("argnum_type", ["static_argnums", "donate_argnums"])
def test_argnums_overflow(door: Any, argnum_type: str) -> None:
    def f(a, b, c): ...

    def g(a, /, b, *, c): ...

    def h(a, *args): ...

    def i(): ...

    cases = [
        (f, (0, 1)),
        (g, (0, 1)),
        (f, (0, 1, -3)),
        (f, (0, 1, 3)),
        (f, (0, 1, -4)),
        (g, (0, 1, 3)),
        (g, (0, 1, -3)),
        (h, (0, 999)),
        (h, (0, -999)),
        (i, ()),
    ]
    for fun, nums in cases:
        agree_at_wrap(door, fun, **{argnum_type: nums})
    door(i)


@pytest.mark.parametrize("argnames_type", ["static_argnames", "donate_argnames"])
def test_argnames_validation(door: Any, argnames_type: str) -> None:
    def f(a, b, c): ...

    def g(a, b, **kwargs): ...

    def h(a, /, b, c, *args, **kwargs): ...

    cases = [
        (f, ("b", "c")),
        (f, ("b", "c", "not_defined")),
        (g, ("a", "b", "not_defined")),
        (h, ("b", "c")),
        (h, ("b", "c", "not_defined")),
        (h, ("a", "c")),
        (h, ("args", "c")),
    ]
    for fun, names in cases:
        agree_at_wrap(door, fun, **{argnames_type: names})


def test_donate_argnames_signature_fail(door: Any) -> None:
    class NoSignature:
        @property
        def __signature__(self):
            raise TypeError("no signature")

        def __call__(self, *args, **kwargs):
            return None

    fun = NoSignature()
    inp = np.arange(4)
    raises_like(
        lambda: door(fun, donate_argnames="a")(inp, inp),
        lambda: jax.jit(fun, donate_argnames="a")(inp, inp),
        "Getting the signature of function",
        "Pass donate_argnums instead of donate_argnames.",
        door=door,
    )


@pytest.mark.parametrize(
    "fun, nums, n",
    [
        pytest.param(lambda a, b, c: (a * 2, b * 2, c * 2), -1, 3, id="negative"),
        pytest.param(lambda a, *args: (a * 2, args[0] * 2, args[-1] * 2), (0, -1), 3, id="varargs"),
    ],
)
def test_negative_donate_argnums(door: Any, fun: Any, nums: Any, n: int) -> None:
    # jax 0.10.2 accepts these at wrap time and then donates no argument for the
    # negative entry (its donation vector only matches non-negative positions).
    same_donation(
        door, fun, lambda: (tuple(jnp.ones(3) for _ in range(n)), {}), donate_argnums=nums
    )


def test_negative_static_argnums(door: Any) -> None:
    def g(x, y):
        assert isinstance(y, int)
        return x * y

    ours, theirs = door(g, static_argnums=-1), jax.jit(g, static_argnums=-1)
    for i in range(3):  # the first call and the cached ones
        same(ours(2, i), theirs(2, i))


def test_jit_nested_donate_ignored(door: Any) -> None:
    a, b = jax.device_put(jnp.array(1)), jax.device_put(jnp.array(1))
    ours = door(lambda x: door(lambda y: y**2, donate_argnums=0)(x))(a)
    theirs = jax.jit(lambda x: jax.jit(lambda y: y**2, donate_argnums=0)(x))(b)
    same(ours, theirs)
    assert a.is_deleted() == b.is_deleted()


@pytest.mark.parametrize(
    "fun, shapes",
    [
        pytest.param(lambda x, y: x * 2, [(3,), (5,)], id="unused"),
        pytest.param(lambda x: x.astype(jnp.int32), [(3,)], id="dtype"),
        pytest.param(lambda x: x[:2], [(3,)], id="smaller"),
        pytest.param(lambda x: x.reshape(4, 2), [(8,)], id="reshape"),
        pytest.param(lambda x: x.sum(), [(8,)], id="reduced"),
        pytest.param(lambda x, y: x + y, [(8,), (8,)], id="one-output-two-donors"),
        pytest.param(lambda x: (x, x * 2), [(8,)], id="forwarded"),
    ],
)
def test_donation_used_exactly_where_jax_uses_it(door: Any, fun: Any, shapes: list[Any]) -> None:
    nums = tuple(range(len(shapes)))
    same_donation(door, fun, lambda: (tuple(jnp.ones(s) for s in shapes), {}), donate_argnums=nums)


# --- unused arguments ---


@pytest.mark.parametrize("num_args", [2, 3, 4])
def test_jit_with_pruned_args(door: Any, num_args: int) -> None:
    def f(*args):
        used = np.array(2)
        return args[1] + used

    same(door(f)(*range(num_args)), jax.jit(f)(*range(num_args)))


@pytest.mark.parametrize(
    "fun, keep_unused",
    [
        pytest.param(lambda x, y: x + y, False, id="both-used"),
        pytest.param(lambda x, y: x, False, id="pruned"),
        pytest.param(lambda x, y: x, True, id="keep_unused"),
    ],
)
def test_jit_lower_no_pruning(door: Any, fun: Any, keep_unused: bool) -> None:
    ours = door(fun, keep_unused=keep_unused).lower(1.0, 2.0)
    theirs = jax.jit(fun, keep_unused=keep_unused).lower(1.0, 2.0)
    assert module_arguments(ours) == module_arguments(theirs)
    ours_c, theirs_c = ours.compile(), theirs.compile()
    assert executable_parameters(ours_c) == executable_parameters(theirs_c)
    # The stages still report every argument.
    for o, t in ((ours, theirs), (ours_c, theirs_c)):
        assert o.in_avals == t.in_avals
        assert len(o.args_info[0]) == len(t.args_info[0]) == 2
    assert len(ours_c.input_shardings[0]) == len(theirs_c.input_shardings[0]) == 2
    same(ours_c(1.0, 2.0), theirs_c(1.0, 2.0))


@pytest.mark.parametrize("keep_unused", [True, False])
def test_keep_unused(door: Any, keep_unused: bool) -> None:
    def f(x, y, z, a, b, c):
        return c @ c.T

    inp = jax.device_put(jnp.arange(4), jax.devices()[0])
    unused = jax.device_put(jnp.arange(8), jax.devices()[0])
    args = (unused,) * 5 + (inp,)
    ours, theirs = door(f, keep_unused=keep_unused), jax.jit(f, keep_unused=keep_unused)
    for _ in range(2):  # then the fast path
        same(ours(*args), theirs(*args))
    ours_l, theirs_l = ours.lower(*args), theirs.lower(*args)
    assert module_arguments(ours_l) == module_arguments(theirs_l)
    assert executable_parameters(ours_l.compile()) == executable_parameters(theirs_l.compile())


def test_dce_no_array(door: Any) -> None:
    arr = jax.device_put(np.arange(8.0), NamedSharding(make_mesh((2,), ("x",)), P("x")))

    def f(a, b, c):
        return a, c

    ours, theirs = door(f), jax.jit(f)
    for _ in range(2):
        same(ours(arr, 2.0, 3.0), theirs(arr, 2.0, 3.0))


def test_aot_error_on_dced_avals_mismatch(door: Any) -> None:
    x, y1, y2 = jnp.ones(4), jnp.ones(4), jnp.ones(1)

    def f(x, y):
        return x + 1 if y.shape[0] > 2 else x + 2

    ours, theirs = door(f), jax.jit(f)
    same(ours(x, y1), theirs(x, y1))
    same(ours(x, y2), theirs(x, y2))
    g_ours, g_theirs = ours.lower(x, y1).compile(), theirs.lower(x, y1).compile()
    same(g_ours(x, y1), g_theirs(x, y1))
    raises_like(
        lambda: g_ours(x, y2),
        lambda: g_theirs(x, y2),
        "Argument types differ from the types for which this computation was compiled",
        door=door,
    )


def test_aot_with_constants_and_dce(door: Any) -> None:
    const = jnp.arange(16.0) + 42.0

    def f(x, y_dead):
        return const[0:8] + x

    inp, y_dead = jnp.arange(8.0), jnp.arange(24.0)
    ours, theirs = door(f).lower(inp, y_dead).compile(), jax.jit(f).lower(inp, y_dead).compile()
    assert len(ours.args_info[0]) == len(theirs.args_info[0]) == 2
    assert ours.in_avals == theirs.in_avals
    assert len(ours.input_shardings[0]) == len(theirs.input_shardings[0])
    assert len(ours.input_formats[0]) == len(theirs.input_formats[0])
    same(ours(inp, y_dead), theirs(inp, y_dead))
    assert executable_parameters(ours) == executable_parameters(theirs)


# --- the wrapped function ---


def test_jit_repr(door: Any) -> None:
    def my_function():
        return

    assert repr(my_function) in repr(jax.jit(my_function))
    assert repr(my_function) in repr(door(my_function))


def test_jit_repr_errors(door: Any) -> None:
    class Callable:
        def __call__(self):
            pass

        def __repr__(self):
            raise ValueError("invalid repr")

    repr(jax.jit(Callable()))  # jax's repr succeeds when the function's fails
    assert isinstance(repr(door(Callable())), str)


def test_jit_decorator_factory(door: Any) -> None:
    def func(x, flag):
        return x if flag else -x

    ours = functools.partial(door, static_argnames=["flag"])(func)
    theirs = jax.jit(static_argnames=["flag"])(func)
    for flag in (True, False):
        same(ours(1, flag), theirs(1, flag))


def test_jit_of_noncallable(door: Any) -> None:
    raises_like(lambda: door(3), lambda: jax.jit(3), "Expected a callable value", door=door)


def test_jit_of_generator(door: Any) -> None:
    def gen(x):
        yield x

    raises_like(
        lambda: door(gen),
        lambda: jax.jit(gen),
        "Expected a function, got a generator function",
        door=door,
    )


def test_staticmethod_is_not_supported(door: Any) -> None:
    def define(wrap):
        class A:
            @wrap
            @staticmethod
            def my_staticmethod_jit(x):
                return x + 2

        return A

    raises_like(
        lambda: define(door),
        lambda: define(jax.jit),
        "staticmethod arguments are not supported",
        door=door,
    )


def test_static_argnum_on_classmethod_is_not_supported(door: Any) -> None:
    def define(wrap):
        class A:
            @functools.partial(wrap, static_argnums=(0,))
            @classmethod
            def my_classmethod_jit(cls, x):
                return x + 2

        return A

    raises_like(
        lambda: define(door), lambda: define(jax.jit), "Expected a callable value", door=door
    )


def _count_traces(wrap: Any, fun: Any, calls: list[tuple[Any, ...]], **options: Any) -> list[Any]:
    """Results and, after each call, how many times ``fun`` was traced so far."""
    side: list[None] = []

    def traced(*args, **kwargs):
        side.append(None)
        return fun(*args, **kwargs)

    functools.update_wrapper(traced, fun)
    f = wrap(traced, **options)
    return [(f(*args), len(side)) for args in calls]


def _same_traces(door: Any, fun: Any, calls: list[tuple[Any, ...]], **options: Any) -> None:
    ours = _count_traces(door, fun, calls, **options)
    theirs = _count_traces(jax.jit, fun, calls, **options)
    assert [n for _, n in ours] == [n for _, n in theirs]
    for (o, _), (t, _) in zip(ours, theirs):
        same(o, t)


@pytest.mark.parametrize("numpy_scalars", [False, True])
def test_jit_static_args(door: Any, numpy_scalars: bool) -> None:
    one, two, three = (np.asarray(i, np.int32) if numpy_scalars else i for i in (1, 2, 3))

    def f(x, y, z, flag=False, flag2=False):
        assert flag
        return 100 * x + 10 * y + z

    calls = [
        (one, two, three, True, False),
        (one, two, three, True, False),
        (two, one, three, True, False),
        (two, one, three, True, True),
    ]
    _same_traces(door, f, calls, static_argnums=(3, 4))
    calls2 = [(1, 2, 3, True, False), (1, 3, 3, True, False), (2, 2, 3, True, False)]
    calls2 += [(2, 4, 3, True, False), (2, 4, 3, True, True), (2, 5, 3, True, True)]
    _same_traces(door, f, calls2, static_argnums=(0, 2, 3, 4))


def test_static_args_equality_and_cache_size(door: Any) -> None:
    class A:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            return isinstance(other, A)

    def f(x, static_arg):
        return x * 100

    _same_traces(door, f, [(1, A()), (1, A())], static_argnums=(1,))
    ours, theirs = door(f, static_argnums=(1,)), jax.jit(f, static_argnums=(1,))
    ours(1, A()), theirs(1, A())
    ours(1, A()), theirs(1, A())
    assert ours._cache_size() == theirs._cache_size()


def test_jit_kwargs(door: Any) -> None:
    one, two, three = (np.asarray(i, np.int32) for i in (1, 2, 3))

    def run(wrap: Any) -> list[tuple[int, int]]:
        side: list[None] = []

        def f(x, y, z):
            side.append(None)
            return 100 * x + 10 * y + z.astype(y.dtype)

        g = wrap(f)
        seen = []
        for keyword in (False, False, True, True):  # a keyword call is another signature
            out = g(one, two, z=three) if keyword else g(one, two, three)
            seen.append((int(out), len(side)))
        g(one, two, z=np.zeros(3))  # doesn't crash
        return seen

    assert run(door) == run(jax.jit)


def test_jit_device(door: Any) -> None:
    device = jax.devices()[-1]
    same(door(lambda x: x, device=device)(3.0), jax.jit(lambda x: x, device=device)(3.0))


def test_jit_device_moves_committed_arguments(door: Any) -> None:
    # jax.jit(device=...) moves an argument committed to another device there.
    device = jax.devices()[5]
    f, g = door(lambda v: v * 2, device=device), jax.jit(lambda v: v * 2, device=device)
    for i in range(3):  # the first call, then cached ones (one from another device)
        x = jax.device_put(jnp.arange(8.0), jax.devices()[2 if i < 2 else 5])
        ours, theirs = f(x), g(x)
        same(ours, theirs, equal_shardings=True)
        assert ours.sharding.device_set == {device}


def test_complex_support(door: Any) -> None:
    same(door(lambda x: x + 1)(1 + 1j), jax.jit(lambda x: x + 1)(1 + 1j))


def test_jit_with_many_args_works(door: Any) -> None:
    def f(args_list):
        return sum(args_list)

    same(door(f)(list(range(300))), jax.jit(f)(list(range(300))))


def test_jit_global_cache(door: Any) -> None:
    for wrap in (jax.jit, door):
        state = {"tracing": True}

        def f(x, state=state):
            assert state["tracing"]
            return x

        wrap(f)(2)
        state["tracing"] = False
        wrap(f)(3)  # a fresh wrapper of the same function: no new trace


def test_jit_clear_cache_forces_a_retrace(door: Any) -> None:
    def calls(wrap: Any) -> list[int]:
        side: list[None] = []

        def f(x):
            side.append(None)
            return x * 2

        g = wrap(f)
        counts = []
        for clear in (False, False, True):
            if clear:
                g.clear_cache()
            g(1.0)
            counts.append(len(side))
        return counts

    assert calls(door) == calls(jax.jit)


def test_cache_key_defaults(door: Any) -> None:
    ours, theirs = door(lambda x: (x**2).sum()), jax.jit(lambda x: (x**2).sum())
    assert ours._cache_size() == theirs._cache_size() == 0
    x = jnp.arange(5.0)
    for _ in range(3):
        ours(x), theirs(x)
    assert ours._cache_size() == theirs._cache_size()


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["shallow", "deep"])
def test_jit_copy(door: Any, copier: Any) -> None:
    same(door(copier)(1), jax.jit(copier)(1))


def test_disable_jit(door: Any) -> None:
    def run(wrap: Any) -> int:
        effects: list[int] = []

        def f(x):
            effects.append(1)
            return x

        g = wrap(f)
        with jax.disable_jit():
            g(2)
            g(2)
        g(2)
        g(2)
        return len(effects)

    assert run(door) == run(jax.jit)


def test_static_argnum_on_method(door: Any) -> None:
    class A:
        @functools.partial(door, static_argnums=(0,))
        def my_func_jit(self, x):
            return x + 2

    class B:
        @functools.partial(jax.jit, static_argnums=(0,))
        def my_func_jit(self, x):
            return x + 2

    same(A().my_func_jit(3), B().my_func_jit(3))


def test_concurrent_jit(door: Any) -> None:
    f = door(lambda x: x + x - 3.0)
    xs = [np.random.RandomState(i).randn(i) for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor() as executor:
        ys = [fut.result() for fut in [executor.submit(functools.partial(f, x)) for x in xs]]
    for x, y in zip(xs, ys):
        same(y, jax.jit(lambda x: x + x - 3.0)(x))


def test_trivial_computations(door: Any) -> None:
    x = jnp.array([1, 2, 3])
    y = door(lambda x: x)(x)
    assert x.unsafe_buffer_pointer() != y.unsafe_buffer_pointer()
    z1, z2 = door(lambda x: (x, x))(x)
    assert z1.unsafe_buffer_pointer() != z2.unsafe_buffer_pointer()
    x1, x2 = jnp.array([1, 2]), jnp.array([2, 3])
    z1, z2, z3 = door(lambda x, y: (y, 1, x))(x1, x2)
    assert z1.unsafe_buffer_pointer() != x2.unsafe_buffer_pointer()
    assert z3.unsafe_buffer_pointer() != x1.unsafe_buffer_pointer()
    same((z1, z2, z3), jax.jit(lambda x, y: (y, 1, x))(x1, x2))


def test_trivial_computations_with_tokens(door: Any) -> None:
    def noop(arr, token):
        return arr, token

    arr, token = jnp.ones(10), jax.lax.create_token()
    _, ours = door(noop)(arr, token)
    _, theirs = jax.jit(noop)(arr, token)
    assert type(ours) is type(theirs) is type(token)
    assert ours is not token


def test_jit_token_input(door: Any) -> None:
    x = jax.device_put(jnp.arange(8), jax.devices()[0])
    token = jax.lax.create_token(None)
    out1, out2 = door(lambda x, t: (x, t))(x, token)
    theirs1, theirs2 = jax.jit(lambda x, t: (x, t))(x, token)
    same(out1, theirs1)
    assert type(out2) is type(theirs2)


def test_jit_returning_and_capturing_tokens(door: Any) -> None:
    assert type(door(jax.lax.create_token)(1.0)) is type(jax.jit(jax.lax.create_token)(1.0))
    tok = jax.lax.create_token()
    _, ours = door(lambda x: (x + 2, tok))(7)
    _, theirs = jax.jit(lambda x: (x + 2, tok))(7)
    assert type(ours) is type(theirs)


def test_tokens_through_a_sharded_call(door: Any) -> None:
    # A token beside arrays laid out over a mesh: replicated, passed through, reusable.
    mesh = make_mesh((4, 2), ("x", "y"))
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("x", "y")))

    def f(a, t):
        return a * 2, jax.lax.after_all(t, jax.lax.create_token())

    ours, theirs = door(f)(x, jax.lax.create_token()), jax.jit(f)(x, jax.lax.create_token())
    same(ours[0], theirs[0], equal_shardings=True)
    assert type(ours[1]) is type(theirs[1])
    again = door(f)(ours[0], ours[1])  # the token a call returned goes into the next
    same(again[0], jax.jit(f)(theirs[0], theirs[1])[0])


def test_tokens_inside_the_body(door: Any) -> None:
    # What the refusal leaves: tokens created and used inside the function work.
    def f(x):
        token = jax.lax.create_token(x)
        token = jax.lax.after_all(token, jax.lax.create_token())
        return x * 2

    same(door(f)(jnp.arange(8.0)), jax.jit(f)(jnp.arange(8.0)))


def test_jit_on_all_devices(door: Any) -> None:
    data = np.random.RandomState(0).rand(16).astype(np.float32)
    f = door(jnp.negative)
    for device in jax.local_devices():
        x = jax.device_put(data, device=device)
        same(f(x), jax.jit(jnp.negative)(x))


def test_jit_reference_dropping(door: Any) -> None:
    x = jnp.ones(10)
    f = (lambda x: lambda: x)(x)  # x lives in f's closure
    g = door(f)
    x = weakref.ref(x)
    assert x() is not None
    f()
    g()
    g()
    del f
    assert x() is not None
    g()
    del g
    gc.collect()
    assert x() is None  # as under jax.jit: nothing else holds the closure


def test_jit_boundmethod_reference_cycle(door: Any) -> None:
    class A:
        def __init__(self):
            self._foo = door(self.foo)

        def foo(self):
            pass

    a = weakref.ref(A())
    gc.collect()
    assert a() is None


def test_cpp_jitted_function_returns_an_array(door: Any) -> None:
    f = door(lambda a: a + 1)
    f(1)
    assert type(f(2)) is type(jax.jit(lambda a: a + 1)(2))


def test_jit_wrapped_attributes(door: Any) -> None:
    def f(x: int) -> int:
        """docstring of f."""
        return x + 1

    f.some_value = 4  # type: ignore[attr-defined]
    ours, theirs = door(f), jax.jit(f)
    for attr in ["doc", "name", "module", "qualname", "annotations", "wrapped"]:
        assert getattr(ours, f"__{attr}__") == getattr(theirs, f"__{attr}__"), attr
    assert ours.some_value == theirs.some_value
    assert inspect.signature(ours) == inspect.signature(theirs) == inspect.signature(f)


def test_jit_python_builtin(door: Any) -> None:
    x = jnp.array([1, 2])
    same(
        door(operator.add, static_argnums=(1,))(x, 1),
        jax.jit(operator.add, static_argnums=(1,))(x, 1),
    )


def test_jit_static_argnums_requires_type_equality(door: Any) -> None:
    # Values that compare equal but have different types do not share a trace.
    def k(v):
        return v

    calls = [(x,) for x in (1, 1, True, True, 1.0, 1.0)]
    _same_traces(door, k, calls, static_argnums=(0,))


def test_jit_static_argnames_non_interned(door: Any) -> None:
    import json

    def do_nothing(foobar: int):
        return foobar

    argname = str(json.loads(json.dumps("foobar")))
    assert door(do_nothing, static_argnames=[argname])(foobar=2) == 2


def test_caches_depend_on_axis_env(door: Any) -> None:
    def f():
        return jax.lax.axis_size("i")

    g = door(f)
    for size in (2, 3):
        ours = jax.vmap(g, axis_name="i", axis_size=size, out_axes=None)()
        theirs = jax.vmap(jax.jit(f), axis_name="i", axis_size=size, out_axes=None)()
        same(ours, theirs)


def test_jit_nan_times_zero(door: Any) -> None:
    same(door(lambda x: 1 + x * 0)(np.nan), jax.jit(lambda x: 1 + x * 0)(np.nan))


def test_sum_of_closed_over_bools(door: Any) -> None:
    mask = jnp.ones(32, dtype=jnp.bool_)
    same(door(lambda m: jnp.sum(m))(mask), jax.jit(lambda m: jnp.sum(m))(mask))
    same(door(lambda: jnp.sum(mask))(), jax.jit(lambda: jnp.sum(mask))())


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn])
def test_jit_custom_floats(door: Any, dtype: Any) -> None:
    x = jnp.ones((), dtype=dtype)
    same(door(lambda x: x + 1)(x), jax.jit(lambda x: x + 1)(x))


def test_no_tracing(door: Any) -> None:
    f = door(lambda x: x)
    f(jnp.arange(3))
    with pytest.raises(RuntimeError, match="no_tracing"):
        with jax.no_tracing():
            jax.jit(lambda x: x)(jnp.arange(4))  # jax's own wording
    with pytest.raises(RuntimeError, match="no_tracing"):
        with jax.no_tracing():
            f(jnp.arange(4))


def test_no_execution(door: Any) -> None:
    f = door(lambda: jnp.ones(3))
    f()
    with pytest.raises(RuntimeError, match="no_execution"):
        with jax.no_execution():
            jax.jit(lambda: jnp.ones(3))()
    with pytest.raises(RuntimeError, match="no_execution"):
        with jax.no_execution():
            f()
    f()


def test_jit_inline(door: Any) -> None:
    for inline in (False, True):
        ours = str(jax.make_jaxpr(door(lambda x: x * 2, inline=inline))(3))
        theirs = str(jax.make_jaxpr(jax.jit(lambda x: x * 2, inline=inline))(3))
        assert ("jit" in ours) == ("jit" in theirs), (inline, ours, theirs)


def test_grad_of_jit_and_jit_of_grad(door: Any) -> None:
    def run(wrap: Any) -> tuple[list[Any], list[int]]:
        side: list[None] = []

        def f(x):
            side.append(None)
            return x * x

        g = wrap(f)
        outs = [jax.grad(g)(1.0), jax.grad(g)(2.0)]
        counts = [len(side)]
        h = wrap(jax.grad(g))
        outs += [h(1.0), h(2.0)]
        return outs, counts + [len(side)]

    (ours, our_counts), (theirs, their_counts) = run(door), run(jax.jit)
    assert our_counts == their_counts
    same(ours, theirs)


def test_jit_item(door: Any) -> None:
    x = jnp.array(1.0)
    raises_like(
        lambda: door(lambda x: x.item())(x),
        lambda: jax.jit(lambda x: x.item())(x),
        "Abstract tracer value",
        door=door,
    )


def test_eval_shape(door: Any) -> None:
    def f(x, y):
        return {"s": x + y, "m": x @ y.T}

    x, y = jnp.ones((4, 3)), jnp.ones((4, 3))
    theirs = jax.jit(f).eval_shape(x, y)
    assert door(f).eval_shape(x, y) == theirs
    assert jax.eval_shape(door(f), x, y) == jax.eval_shape(jax.jit(f), x, y)


def test_jit_trace(door: Any) -> None:
    def f(x):
        return x * 2

    x = jnp.arange(8, dtype=jnp.int32)
    ours, theirs = door(f).trace(x), jax.jit(f).trace(x)
    assert len(ours.jaxpr.eqns) == len(theirs.jaxpr.eqns)
    assert ours.out_info.shape == theirs.out_info.shape
    assert ours.out_info.dtype == theirs.out_info.dtype
    assert ours.in_avals == theirs.in_avals
    assert ours.fun_name == theirs.fun_name


def test_jit_trace_lower_and_compile(door: Any) -> None:
    def f(x):
        return x * 2

    for stage in (lambda w: w(f).trace(jnp.arange(8)).lower(), lambda w: w(f).lower(jnp.arange(8))):
        ours, theirs = stage(door), stage(jax.jit)
        assert ours.args_info[0][0].shape == theirs.args_info[0][0].shape
        same(ours.compile()(jnp.arange(8)), theirs.compile()(jnp.arange(8)))


def test_lowered_module_is_named_for_the_front_door(door: Any) -> None:
    def my_function(x):
        return x * 2

    name = re.compile(r"module @(\w+)")
    theirs = name.search(jax.jit(my_function).lower(1.0).as_text()).group(1)  # type: ignore[union-attr]
    ours = name.search(door(my_function).lower(1.0).as_text()).group(1)  # type: ignore[union-attr]
    assert theirs == "jit_my_function"
    assert ours == theirs.replace("jit", door_name(door), 1)


def test_lower_with_wrapper_error(door: Any) -> None:
    f = door(lambda x: x)
    same(f.lower(1.0).compile()(1.0), jax.jit(lambda x: x).lower(1.0).compile()(1.0))
    wrapped_f = functools.wraps(f)(lambda x: f(x + 1))
    with pytest.raises(AttributeError, match="has no attribute 'lower'"):
        wrapped_f.lower(1.0)


# --- compiled calls (the stages) ---


def test_jit_lower_compile(door: Any) -> None:
    def f(x):
        return jnp.sqrt(x**2) + 1.0

    ours, theirs = door(f).lower(1.0), jax.jit(f).lower(1.0)
    ours_c, theirs_c = ours.compile(), theirs.compile()
    same(ours_c(1.0), theirs_c(1.0))
    for o, t in ((ours, theirs), (ours_c, theirs_c)):
        assert o.in_avals == t.in_avals
        assert o.in_tree == t.in_tree


def test_jit_lower_duck_typing(door: Any) -> None:
    sds = jax.ShapeDtypeStruct((), "float32")
    ours = door(lambda x: 2 * x).lower(sds).compile()
    theirs = jax.jit(lambda x: 2 * x).lower(sds).compile()
    same(ours(jnp.float32(1.0)), theirs(jnp.float32(1.0)))


def test_jit_lower_with_shaped_array(door: Any) -> None:
    aval = jax.core.ShapedArray((8, 8), np.int32)
    x = jnp.arange(64, dtype=np.int32).reshape(8, 8)
    ours = door(lambda a, b: a @ b).lower(aval, x).compile()
    same(ours(x, x), jax.jit(lambda a, b: a @ b).lower(aval, x).compile()(x, x))


IN_TREE_MISMATCH = (
    "Function compiled with input pytree does not match the input pytree it was called with"
)


@pytest.mark.parametrize(
    "fun",
    [
        pytest.param(lambda x: jnp.sqrt(x**2) + 1.0, id="computation"),
        pytest.param(lambda x: x, id="trivial"),
    ],
)
def test_jit_lower_compile_in_tree_mismatch(door: Any, fun: Any) -> None:
    ours, theirs = door(fun).lower(1.0).compile(), jax.jit(fun).lower(1.0).compile()
    raises_like(lambda: ours([1.0]), lambda: theirs([1.0]), IN_TREE_MISMATCH, door=door)


def test_aot_compile_in_tree_mismatch(door: Any) -> None:
    tree1 = {"a": {"c": 5, "d": 6}}
    tree2 = {"a": 1, "c": {"b": 5, "e": 7}}
    raises_like(
        lambda: door(lambda t: t).lower(tree1).compile()(tree2),
        lambda: jax.jit(lambda t: t).lower(tree1).compile()(tree2),
        IN_TREE_MISMATCH,
        door=door,
    )


def test_compiled_called_with_kwargs_as_positional(door: Any) -> None:
    x, y = jnp.ones(3), jnp.ones(3)
    ours = door(lambda x, y: x + y).lower(x, y=y).compile()
    theirs = jax.jit(lambda x, y: x + y).lower(x, y=y).compile()
    same(ours(x, y=y), theirs(x, y=y))
    raises_like(lambda: ours(x, y), lambda: theirs(x, y), IN_TREE_MISMATCH, door=door)


ARG_TYPES_DIFFER = "Argument types differ from the types for which this computation was compiled"


def test_jit_lower_compile_arg_type_mismatch(door: Any) -> None:
    def f(x):
        return jnp.sqrt(x**2) + 1.0

    x = jnp.array(1, dtype=int)
    x_f32, x_i32 = x.astype(jnp.float32), x.astype(jnp.int32)
    ours, theirs = door(f).lower(x_f32).compile(), jax.jit(f).lower(x_f32).compile()
    raises_like(
        lambda: ours(x_i32),
        lambda: theirs(x_i32),
        ARG_TYPES_DIFFER,
        "The mismatches are:\n",
        re.compile(r"Argument 'x' compiled with.*float32.*and called with.*int32"),
        door=door,
    )


def test_jit_lower_compile_shape_mismatch_names_each_argument(door: Any) -> None:
    def f(x, y):
        return x @ y

    x = jnp.ones((8, 8), jnp.float32)
    ours, theirs = door(f).lower(x, x).compile(), jax.jit(f).lower(x, x).compile()
    z = jnp.ones((4, 4), jnp.int32)
    raises_like(
        lambda: ours(z, z),
        lambda: theirs(z, z),
        ARG_TYPES_DIFFER,
        re.compile(r"Argument 'x' compiled with.*float32.*and called with.*int32.*\n"),
        re.compile(r"Argument 'y' compiled with.*float32.*and called with.*int32"),
        door=door,
    )


def test_jit_lower_compile_vmap(door: Any) -> None:
    ours, theirs = (
        door(lambda x: x + 4).lower(1.0).compile(),
        jax.jit(lambda x: x + 4).lower(1.0).compile(),
    )
    raises_like(
        lambda: jax.vmap(lambda x: ours(x) + 2)(jnp.ones(3)),
        lambda: jax.vmap(lambda x: theirs(x) + 2)(jnp.ones(3)),
        "Cannot apply JAX transformations to a function lowered and compiled for a particular signature",
        re.compile(r"Detected .*BatchTracer"),
        door=door,
    )


@pytest.mark.parametrize(
    "fun", [lambda *a: jnp.sqrt(a[0] ** 2) + 1.0, lambda *a: a[0]], ids=["computation", "trivial"]
)
def test_jit_lower_compile_multi_arg(door: Any, fun: Any) -> None:
    same(
        door(fun).lower(1.0, 1.0).compile()(1.0, 1.0),
        jax.jit(fun).lower(1.0, 1.0).compile()(1.0, 1.0),
    )


def test_jit_lower_donate_argnums_available(door: Any) -> None:
    def f(*args):
        return args[0] + 4.0

    ours = door(f, donate_argnums=(0,)).lower(1.0, 1.0)
    theirs = jax.jit(f, donate_argnums=(0,)).lower(1.0, 1.0)
    assert ours.donate_argnums == ours.compile().donate_argnums == theirs.donate_argnums


def test_lower_compile_with_kwargs(door: Any) -> None:
    def f(x, y, **kwargs):
        return x @ y

    x = jnp.arange(64).reshape(8, 8)
    ours = door(f).lower(x, x + 1, a=1, b=2).compile()
    theirs = jax.jit(f).lower(x, x + 1, a=1, b=2).compile()
    same(ours(x, x + 1, a=1, b=2), theirs(x, x + 1, a=1, b=2))
    assert ours.in_tree == theirs.in_tree


@pytest.mark.parametrize("fun", [lambda x: x + 4, lambda x: x], ids=["computation", "trivial"])
def test_jit_lower_text_and_ir(door: Any, fun: Any) -> None:
    ours, theirs = door(fun).lower(1.0), jax.jit(fun).lower(1.0)
    for dialect in (None, "hlo", "stablehlo"):
        assert isinstance(ours.as_text(dialect), str)
        assert ours.compiler_ir(dialect) is not None
    text, jax_text = ours.as_text("stablehlo"), theirs.as_text("stablehlo")
    for attribute in ("mhlo.num_partitions = 1", "mhlo.num_replicas = 1"):
        assert attribute in jax_text and attribute in text
    ours.cost_analysis()
    compiled = ours.compile()
    assert isinstance(compiled.as_text(), (str, type(None)))
    assert compiled.cost_analysis() is not None
    compiled.memory_analysis()
    assert compiled.runtime_executable() is not None


def test_lower_as_text_debug_info(door: Any) -> None:
    def my_function(x):
        return jnp.sin(x)

    for wrap in (jax.jit, door):
        lowered = wrap(my_function).lower(42.0)
        assert re.search(r"sine.* loc", lowered.as_text("stablehlo", debug_info=True))
        assert not re.search(r"sine.* loc", lowered.as_text("stablehlo"))


def test_jit_lower_compile_with_compiler_options(door: Any) -> None:
    def f(x):
        return jnp.sqrt(x**2) + 1.0

    ours, theirs = door(f).lower(1.0), jax.jit(f).lower(1.0)
    options = {"xla_embed_ir_in_executable": True, "xla_dump_max_hlo_modules": 200}
    compiled = [
        ours.compile(),
        ours.compile(options),
        ours.compile({"xla_embed_ir_in_executable": False}),
    ]
    assert len({id(c) for c in compiled}) == 3
    same(compiled[1](1.0), theirs.compile(options)(1.0))
    raises_like(
        lambda: ours.compile(compiler_options={"invalid_key": "invalid_value"}),
        lambda: theirs.compile(compiler_options={"invalid_key": "invalid_value"}),
        "No such compile option: 'invalid_key'",
        door=door,
    )
    raises_like(
        lambda: ours.compile(compiler_options={"xla_embed_ir_in_executable": "invalid_value"}),
        lambda: theirs.compile(compiler_options={"xla_embed_ir_in_executable": "invalid_value"}),
        "is not a valid bool value.",
        door=door,
    )


def test_lowered_out_info(door: Any) -> None:
    inp = np.arange(8, dtype=np.int32)
    ours = door(lambda x: x).lower((inp, inp)).out_info
    theirs = jax.jit(lambda x: x).lower((inp, inp)).out_info
    for o, t in zip(ours, theirs, strict=True):
        assert (o.shape, o.dtype, o.sharding) == (t.shape, t.dtype, t.sharding)


# --- jax's messages for bad input (JitTest, APITest) ---


def test_jit_bad_input(door: Any) -> None:
    def f(x):
        return x

    for bad in ("foo", jnp.int32):
        raises_like(
            lambda bad=bad: door(f)(bad),
            lambda bad=bad: jax.jit(f)(bad),
            "as an abstract array",
            "was passed to the function at path x.",
            door=door,
        )
    raises_like(
        lambda: door(f)({"a": 1, "b": "foo"}),
        lambda: jax.jit(f)({"a": 1, "b": "foo"}),
        "was passed to the function at path x['b'].",
        door=door,
    )


def test_jit_masked_array(door: Any) -> None:
    x = np.ma.array([1, 2, 3], mask=[True, False, True])
    raises_like(
        lambda: door(lambda x: x)(x),
        lambda: jax.jit(lambda x: x)(x),
        "numpy masked arrays are not supported",
        door=door,
    )


def test_check_arg_error(door: Any) -> None:
    sds = jax.ShapeDtypeStruct((4, 2), np.int32)
    inp = np.arange(8).reshape(4, 2)
    raises_like(
        lambda: door(lambda x: x)({"a": inp, "b": {"c": sds}}),
        lambda: jax.jit(lambda x: x)({"a": inp, "b": {"c": sds}}),
        re.compile(
            r"Argument 'x\['b'\]\['c'\]' of shape int32\[4,2\] of type.*ShapeDtypeStruct.*is not a valid JAX type"
        ),
        door=door,
    )


def test_shape_dtype_struct_as_const_error(door: Any) -> None:
    const = jax.ShapeDtypeStruct((8,), jnp.int32)
    raises_like(
        lambda: door(lambda x: (x, const))(jnp.arange(8)),
        lambda: jax.jit(lambda x: (x, const))(jnp.arange(8)),
        "A ShapeDtypeStruct does not have a value",
        door=door,
    )


def test_jit_raises_on_non_hashable_static_argnum(door: Any) -> None:
    def f(x, y):
        return x + 3

    ours, theirs = door(f, static_argnums=(1,)), jax.jit(f, static_argnums=(1,))
    for first_call in (True, False):  # on the first call, and after a cached one
        if not first_call:
            same(ours(1, 1), theirs(1, 1))
        raises_like(
            lambda: ours(1, np.asarray(1)),
            lambda: theirs(1, np.asarray(1)),
            "Non-hashable static arguments are not supported",
            door=door,
        )


def test_static_argument_whose_eq_raises(door: Any) -> None:
    class HashableWithoutEq:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            raise NotImplementedError("A Python error is as is, without stack trace")

    def f(x, y):
        return x + 3

    ours, theirs = door(f, static_argnums=[1]), jax.jit(f, static_argnums=[1])
    ours(1, 1), theirs(1, 1)

    def twice(g):  # __eq__ is only called on a possible cache hit
        g(1, HashableWithoutEq())
        g(1, HashableWithoutEq())

    raises_like(
        lambda: twice(ours),
        lambda: twice(theirs),
        "static arguments should be comparable using __eq__",
        door=door,
    )


def test_static_argument_whose_hash_raises(door: Any) -> None:
    class A:
        def __hash__(self):
            raise ValueError

    ours, theirs = raises_like(
        lambda: door(lambda x: x + 1, static_argnums=(0,))(A()),
        lambda: jax.jit(lambda x: x + 1, static_argnums=(0,))(A()),
        door=door,
    )
    assert str(theirs) == "" and str(ours) == ""  # the user's error, as it is


def test_jit_enum_as_dict_keys_fails(door: Any) -> None:
    class E(enum.Enum):
        A = 0
        B = 1

    def f(d):
        return d[E.A]

    raises_like(
        lambda: door(f)({E.A: 1.0, E.B: 2.0}),
        lambda: jax.jit(f)({E.A: 1.0, E.B: 2.0}),
        re.compile("('<' not supported|Comparator raised exception)"),
        door=door,
    )


def test_deleted_input(door: Any) -> None:
    for first_call in (True, False):
        x, y = jax.device_put(np.arange(8)), jax.device_put(np.arange(8))
        ours, theirs = door(lambda v: v + 1), jax.jit(lambda v: v + 1)
        if not first_call:
            same(ours(x), theirs(y))
        x.delete()
        y.delete()
        raises_like(
            lambda f=ours, x=x: f(x), lambda f=theirs, y=y: f(y), "has been deleted", door=door
        )


def test_unusable_donation_warns_once_per_lowering(door: Any) -> None:
    # The warning comes with lowering: the first call of each new function warns
    # (even one whose program equals an earlier one's), a cached call is silent.
    for _ in range(2):

        def fun(x):
            return x.sum()

        theirs_f, ours_f = jax.jit(fun, donate_argnums=0), door(fun, donate_argnums=0)
        for _ in range(2):
            _, theirs = donation_warnings(functools.partial(theirs_f, jnp.ones(4)))
            _, ours = donation_warnings(functools.partial(ours_f, jnp.ones(4)))
            same_donation_warnings(ours, theirs)
