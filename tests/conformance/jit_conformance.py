"""What the ports of jax.jit's own tests share: the two front doors and side-by-side checks.

Every check runs ``jax.jit`` (the reference, installed jax 0.10.2) and one of
partitioner's front doors on the same inputs and compares what they did:
values, shardings (type, layout, and where jax's own test asks, equality),
committedness, which inputs were consumed by donation, the warnings and the
errors. Nothing expected is written down here: an error's *key sentence* is a
sentence the test author read in jax's message, and :func:`raises_like` first
checks that jax's message really contains it before asking ours to.

The ``door`` fixture (``conftest.py`` beside this file, over :data:`DOORS`) runs a case
through ``partitioner.jit`` and through ``partitioner.pjit`` spelled as today's code
spells it (``in_shardings=`` / ``out_shardings=``); where shardings are omitted or given as ``Sharding``
objects, jax's ``jax.jit`` and its current ``pjit`` are one function, so
``jax.jit`` is the reference for both doors.
"""

from __future__ import annotations

import builtins
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.errors
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner

DOORS: dict[str, Callable[..., Any]] = {"jit": partitioner.jit, "pjit": partitioner.pjit}

# jax's key sentence for a donation XLA could not use (jax/_src/interpreters/pxla.py).
UNUSABLE_DONATION = "Some donated buffers were not usable"


def door_name(door: Callable[..., Any]) -> str:
    return "jit" if door is partitioner.jit else "pjit"


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """A mesh of the first devices, Auto axes (``jax.make_mesh`` defaults to Explicit)."""
    n = math.prod(shape)
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def sharded(shape: tuple[int, ...], mesh: Mesh, spec: P, dtype: Any = np.float32) -> jax.Array:
    """``arange`` data committed to ``NamedSharding(mesh, spec)``."""
    data = np.arange(math.prod(shape), dtype=dtype).reshape(shape)
    return jax.device_put(data, NamedSharding(mesh, spec))


def same(ours: Any, theirs: Any, *, equal_shardings: bool = False) -> None:
    """Values, sharding type and layout, committedness as jax.jit's (leaf by leaf).

    Args:
        equal_shardings: also ``ours.sharding == theirs.sharding`` (where jax's
            test compares sharding objects, e.g. the spec as jax spells it).
    """
    ours_leaves, our_tree = jax.tree.flatten(ours)
    their_leaves, their_tree = jax.tree.flatten(theirs)
    assert our_tree == their_tree, (our_tree, their_tree)
    for a, b in zip(ours_leaves, their_leaves, strict=True):
        if not isinstance(b, jax.Array):
            assert type(a) is type(b) and a == b, (a, b)
            continue
        assert isinstance(a, jax.Array), type(a)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert type(a.sharding) is type(b.sharding), (a.sharding, b.sharding)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
        assert a.committed == b.committed, (a.committed, b.committed)
        if equal_shardings:
            assert a.sharding == b.sharding, (a.sharding, b.sharding)


