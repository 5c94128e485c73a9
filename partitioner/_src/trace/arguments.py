"""The argument layer both front doors share: argnums, statics, key paths, rebuilding.

Why one module: ``pjit`` and ``pmap`` (and the dispatcher behind both) read a
call's arguments the same way: which positions and names are static, how the
dynamic ones flatten, which path names a leaf in an error, and how a traced
function gets its arguments back with the statics re-inserted. Written once,
the fast path keys on exactly the split the planner traced with, and an error
found while running names the same path the planner would.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.tree_util import (
    KeyPath,
    PyTreeDef,
    SequenceKey,
    keystr,
    tree_flatten,
    tree_flatten_with_path,
    tree_unflatten,
)

from .. import jax_private as jp

Statics = tuple[tuple[int | str, Any], ...]  # (position or keyword, value), in order


# --- argnums ---


def index_tuple(
    value: int | Sequence[int] | None, what: str, api: str, *, negative: bool = True
) -> tuple[int, ...]:
    """``static_argnums``-style input as a tuple of ints (``None``: none).

    Raises:
        TypeError: an entry is not an int (bools are not ints here, as in jax).
        ValueError: a negative entry where ``negative`` is False.
    """
    if value is None:
        return ()
    nums = (value,) if isinstance(value, (int, np.integer)) else value
    try:
        nums = tuple(nums)
    except TypeError:
        raise TypeError(
            f"{api} {what} must be an int or a sequence of ints, got {value!r}"
        ) from None
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in nums):
        raise TypeError(f"{api} {what} must be an int or a sequence of ints, got {value!r}")
    if not negative and any(i < 0 for i in nums):
        raise ValueError(f"{api} {what} must be non-negative ints, got {value!r}")
    return tuple(int(i) for i in nums)


def name_tuple(value: str | Sequence[str] | None, what: str, api: str) -> tuple[str, ...]:
    """``static_argnames``-style input as a tuple of names (``None``: none).

    Raises:
        TypeError: an entry is not a str.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    names = tuple(value)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{api} {what} must be a str or a sequence of str, got {value!r}")
    return names


# --- statics ---


@dataclass(frozen=True)
class SplitArguments:
    """A call's arguments with the static ones taken out."""

    statics: Statics
    dynamic_args: tuple[Any, ...]
    dynamic_kwargs: dict[str, Any]


def split_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    static_positions: Collection[int],
    static_names: Collection[str],
) -> SplitArguments:
    """Separate static from dynamic arguments (positions must be non-negative)."""
    statics: list[tuple[int | str, Any]] = [
        (i, args[i]) for i in sorted(static_positions) if i < len(args)
    ]
    statics += sorted((k, v) for k, v in kwargs.items() if k in static_names)
    return SplitArguments(
        statics=tuple(statics),
        dynamic_args=tuple(a for i, a in enumerate(args) if i not in static_positions),
        dynamic_kwargs={k: v for k, v in kwargs.items() if k not in static_names},
    )


def check_hashable(statics: Statics, api: str) -> None:
    """Raise a TypeError naming the first static argument that cannot be a cache key.

    Args:
        api: the API and function, as messages start (``"pjit f"``).
    """
    for where, value in statics:
        if not isinstance(value, Hashable):
            raise TypeError(
                f"{api}: static argument {where!r} of type {type(value).__name__} is not "
                "hashable; static arguments must be hashable (e.g. a tuple instead of a list)."
            )


