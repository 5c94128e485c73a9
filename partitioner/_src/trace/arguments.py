"""The argument layer both front doors share: argnums, statics, key paths, rebuilding.

Why one module: ``pjit`` and ``pmap`` (and the dispatcher behind both) read a
call's arguments the same way: which positions and names are static, how the
dynamic ones flatten, which path names a leaf in an error, and how a traced
function gets its arguments back with the statics re-inserted. Written once,
the fast path keys on exactly the split the planner traced with, and an error
found while running names the same path the planner would.
"""

from __future__ import annotations

import inspect
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
    """``static_argnums``-style input as a tuple of ints (``None``: none; see
    :func:`optional_index_tuple` to keep None apart).

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


def optional_index_tuple(value: Any, what: str, api: str) -> tuple[int, ...] | None:
    """:func:`index_tuple`, but ``None`` stays None (jax infers it from the other)."""
    return None if value is None else index_tuple(value, what, api)


def optional_name_tuple(value: Any, what: str, api: str) -> tuple[str, ...] | None:
    """:func:`name_tuple`, but ``None`` stays None (jax infers it from the other)."""
    return None if value is None else name_tuple(value, what, api)


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


def infer_argnums_and_argnames(
    signature: inspect.Signature | None,
    argnums: tuple[int, ...] | None,
    argnames: tuple[str, ...] | None,
    api: str,
    kind: str,
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """jax.jit's rule: given only one of argnums / argnames, infer the other from the
    signature; given both, use them as they are (they may disagree).

    Positions then apply to arguments passed positionally and names to arguments
    passed by keyword, as in jax (and its C++ dispatcher). Negative positions count
    from the end of the positional parameters.

    Args:
        kind: ``"static"`` or ``"donate"``, for messages.

    Raises:
        ValueError: a position past the positional parameters (when the function
            has no ``*args``), a name it does not take (no ``**kwargs``), or a
            negative position with ``*args``.
    """
    params = list(signature.parameters.values()) if signature is not None else []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    if signature is not None:
        what = f"{kind}_argnums"
        for i in argnums or ():
            if (i < 0 and variadic) or (
                not variadic and not -len(positional) <= i < len(positional)
            ):
                raise ValueError(
                    f"{api}: {what}={argnums}, but the function only accepts "
                    f"{len(positional)} positional argument(s)."
                )
        named = {p.name for p in params if p.kind is not p.POSITIONAL_ONLY}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            unknown = set(argnames or ()) - named
            if unknown:
                raise ValueError(
                    f"{api}: invalid argnames {sorted(unknown)} in {kind}_argnames; the "
                    "function does not take these arguments."
                )
    nums = tuple(sorted({i + len(positional) if i < 0 else i for i in argnums or ()}))
    names = tuple(argnames or ())
    if argnames is None and argnums is not None:
        names = tuple(
            positional[i].name
            for i in nums
            if i < len(positional) and positional[i].kind is positional[i].POSITIONAL_OR_KEYWORD
        )
    elif argnums is None and argnames is not None:
        nums = tuple(i for i, p in enumerate(positional) if p.name in names)
    return nums, names


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
        return f"{api}: {self.name(i)}"

    def name(self, i: int) -> str:
        """``"argument args[0]['w']"`` (``args['x']`` for a keyword argument)."""
        return f"argument args{keystr(self.paths[i])}"


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
    sharding is part of its type (NOTE [explicit axes] in ``sharding/mesh_env.py``).

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
