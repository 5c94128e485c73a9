"""Wrap-time argnums (``trace/argnums.py``) against jax.jit's own readers in ``api_util``.

jax reads ``static_argnums``/``donate_argnums`` and their names with private helpers;
ours must agree with them value for value and sentence for sentence (ours then name
the function: `` (jit f)``).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from jax._src import api_util

from partitioner._src.trace.argnums import (
    index_tuple,
    infer_argnums_and_argnames,
    validate_argnames,
    validate_argnums,
)

API = "jit f"


def _positional(x: Any, y: Any, z: Any) -> None: ...


def _keyword_only(x: Any, y: Any, *, k: Any) -> None: ...


def _varargs(x: Any, *args: Any) -> None: ...


def _varkw(x: Any, y: Any, **kw: Any) -> None: ...


def _positional_only(a: Any, /, b: Any, *, c: Any) -> None: ...


SIGNATURES = {
    f.__name__.lstrip("_"): inspect.signature(f)
    for f in (_positional, _keyword_only, _varargs, _varkw, _positional_only)
}
ARGNUMS = [None, (0,), (1,), (0, 2), (-1,), (-4,), (5,)]
ARGNAMES = [None, ("y",), ("k",), ("x", "y"), ("b", "c"), ("nope",)]


def _outcome(check: Any, *args: Any) -> Any:
    """``check(*args)``'s value, or its error's type and message."""
    try:
        return check(*args)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_inferred_argnums_and_argnames_are_jax_jits(sig: str) -> None:
    signature = SIGNATURES[sig]
    for nums in ARGNUMS:
        for names in ARGNAMES:
            ours = infer_argnums_and_argnames(signature, nums, names)
            assert ours == api_util.infer_argnums_and_argnames(signature, nums, names), (
                nums,
                names,
            )


@pytest.mark.parametrize("sig", SIGNATURES)
def test_out_of_range_argnums_get_jax_jits_error(sig: str) -> None:
    signature = SIGNATURES[sig]
    for nums in ARGNUMS[1:]:
        theirs = _outcome(api_util._validate_argnums, signature, nums, "static_argnums")
        ours = _outcome(validate_argnums, signature, nums, "static_argnums", API)
        if theirs is None:
            assert ours is None, nums
        else:
            assert ours == (theirs[0], f"{theirs[1]} ({API})"), nums


@pytest.mark.parametrize("sig", SIGNATURES)
def test_argnames_the_function_cannot_take_get_jax_jits_error(sig: str) -> None:
    signature = SIGNATURES[sig]
    for names in [("y",), ("k",), ("a",), ("c",), ("args",), ("nope",)]:
        theirs = _outcome(api_util._validate_argnames, signature, names, "donate_argnames")
        ours = _outcome(validate_argnames, signature, names, "donate_argnames", API)
        if theirs is None:
            assert ours is None, names
        else:
            assert ours == (theirs[0], f"{theirs[1]} ({API})"), names


@pytest.mark.parametrize("value", [3, np.int32(2), [0, 1], (), (-1, 4), range(2)])
def test_index_tuples_are_jax_jits(value: Any) -> None:
    assert index_tuple(value, "static_argnums", API) == api_util._ensure_index_tuple(value)


@pytest.mark.parametrize("value", ["a", 1.5, [0.5], [0, "1"]])
def test_what_is_not_an_index_is_a_type_error_as_in_jax(value: Any) -> None:
    with pytest.raises(TypeError):
        api_util._ensure_index_tuple(value)
    with pytest.raises(TypeError, match=f"^{API} static_argnums must be an int or a sequence"):
        index_tuple(value, "static_argnums", API)


def test_negative_positions_are_refused_where_asked() -> None:
    """pmap's argnums: positions count from the front only."""
    assert index_tuple(-1, "donate_argnums", "pmap f") == (-1,)
    with pytest.raises(ValueError, match=r"pmap f donate_argnums must be non-negative"):
        index_tuple((0, -1), "donate_argnums", "pmap f", negative=False)
