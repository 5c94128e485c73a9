"""Malformed calls raise jax's exception class, so ``except`` clauses written against jax hold.

Each case runs the same bad call through jax (``jax.jit``, ``jax.pmap``,
``jax.lax.with_sharding_constraint``) and through partitioner, and checks that
jax raises exactly the class named here (so the expectation is jax's, not ours)
and that ours is an instance of it: jax's class itself, or a subclass keeping
partitioner's clearer message (the argument's path, the axis, the sizes). Where
jax's message has a key sentence, ours carries it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

# jax 0.10.2 exports neither name; these are the classes its own code raises.
from jax._src.named_sharding import DuplicateSpecError
from jax._src.sharding import IndivisibleError
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner


def raises_as_jax(
    ours: Callable[[], Any], theirs: Callable[[], Any], jax_class: type[BaseException], *keys: str
) -> BaseException:
    """jax raises exactly ``jax_class``, ours an instance of it; each key is in both messages.

    Returns:
        our exception.
    """
    with pytest.raises(jax_class) as their_info:
        jax.block_until_ready(theirs())
    assert type(their_info.value) is jax_class, type(their_info.value)
    with pytest.raises(jax_class) as our_info:
        jax.block_until_ready(ours())
    for key in keys:
        assert key in str(their_info.value), f"not jax's wording: {key!r}"
        assert key in str(our_info.value), f"jax's {key!r} missing from ours: {our_info.value}"
    return our_info.value


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


MESH8 = _mesh((8,), ("x",))
MESH42 = _mesh((4, 2), ("a", "b"))


def _identity(a: Any) -> Any:
    return a


def _first(a: Any, b: Any) -> Any:
    return a


# --- a sharding that does not divide the shape: IndivisibleError ---

INDIVISIBLE = "implies that array axis 0 is partitioned 8 times, but the dimension size is 6"


@pytest.mark.parametrize("option", ["in_shardings", "out_shardings"])
@pytest.mark.parametrize("spelling", ["NamedSharding", "PartitionSpec under set_mesh"])
def test_indivisible_sharding_is_jax_indivisible_error(door, option, spelling) -> None:
    spec = P("x")
    sharding = NamedSharding(MESH8, spec) if spelling == "NamedSharding" else spec
    x = np.arange(6.0, dtype=np.float32)
    context = contextlib.nullcontext() if spelling == "NamedSharding" else jax.set_mesh(MESH8)
    with context:
        err = raises_as_jax(
            lambda: door(_identity, **{option: sharding})(x),
            lambda: jax.jit(_identity, **{option: sharding})(x),
            IndivisibleError,
            INDIVISIBLE,
        )
    where = "argument a" if option == "in_shardings" else "output"
    assert where in str(err) and "which is not divisible by 8" in str(err), err


def test_several_indivisible_arguments_keep_jax_class(door) -> None:
    """Every bad leaf is listed at once; the list is still jax's class."""
    sharding = NamedSharding(MESH8, P("x"))
    x, y = np.arange(6.0, dtype=np.float32), np.arange(10.0, dtype=np.float32)
    err = raises_as_jax(
        lambda: door(_first, in_shardings=sharding)(x, y),
        lambda: jax.jit(_first, in_shardings=sharding)(x, y),
        IndivisibleError,
    )
    assert "argument a" in str(err) and "argument b" in str(err), err


# --- a spec naming one mesh axis twice: DuplicateSpecError ---


def _duplicate_sentence(option: str, spec: str) -> str:
    return (
        f"A single {option} specification can map every mesh axis to at most one positional "
        f"dimension, but {spec} has duplicate entries for `a`"
    )


CONSTRAINTS: dict[str, Callable[[Callable[..., Any], Callable[..., Any]], Any]] = {
    "eager": lambda jit, wsc: wsc(np.ones((8, 8), np.float32), P("a", "a")),
    "under jit": lambda jit, wsc: jit(lambda v: wsc(v, P("a", "a")))(np.ones((8, 8), np.float32)),
    "in a tree": lambda jit, wsc: jit(lambda v: wsc(v, {"k": P("a", "a")}))(
        {"k": np.ones((8, 8), np.float32)}
    ),
}


@pytest.mark.parametrize("case", sorted(CONSTRAINTS))
def test_duplicate_axis_in_a_constraint_is_duplicate_spec_error(case) -> None:
    run = CONSTRAINTS[case]
    with jax.set_mesh(MESH42):
        err = raises_as_jax(
            lambda: run(partitioner.jit, partitioner.with_sharding_constraint),
            lambda: run(jax.jit, jax.lax.with_sharding_constraint),
            DuplicateSpecError,
            _duplicate_sentence("shardings", "P('a', 'a')"),
        )
    assert "with_sharding_constraint axis_resources" in str(err)
    assert "mesh axis 'a' more than once" in str(err), err
    assert isinstance(err, ValueError)  # partitioner raised ValueError before: still caught


