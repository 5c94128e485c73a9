"""jax.jit's answers to bad input, side by side through both front doors.

A function body that returns what is not a JAX value, a spec leaf that is not
a spec, a bare PartitionSpec with no mesh in context: each case runs through
``jax.jit`` (or, where the classic mesh context decides, jax's own ``pjit``)
and through ``partitioner.jit`` / ``partitioner.pjit`` (the ``door`` fixture),
and ours must raise jax's public exception type with jax's key sentence
(``jit_conformance.raises_like`` first checks the sentence in jax's message),
so a ``pytest.raises(match=...)`` written against jax holds for ours.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import partitioner
from tests.conformance.jit_conformance import door_name, raises_like, same, same_outcome

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pjit import pjit as jax_pjit


def jax_twin(door: Any) -> Any:
    """jax's function of the same name (jax's pjit names itself in its no-mesh sentence)."""
    return jax_pjit if door is partitioner.pjit else jax.jit


def _generator(x: Any) -> Any:
    return (v for v in [x])


# --- a body that returns what is not a JAX value ---

# (the body, the part of jax's sentence that names what it returned and where)
BAD_OUTPUTS = [
    pytest.param(lambda x: "hello", "type <class 'str'>, which", id="str"),
    pytest.param(lambda x: object(), "type <class 'object'>, which", id="object"),
    pytest.param(_generator, "type <class 'generator'>, which", id="generator"),
    pytest.param(lambda x: b"x", "type <class 'bytes'>, which", id="bytes"),
    pytest.param(lambda x: lambda: x, "type <class 'function'>, which", id="function"),
    pytest.param(
        lambda x: {"a": x, "b": "s"},
        "type <class 'str'> at output component ['b'], which",
        id="str-in-dict",
    ),
    pytest.param(
        lambda x: [x, object()],
        "type <class 'object'> at output component [1], which",
        id="object-in-list",
    ),
    pytest.param(
        lambda x: (x, ("s", x)),
        "type <class 'str'> at output component [1][0], which",
        id="str-in-nested-tuple",
    ),
    pytest.param(
        lambda x: {"a": [x, {"c": _generator(x)}]},
        "type <class 'generator'> at output component ['a'][1]['c'], which",
        id="generator-deep",
    ),
]

# How the jit-ed function is reached: called, staged, or inside a jax transformation.
STAGES: dict[str, Callable[[Any, Any], Any]] = {
    "call": lambda jitted, x: jitted(x),
    "lower": lambda jitted, x: jitted.lower(x),
    "trace": lambda jitted, x: jitted.trace(x),
    "grad": lambda jitted, x: jax.grad(lambda v: (jitted(v), v.sum())[1])(x),
    "vmap": lambda jitted, x: jax.vmap(jitted)(jnp.stack([x, x])),
}


# jax 0.10.2 warns that a generator is a pytree leaf (and will refuse it), for jax.jit too.
@pytest.mark.filterwarnings("ignore:Python iterable type 'generator':DeprecationWarning")
@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("fun, returned", BAD_OUTPUTS)
def test_body_returns_no_jax_value(door: Any, fun: Any, returned: str, stage: str) -> None:
    run = STAGES[stage]
    x = jnp.arange(3.0)
    raises_like(
        lambda: run(door(fun), x),
        lambda: run(jax.jit(fun), x),
        f"traced for jit returned a value of {returned} is not a valid JAX type",
        door=door,
    )


# A None output is an empty pytree for jax.jit, not a bad value: kept wherever jax keeps it.
NONE_OUTPUTS = [
    pytest.param(lambda x: None, id="None"),
    pytest.param(lambda x: (x, None), id="tuple"),
    pytest.param(lambda x: {"a": x, "b": None}, id="dict"),
    pytest.param(lambda x: [None, [x, None]], id="nested"),
]


@pytest.mark.parametrize("fun", NONE_OUTPUTS)
def test_none_outputs_are_empty_pytrees(door: Any, fun: Any) -> None:
    x = jnp.arange(3.0)
    same(door(fun)(x), jax.jit(fun)(x))
    same(jax.vmap(door(fun))(jnp.stack([x, x])), jax.vmap(jax.jit(fun))(jnp.stack([x, x])))
    assert door(fun).lower(x).out_tree == jax.jit(fun).lower(x).out_tree


@pytest.mark.parametrize("fun", NONE_OUTPUTS)
def test_grad_of_none_output_is_jax_grads_error(door: Any, fun: Any) -> None:
    x = jnp.arange(3.0)
    same_outcome(
        lambda: jax.grad(door(fun))(x),
        lambda: jax.grad(jax.jit(fun))(x),
        "Gradient only defined for scalar-output functions",
    )


# --- spec leaves that are not specs ---

BAD_LEAVES = [
    pytest.param(1, id="int"),
    pytest.param("x", id="str"),
    pytest.param(["x", "y"], id="list-of-str"),
    pytest.param(1.5, id="float"),
    pytest.param((P("x"), 2), id="int-in-tuple"),
]


def _not_a_spec(keyword: str, leaf: Any) -> str:
    """jax's sentence: it names the first leaf that is no spec, as ``str`` shows it."""
    bad = [v for v in jax.tree.leaves(leaf) if not isinstance(v, P)]
    return f"{keyword} leaf specifications are expected to be PartitionSpec instances or None, but got {bad[0]}"


