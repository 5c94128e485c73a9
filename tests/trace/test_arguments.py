"""Call-time binding (``trace/arguments.py``): statics apart, leaves with the user's paths.

Each check is against a value worked out by hand from the call, or against what
jax.jit does with the same call.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import pytest
from jax._src import api_util

from partitioner._src.trace.arguments import Binding, HashableStatic, bind_call


def _f(a: Any, n: Any, b: Any = None, *rest: Any, k: Any = None) -> None: ...


def _binding(**options: Any) -> Binding:
    return Binding("jit _f", inspect.signature(_f), **options)


def test_statics_come_out_and_leaves_keep_the_paths_the_user_wrote() -> None:
    bound = bind_call(
        _binding(static_argnums=(1,), static_argnames=("k",)),
        ({"w": 1, "b": 2}, 3, [4, 5], 6, 7),
        {"k": "static"},
    )
    assert bound.statics == ((1, 3), ("k", "static"))
    assert bound.flat.leaves == [2, 1, 4, 5, 6, 7]  # dict keys sorted, as jax flattens
    labels = [bound.flat.label(i) for i in range(len(bound.flat.leaves))]
    assert labels == ["a['b']", "a['w']", "b[0]", "b[1]", "rest[0]", "rest[1]"]
    assert bound.flat.where(2, "jit _f") == "jit _f: argument b[0]"


def test_rebuild_puts_the_statics_back() -> None:
    args, kwargs = ({"w": 1.0}, "n", [2.0], 3.0), {"k": "static"}
    bound = bind_call(_binding(static_argnums=(1,), static_argnames=("k",)), args, kwargs)
    assert bound.rebuild(bound.flat.leaves) == (args, kwargs)
    assert bound.rebuild([10.0, 20.0, 30.0]) == (({"w": 10.0}, "n", [20.0], 30.0), kwargs)


@pytest.mark.parametrize(("n_args", "static"), [(3, "b"), (2, "n"), (4, 3.0)])
def test_a_negative_static_position_counts_from_the_last_argument_passed(
    n_args: int, static: Any
) -> None:
    args = (1.0, "n", "b", 3.0)[:n_args]
    bound = bind_call(_binding(static_argnums=(-1,)), args, {})
    assert bound.statics == ((n_args - 1, static),)


def test_positions_apply_to_positional_arguments_and_names_to_keywords() -> None:
    """As jax.jit: ``donate_argnums=0`` donates ``a`` passed positionally, not by name."""
    binding = _binding(donate_argnums=(0,))
    assert bind_call(binding, (1.0, 2.0), {}).donated == (True, False)
    assert bind_call(binding, (), {"a": 1.0, "n": 2.0}).donated == (False, False)
    by_name = _binding(donate_argnames=("a",))
    assert bind_call(by_name, (), {"a": 1.0, "n": 2.0}).donated == (True, False)
    assert bind_call(by_name, (1.0, 2.0), {}).donated == (False, False)


def test_keywords_move_into_place_when_asked() -> None:
    """With in-specs given (``bind_keywords``), a keyword naming a positional parameter
    becomes that positional argument: the spec tree's prefix then covers it."""
    binding = _binding(bind_keywords=True, donate_argnums=(1,))
    bound = bind_call(binding, (1.0,), {"n": 2.0, "k": 3.0})
    assert (bound.args, bound.kwargs) == ((1.0, 2.0), {"k": 3.0})
    assert [bound.flat.label(i) for i in range(3)] == ["a", "n", "k"]
    assert bound.donated == (False, False, False)  # ``n`` was passed by keyword
    assert bind_call(binding, (1.0, 2.0), {"k": 3.0}).donated == (False, True, False)


VALUES = [1, True, 1.0, "1", (1,), None, 0, False]


def test_static_keys_match_as_jax_jits_do() -> None:
    """``1``, ``True`` and ``1.0`` are three signatures, equal values of one type one."""
    for x in VALUES:
        for y in VALUES:
            theirs = api_util._HashableWithStrictTypeEquality(
                x
            ) == api_util._HashableWithStrictTypeEquality(y)
            assert (HashableStatic(x) == HashableStatic(y)) is theirs, (x, y)
            if theirs:
                assert hash(HashableStatic(x)) == hash(HashableStatic(y))


def test_an_unhashable_static_argument_is_a_value_error_naming_it() -> None:
    def f(x: Any, n: Any) -> Any:
        return x

    with pytest.raises(ValueError, match="^Non-hashable static arguments are not supported"):
        jax.jit(f, static_argnums=1)(1.0, [2])
    binding = Binding("jit f", inspect.signature(f), static_argnums=(1,))
    with pytest.raises(ValueError, match="^Non-hashable static arguments are not supported") as e:
        bind_call(binding, (1.0, [2]), {})
    assert "jit f: static argument 1 of type list is not hashable" in str(e.value)