@pytest.mark.parametrize("option", ["in_shardings", "out_shardings"])
def test_duplicate_axis_in_a_call_spec_is_duplicate_spec_error(door, option) -> None:
    """jax refuses the spec when the function is wrapped, as ours does."""
    spec = P(("a", "b"), "a")
    err = raises_as_jax(
        lambda: door(_identity, **{option: spec}),
        lambda: jax.jit(_identity, **{option: spec}),
        DuplicateSpecError,
        _duplicate_sentence(option, "P(('a', 'b'), 'a')"),
    )
    assert f"{option}: the spec" in str(err) and "'a' more than once" in str(err), err


# --- pmap's in_axes out of range: IndexError ---


@pytest.mark.parametrize(
    ("in_axes", "args", "jax_class"),
    [
        pytest.param(2, (np.ones((8, 2)),), IndexError, id="past-the-rank"),
        pytest.param(-3, (np.ones((8, 2)),), IndexError, id="negative"),
        pytest.param(({"k": 2},), ({"k": np.ones((8, 2))},), IndexError, id="in-a-dict"),
        # jax reads the size off the first mapped argument: a later one's bad axis is a
        # ValueError there, which ours is too.
        pytest.param((0, 5), (np.ones((8, 2)), np.ones((8, 2))), ValueError, id="second-arg"),
    ],
)
def test_pmap_in_axes_out_of_range_is_jax_class(in_axes, args, jax_class) -> None:
    def f(*a: Any) -> Any:
        return a[0]

    err = raises_as_jax(
        lambda: partitioner.pmap(f, in_axes=in_axes)(*args),
        lambda: jax.pmap(f, in_axes=in_axes)(*args),
        jax_class,
    )
    assert "in_axes" in str(err) and "of rank 2 is out of range" in str(err), err


# --- pmap arguments whose mapped sizes differ: IndivisibleError ---


@pytest.mark.parametrize(
    ("in_axes", "second"),
    [(0, np.ones((4,), np.float32)), ((0, 1), np.ones((8, 2), np.float32))],
    ids=["leading-4", "dimension-1"],
)
def test_pmap_unequal_mapped_sizes_is_indivisible_error(in_axes, second) -> None:
    x = np.ones((8, 2), np.float32)
    err = raises_as_jax(
        lambda: partitioner.pmap(_first, in_axes=in_axes)(x, second),
        lambda: jax.pmap(_first, in_axes=in_axes)(x, second),
        IndivisibleError,
    )
    assert "the mapped axis sizes differ: args[0] has 8 at dimension 0" in str(err), err


# --- a bare PartitionSpec beside a NamedSharding, no mesh in context: RuntimeError ---

NO_MESH = "requires a non-empty mesh in context if you are passing `PartitionSpec`s to {}"

MIXED: dict[str, tuple[dict[str, Any], str]] = {
    "in P, out NamedSharding": (
        {"in_shardings": P("x"), "out_shardings": NamedSharding(MESH8, P())},
        "in_shardings",
    ),
    "in NamedSharding, out P": (
        {"in_shardings": NamedSharding(MESH8, P()), "out_shardings": P("x")},
        "out_shardings",
    ),
    "in (P, NamedSharding)": (
        {"in_shardings": (P("x"), NamedSharding(MESH8, P()))},
        "in_shardings",
    ),
}

STAGES: dict[str, Callable[[Any, Any, Any], Any]] = {
    "call": lambda f, x, y: f(x, y),
    "lower": lambda f, x, y: f.lower(x, y),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("case", sorted(MIXED))
def test_bare_spec_beside_a_named_sharding_needs_a_mesh(door, case, stage) -> None:
    options, name = MIXED[case]
    x = np.arange(8.0, dtype=np.float32)
    run = STAGES[stage]
    err = raises_as_jax(
        lambda: run(door(_first, **options), x, x),
        lambda: run(jax.jit(_first, **options), x, x),
        RuntimeError,
        NO_MESH.format(name),
    )
    assert "does not lend its mesh" in str(err), err


def test_constraint_bare_spec_beside_a_named_sharding_needs_a_mesh() -> None:
    x = np.arange(8.0, dtype=np.float32)
    specs = (P("x"), NamedSharding(MESH8, P()))
    err = raises_as_jax(
        lambda: partitioner.with_sharding_constraint((x, x), specs),
        lambda: jax.lax.with_sharding_constraint((x, x), specs),
        RuntimeError,
        NO_MESH.format("shardings"),
    )
    assert "does not lend its mesh" in str(err), err
