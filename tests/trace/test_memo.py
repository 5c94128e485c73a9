"""Functions of a jaxpr memoised for the jaxpr's life (``trace/memo.py``, NOTE [derived jaxpr cache])."""

from __future__ import annotations

import gc
import types
import weakref
from typing import Any

import jax
import numpy as np

from partitioner._src.trace.memo import ByIdentity, cache_per_jaxpr


def _jaxpr() -> Any:
    return jax.make_jaxpr(lambda x: x + 1)(np.float32(0))


class _Derived:
    """What a memoised function builds (weak-referenceable, holds no constants)."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args


def _counting() -> tuple[Any, list[Any]]:
    calls: list[Any] = []

    @cache_per_jaxpr
    def derive(jaxpr: Any, *args: Any) -> Any:
        calls.append(args)
        return _Derived(args)

    return derive, calls


def test_the_same_jaxpr_and_arguments_give_the_same_object() -> None:
    derive, calls = _counting()
    jaxpr = _jaxpr()
    first = derive(jaxpr, 1, "a")
    assert derive(jaxpr, 1, "a") is first
    assert derive(jaxpr, 2, "a") is not first
    assert derive(_jaxpr(), 1, "a") is not first  # an equal program, another object
    assert calls == [(1, "a"), (2, "a"), (1, "a")]


def test_an_entry_lives_as_long_as_its_jaxpr() -> None:
    derive, _ = _counting()
    jaxpr = _jaxpr()
    result = weakref.ref(derive(jaxpr, 1))
    gc.collect()
    assert result() is not None  # kept by the cache while the jaxpr lives
    del jaxpr
    gc.collect()
    assert result() is None


def test_results_holding_tracers_are_not_kept() -> None:
    calls: list[Any] = []

    @cache_per_jaxpr
    def closes_over(jaxpr: Any, values: ByIdentity) -> Any:
        calls.append(values)
        return types.SimpleNamespace(consts=values.values)

    jaxpr = _jaxpr()

    def body(x: Any) -> Any:
        assert closes_over(jaxpr, ByIdentity([x])).consts[0] is x
        assert closes_over(jaxpr, ByIdentity([x])).consts[0] is x
        return x

    jax.jit(body)(np.float32(1))
    assert len(calls) == 2


def test_by_identity_matches_only_the_very_same_objects() -> None:
    a, b = np.zeros(3), np.zeros(3)
    assert ByIdentity([a, b]) == ByIdentity((a, b))
    assert hash(ByIdentity([a, b])) == hash(ByIdentity((a, b)))
    assert ByIdentity([a]) != ByIdentity([b])  # equal values, other objects
    assert ByIdentity([a, b]) != ByIdentity([a])
    assert {ByIdentity([a]): 1}.get(ByIdentity([a])) == 1
