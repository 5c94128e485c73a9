"""The front doors' signatures: what ``inspect``, ``help()`` and Python's errors show.

``jit`` and ``pjit`` take their shared options as ``**options`` typed by one record
(``planner/jit_info.py``), yet a user sees every option as if each door's ``def``
spelled it out. The ``_spelled_out`` functions below are those ``def``s as the doors
read before the record: the reference for names, kinds, defaults, annotations and
Python's own sentences for bad calls.
"""

from __future__ import annotations

import inspect
import pydoc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import pytest

import partitioner
from partitioner._src.planner.jit_info import JitOptions, SharedOptions
from partitioner._src.sharding.tree import UNSPECIFIED


def _jit_spelled_out(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    in_shardings: Any = UNSPECIFIED,
    out_shardings: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
    auto_memory_limit: int | None = None,
) -> Any:
    """``jit``'s signature as its ``def`` spelled it before the options record."""


def _pjit_spelled_out(
    fun: Callable[..., Any],
    in_axis_resources: Any = UNSPECIFIED,
    out_axis_resources: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    *,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    in_shardings: Any = UNSPECIFIED,
    out_shardings: Any = UNSPECIFIED,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
    auto_memory_limit: int | None = None,
) -> PjitWrapped:  # noqa: F821  (a string: compared, never evaluated)
    """``pjit``'s signature as its ``def`` spelled it (its argnames typed as jit's)."""


DOORS = [
    pytest.param(partitioner.jit, _jit_spelled_out, id="jit"),
    pytest.param(partitioner.pjit, _pjit_spelled_out, id="pjit"),
]


def _rows(signature: inspect.Signature) -> list[tuple[str, Any, Any, Any]]:
    """(name, kind, default, annotation) a parameter: keyword-only ones sorted by name."""
    rows = [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()]
    keyword_only = [row for row in rows if row[1] is inspect.Parameter.KEYWORD_ONLY]
    return [row for row in rows if row not in keyword_only] + sorted(keyword_only)


@pytest.mark.parametrize("door, spelled_out", DOORS)
def test_signature_shows_every_option_as_spelled_out(door: Any, spelled_out: Any) -> None:
    ours, reference = inspect.signature(door), inspect.signature(spelled_out)
    assert _rows(ours) == _rows(reference)
    assert ours == reference
    assert ours.return_annotation == reference.return_annotation


@pytest.mark.parametrize("door, spelled_out", DOORS)
def test_help_shows_every_option_with_its_default(door: Any, spelled_out: Any) -> None:
    text = pydoc.render_doc(door, renderer=pydoc.plaintext)
    for p in inspect.signature(spelled_out).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert f"{p.name}: {p.annotation!r} = {p.default!r}" in text, p.name
    assert "**options" not in text


def test_jit_takes_every_jax_jit_parameter_the_way_jax_does() -> None:
    """Same names and kinds as ``jax.jit``; the same defaults but the *omitted* sentinels."""
    ours = inspect.signature(partitioner.jit).parameters
    for name, theirs in inspect.signature(jax.jit).parameters.items():
        assert name in ours, name
        assert ours[name].kind is theirs.kind, name
        if name not in ("fun", "in_shardings", "out_shardings"):
            assert ours[name].default == theirs.default, name
    assert ours["fun"].default is None
    assert ours["in_shardings"].default is ours["out_shardings"].default is UNSPECIFIED


def _message(call: Callable[[], Any]) -> str:
    with pytest.raises(TypeError) as info:
        call()
    return str(info.value)


SPELLED_OUT = {partitioner.jit: _jit_spelled_out, partitioner.pjit: _pjit_spelled_out}
BAD_CALLS = [
    ("a misspelled option", "both", (abs,), {"in_shardingz": None}),
    ("an option of neither door", "both", (abs,), {"axis_name": "i"}),
    ("too many positional arguments", "both", (abs, None, None, None, None, None), {}),
    ("the positional-only function by keyword", "jit", (), {"fun": abs}),
    ("a 2022 spec argument in jit", "jit", (abs,), {"in_axis_resources": None}),
    ("an argument given twice", "pjit", (abs, None), {"in_axis_resources": None}),
]


@pytest.mark.parametrize(
    "door, args, kwargs",
    [
        pytest.param(door, args, kwargs, id=f"{what}-{door.__name__}")
        for what, doors, args, kwargs in BAD_CALLS
        for door in SPELLED_OUT
        if doors in ("both", door.__name__)
    ],
)
def test_a_bad_call_gets_pythons_own_sentence(
    door: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    spelled_out = SPELLED_OUT[door]
    expected = _message(lambda: spelled_out(*args, **kwargs))
    assert _message(lambda: door(*args, **kwargs)) == expected.replace(
        spelled_out.__qualname__, door.__name__
    )


def test_the_doors_spell_no_shared_option_themselves() -> None:
    """Each shared option is written once, in the record; the doors' own ``def``s take
    them as ``**options`` (PEP 692), so adding one is a line in the record."""
    for door in (partitioner.jit, partitioner.pjit):
        assert door.__code__.co_kwonlyargcount == 0, door.__name__
        assert door.__code__.co_flags & inspect.CO_VARKEYWORDS, door.__name__
    assert set(JitOptions.__annotations__) - set(SharedOptions.__annotations__) == {
        "static_argnums",
        "donate_argnums",
    }
    pjit_keywords = {
        p.name
        for p in inspect.signature(partitioner.pjit).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert pjit_keywords == set(SharedOptions.__annotations__)