def both(door: Callable[..., Any], fun: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """``door(fun, **options)(*args)`` and ``jax.jit``'s, compared; ours is returned."""
    ours = door(fun, **options)(*args)
    same(ours, jax.jit(fun, **options)(*args))
    return ours


# --- donation ---


def donation_warnings(call: Callable[[], Any]) -> tuple[Any, list[warnings.WarningMessage]]:
    """``call()``'s result and the donation warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
        jax.block_until_ready(out)
    return out, [w for w in caught if "donat" in str(w.message)]


def deleted(tree: Any) -> list[bool]:
    return [leaf.is_deleted() for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]


def same_donation(
    door: Callable[..., Any],
    fun: Callable[..., Any],
    make_args: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    **options: Any,
) -> Any:
    """One call through ``door`` and through ``jax.jit``, each on fresh inputs.

    The same results, the same inputs consumed, and a donation warning exactly
    when jax warns: jax's category, jax's key sentence, and every buffer jax lists.

    Args:
        make_args: fresh ``(args, kwargs)`` (donated inputs are consumed).
    """
    # A fresh function object for jax too: jax caches lowerings per function, and
    # a parametrized ``fun`` shared by both doors would be lowered (and warn) once.
    fresh = functools.wraps(fun)(lambda *a, **k: fun(*a, **k))
    their_args, their_kwargs = make_args()
    theirs, their_warnings = donation_warnings(
        lambda: jax.jit(fresh, **options)(*their_args, **their_kwargs)
    )
    our_args, our_kwargs = make_args()
    # The warning comes with lowering, as in jax: start from a cold cache so it does
    # not depend on which test lowered the same program before.
    partitioner.clear_caches()
    ours, our_warnings = donation_warnings(lambda: door(fun, **options)(*our_args, **our_kwargs))
    same(ours, theirs)
    assert deleted((our_args, our_kwargs)) == deleted((their_args, their_kwargs)), (
        "consumed inputs differ from jax.jit's",
        deleted((our_args, our_kwargs)),
        deleted((their_args, their_kwargs)),
    )
    same_donation_warnings(our_warnings, their_warnings)
    return ours


def same_donation_warnings(
    ours: list[warnings.WarningMessage], theirs: list[warnings.WarningMessage]
) -> None:
    """Ours warn exactly when jax's do, in jax's category and wording (the buffers listed)."""
    assert bool(ours) == bool(theirs), (
        [str(w.message) for w in ours],
        [str(w.message) for w in theirs],
    )
    for mine, jaxs in zip(ours, theirs):
        assert issubclass(mine.category, jaxs.category), (mine.category, jaxs.category)
        jax_text, our_text = str(jaxs.message), str(mine.message)
        assert UNUSABLE_DONATION in jax_text and UNUSABLE_DONATION in our_text, our_text
        listed = jax_text.split(":", 1)[1].split(".\n", 1)[0]
        for buffer in listed.split(","):
            assert buffer.strip() in our_text, (buffer, our_text)


# --- errors ---


def public_type(exc: BaseException) -> type[BaseException]:
    """The type a user catches: jax's class if jax exports it, else its builtin base."""
    exported = {v for v in vars(jax.errors).values() if isinstance(v, type)}
    for t in type(exc).__mro__:
        if t in exported or getattr(builtins, t.__name__, None) is t:
            return t
    return Exception


Key = str | re.Pattern[str]


def _found(key: Key, text: str) -> bool:
    if isinstance(key, re.Pattern):
        return key.search(text) is not None
    return key in text


def raises_like(
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    *keys: Key,
    door: Callable[..., Any] | None = None,
) -> tuple[BaseException, BaseException]:
    """jax.jit's error and ours: jax's public type and each of jax's key sentences.

    Each key (a literal sentence, or a compiled pattern) is first checked in
    jax's own message, so a key is never an invented expectation. A ``jit``
    user's message never names the 2022 spellings (``*_axis_resources``).

    Returns:
        (our exception, jax's exception).
    """
    with pytest.raises(Exception) as jax_info:
        jax.block_until_ready(theirs())
    jax_exc = jax_info.value
    for key in keys:
        assert _found(key, str(jax_exc)), f"not jax's wording: {key!r} in {str(jax_exc)!r}"
    with pytest.raises(public_type(jax_exc)) as our_info:
        jax.block_until_ready(ours())
    text = str(our_info.value)
    for key in keys:
        assert _found(key, text), f"jax's {key!r} missing from ours: {text!r}"
    if door is partitioner.jit:
        assert "axis_resources" not in text, text
    return our_info.value, jax_exc


def same_outcome(
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    *keys: Key,
    door: Callable[..., Any] | None = None,
) -> None:
    """jax's outcome, whichever it is: its result (shardings equal), or its error
    (:func:`raises_like`, with those of ``keys`` found in jax's message)."""
    try:
        expected = jax.block_until_ready(theirs())
    except Exception as e:
        raises_like(ours, theirs, *(k for k in keys if _found(k, str(e))), door=door)
        return
    same(ours(), expected, equal_shardings=True)


def agree_at_wrap(door: Callable[..., Any], fun: Callable[..., Any], **options: Any) -> None:
    """Wrapping is accepted by ours exactly when jax.jit accepts it (else jax's error type)."""
    try:
        jax.jit(fun, **options)
    except Exception as e:  # jax refused: ours refuses with the same public type
        with pytest.raises(public_type(e)):
            door(fun, **options)
        return
    door(fun, **options)


def module_arguments(lowered: Any) -> int:
    """How many arguments the lowered module's ``main`` takes."""
    head = re.search(r"func\.func public @main\((.*?)\)\s*(->|\{)", lowered.as_text(), re.S)
    assert head is not None, lowered.as_text()[:500]
    return len(re.findall(r"%arg\d+:", head.group(1)))


def executable_parameters(compiled: Any) -> int:
    """How many parameters the compiled XLA program takes."""
    (module,) = compiled.runtime_executable().hlo_modules()
    entry = module.to_string().split("\nENTRY ", 1)[1].split("\n}", 1)[0]
    return len(set(re.findall(r"\bparameter\((\d+)\)", entry)))


def leaves_named(paths: Iterable[Any]) -> list[str]:
    return [jax.tree_util.keystr(p) for p in paths]