@pytest.mark.parametrize("keyword", ["in_shardings", "out_shardings"])
@pytest.mark.parametrize("leaf", BAD_LEAVES)
def test_spec_leaf_that_is_no_spec(door: Any, keyword: str, leaf: Any) -> None:
    x = jnp.arange(4.0)
    options = {keyword: leaf}
    raises_like(
        lambda: door(lambda v: v, **options),
        lambda: jax.jit(lambda v: v, **options),
        _not_a_spec(keyword, leaf),
        door=door,
    )
    raises_like(
        lambda: door(lambda v: v, **options)(x),
        lambda: jax_twin(door)(lambda v: v, **options)(x),
        _not_a_spec(keyword, leaf),
        door=door,
    )


@pytest.mark.parametrize("keyword", ["in_shardings", "out_shardings"])
@pytest.mark.parametrize("leaf", BAD_LEAVES)
def test_axis_resources_leaf_that_is_no_spec(keyword: str, leaf: Any) -> None:
    """pjit's 2022 names get jax's sentence under those names, as jax's pjit of
    2022 worded it (``f"{arg_name} leaf specifications ..."``); jax 0.10.2's
    ``jax.jit`` gives the sentence, named after today's keyword."""
    legacy = keyword.replace("shardings", "axis_resources")
    with pytest.raises(TypeError) as theirs:
        jax.jit(lambda v: v, **{keyword: leaf})
    assert _not_a_spec(keyword, leaf) in str(theirs.value)
    with pytest.raises(TypeError) as ours:
        partitioner.pjit(lambda v: v, **{legacy: leaf})
    assert _not_a_spec(legacy, leaf) in str(ours.value)


@pytest.mark.parametrize("leaf", [pytest.param(1, id="int"), pytest.param("x", id="str")])
def test_constraint_leaf_that_is_no_spec(door: Any, leaf: Any) -> None:
    """Checked before the mesh, as jax: a TypeError with no mesh in context too (our
    with_sharding_constraint's own parameter is ``axis_resources``: no ``door=``)."""
    x = jnp.arange(4.0)
    raises_like(
        lambda: door(lambda v: partitioner.with_sharding_constraint(v, leaf))(x),
        lambda: jax.jit(lambda v: jax.lax.with_sharding_constraint(v, leaf))(x),
        _not_a_spec("shardings", leaf),
    )


# --- a bare PartitionSpec with no mesh in context ---


@pytest.mark.parametrize("stage", ["call", "lower"])
@pytest.mark.parametrize("keyword", ["in_shardings", "out_shardings"])
@pytest.mark.parametrize("spec", [pytest.param(P("x"), id="P-x"), pytest.param(P(), id="P")])
def test_partition_spec_with_no_mesh(door: Any, keyword: str, stage: str, spec: P) -> None:
    """jax's sentence names the door alone ("jit requires ..."): ours names the
    function after it, in our help."""
    run = STAGES[stage]
    x = jnp.arange(4.0)
    options = {keyword: spec}
    raises_like(
        lambda: run(door(lambda v: v, **options), x),
        lambda: run(jax_twin(door)(lambda v: v, **options), x),
        f"{door_name(door)} requires a non-empty mesh in context if you are passing "
        f"`PartitionSpec`s to {keyword}.",
        door=door,
    )
