"""When two jaxprs are the same program (``trace/equality.py``): up to variable names only.

The programs here are traced twice with ``jax.make_jaxpr`` (new objects, new
variables each time); what makes two of them differ is worked out by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partitioner._src.trace.equality import closed_jaxprs_equal

X = np.ones(4, np.float32)
C = np.arange(4.0, dtype=np.float32)


def _traced(f: Callable[..., Any], *args: Any) -> Any:
    """``f`` traced afresh (a new wrapper: ``make_jaxpr`` keeps a trace per function)."""
    return jax.make_jaxpr(lambda *a: f(*a))(*(args or (X, X)))


def _cond(a: float, b: float) -> Callable[..., Any]:
    return lambda x, y: jax.lax.cond(x[0] > 0, lambda: x + a, lambda: y - b)


SAME = {
    "arithmetic": lambda x, y: jnp.sin(x) * 2 + y,
    "a cond": _cond(1.0, 1.0),
    "a scan": lambda x, y: jax.lax.scan(lambda c, v: (c + v, c * v), x[0], y)[1],
    "a closed-over constant": lambda x, y: x + C,
}


@pytest.mark.parametrize("f", SAME.values(), ids=SAME)
def test_the_same_function_traced_twice_is_the_same_program(f: Callable[..., Any]) -> None:
    a, b = _traced(f), _traced(f)
    assert a is not b and a.jaxpr.invars[0] is not b.jaxpr.invars[0]
    assert closed_jaxprs_equal(a, b)


OTHER = {
    "another literal": (lambda x, y: x * 2 + y, lambda x, y: x * 3 + y),
    "another primitive": (lambda x, y: jnp.sin(x) + y, lambda x, y: jnp.cos(x) + y),
    "operands swapped": (lambda x, y: x - y, lambda x, y: y - x),
    "another output": (lambda x, y: (x + y, x), lambda x, y: (x + y, y)),
    "a branch's literal": (_cond(1.0, 1.0), _cond(1.0, 2.0)),
    "an equal constant, another object": (lambda x, y: x + C, lambda x, y: x + C.copy()),
}


@pytest.mark.parametrize("f, g", OTHER.values(), ids=OTHER)
def test_programs_that_differ_are_not_equal(f: Callable[..., Any], g: Callable[..., Any]) -> None:
    assert closed_jaxprs_equal(_traced(f), _traced(f))
    assert not closed_jaxprs_equal(_traced(f), _traced(g))


def test_another_input_type_is_another_program() -> None:
    f = SAME["arithmetic"]
    assert not closed_jaxprs_equal(_traced(f), _traced(f, X, X.astype(np.float16)))
    assert not closed_jaxprs_equal(_traced(f), _traced(f, X[:2], X[:2]))