class HashableStatic:
    """A static value in a trace cache key: equal values hash equal (jax arrays included)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashableStatic):
            return NotImplemented
        try:
            return bool(type(self.value) is type(other.value) and self.value == other.value)
        except Exception:
            return self.value is other.value


def statics_key(statics: Statics) -> tuple[tuple[int | str, HashableStatic], ...]:
    """The static values as part of a trace cache key."""
    return tuple((k, HashableStatic(v)) for k, v in statics)


def rebuilder(
    in_tree: PyTreeDef, statics: Statics
) -> Callable[[list[Any]], tuple[tuple[Any, ...], dict[str, Any]]]:
    """Flat dynamic leaves -> ``(args, kwargs)`` for the user's function, statics re-inserted."""

    def rebuild(leaves: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        d_args, d_kwargs = tree_unflatten(in_tree, leaves)
        full = list(d_args)
        kw = dict(d_kwargs)
        for i, v in statics:
            if isinstance(i, int):
                full.insert(i, v)
            else:
                kw[i] = v
        return tuple(full), kw

    return rebuild


# --- flattening with the paths users wrote ---


@dataclass(frozen=True)
class FlatArguments:
    """The dynamic arguments flattened, with each leaf's path as the user wrote it.

    Positional paths name the *original* position (static arguments counted),
    keyword paths the keyword; ``positional`` leaves come first.
    """

    leaves: list[Any]
    in_tree: PyTreeDef  # of (dynamic positional args, dynamic kwargs)
    paths: list[KeyPath]
    positional: int

    def where(self, i: int, api: str) -> str:
        """``"pjit f: argument args[0]['w']"``: leaf ``i`` named for a message."""
        return describe(api, self.paths[i])


def describe(api: str, path: KeyPath) -> str:
    """How a message names the argument at ``path`` (``args[0]['w']``, ``args['x']``)."""
    return f"{api}: argument args{keystr(path)}"


def flatten_dynamic(split: SplitArguments, dyn_idx: Sequence[int]) -> FlatArguments:
    """Flatten ``split``'s dynamic arguments with key paths (see :class:`FlatArguments`).

    Args:
        dyn_idx: the original position of each dynamic positional argument.
    """
    with_paths, in_tree = tree_flatten_with_path((split.dynamic_args, split.dynamic_kwargs))
    n_pos = len(tree_flatten(split.dynamic_args)[0])
    paths: list[KeyPath] = [
        (SequenceKey(dyn_idx[path[1].idx]), *path[2:])  # type: ignore[attr-defined]
        if i < n_pos
        else path[1:]
        for i, (path, _) in enumerate(with_paths)
    ]
    return FlatArguments([leaf for _, leaf in with_paths], in_tree, paths, n_pos)


def abstractify(leaf: Any, where: str, static_hint: str, *, typed: bool = False) -> Any:
    """The abstract value of an argument leaf (with its sharding when ``typed``).

    ``typed`` is set for calls over a mesh with Explicit axes, where a value's
    sharding is part of its type (NOTE [explicit axes] in ``spec/mesh_env.py``).

    Raises:
        TypeError: not a JAX type, naming ``where`` (API and argument path) and how
            to mark it static.
    """
    try:
        return jp.typed_abstractify(leaf) if typed else jp.shaped_abstractify(leaf)
    except TypeError:
        raise TypeError(
            f"{where} of type {type(leaf).__name__} is not a valid JAX type (arrays, numpy "
            f"arrays, Python scalars or jax.ShapeDtypeStruct). Mark it static with "
            f"{static_hint} if it is configuration."
        ) from None


class CallArguments:
    """How the dispatcher reads a front door's raw calls (no signature binding: fast).

    Args:
        api: ``"pjit f"``-style prefix for messages.
        static_argnums / static_argnames: non-negative positions and names that
            are static in a raw call (the front door completes one from the other).
    """

    def __init__(
        self, api: str, static_argnums: Collection[int], static_argnames: Collection[str]
    ) -> None:
        self.api = api
        self.static_argnums = frozenset(static_argnums)
        self.static_argnames = frozenset(static_argnames)

    def split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SplitArguments:
        return split_arguments(args, kwargs, self.static_argnums, self.static_argnames)

    def flat(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlatArguments:
        """The raw call flattened with paths (what error messages name)."""
        dyn_idx = [i for i in range(len(args)) if i not in self.static_argnums]
        return flatten_dynamic(self.split(args, kwargs), dyn_idx)
