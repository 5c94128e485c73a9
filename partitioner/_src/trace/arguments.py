"""Call-time binding every front door shares: statics apart, key paths, rebuilding.

Why one module: ``pjit`` and ``pmap`` (and the dispatcher behind both) read a
call's arguments the same way: which positions and names are static, how the
dynamic ones flatten, which path names a leaf in an error, and how a traced
function gets its arguments back with the statics re-inserted. Written once,
the fast path keys on exactly the split the planner traced with, and an error
found while running names the same path the planner would. The
:class:`Binding` each call reads is built and checked once, when the function
is wrapped (``argnums.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from jax.tree_util import (
    KeyPath,
    PyTreeDef,
    SequenceKey,
    keystr,
    tree_flatten,
    tree_flatten_with_path,
    tree_unflatten,
)

Statics = tuple[tuple[int | str, Any], ...]  # (position or keyword, value), in order


# --- binding a call ---


@dataclass(frozen=True)
class Binding:
    """How a front door reads its calls' arguments: parsed once, when the function is wrapped.

    Attributes:
        api: ``"pjit f"``-style prefix for messages (the front door and the function).
        signature: the function's signature (None where it has none): keyword
            arguments naming positional parameters are moved into place with it.
        static_argnums / static_argnames: non-negative positions (applied to
            arguments passed positionally) and names (to arguments passed by
            keyword) traced as Python values, as jax.jit applies them.
        donate_argnums / donate_argnames: the same for donated arguments.
        static_hint: how a message tells the user to mark an argument static.
        bind_keywords: keyword arguments that name positional parameters move into
            place (the in-spec tree, a prefix of the positional arguments, then
            covers them); otherwise they stay keyword arguments, as jax.jit keeps
            them when no ``in_shardings`` are given.
    """

    api: str
    signature: inspect.Signature | None = None
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    donate_argnames: tuple[str, ...] = ()
    static_hint: str = "static_argnums/static_argnames"
    bind_keywords: bool = False

    def positional_names(self) -> list[str]:
        """The names of the positional parameters, in order (empty without a signature);
        arguments past them are named ``args[i]`` of the ``*args`` parameter, as jax does."""
        params = self.signature.parameters.values() if self.signature is not None else ()
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def varargs_name(self) -> str:
        """The ``*args`` parameter's name (``args`` where there is none)."""
        params = self.signature.parameters.values() if self.signature is not None else ()
        return next((p.name for p in params if p.kind is p.VAR_POSITIONAL), "args")

    def static_positions(self, n: int) -> tuple[int, ...]:
        """The static positions of a call passing ``n`` arguments positionally: a
        negative one counts from the end of them (as jax.jit's C++ dispatcher reads it)."""
        return tuple(i + n if i < 0 else i for i in self.static_argnums)

    def donated_positions(self, n: int) -> tuple[int, ...]:
        """Positions of the donated arguments of a call passing ``n`` positionally."""
        return tuple(i for i in self.donate_argnums if 0 <= i < n)


@dataclass(frozen=True)
class BoundCall:
    """One call's arguments, bound: statics apart, dynamic leaves flat with their paths.

    Attributes:
        args / kwargs: the call as the function sees it (keyword arguments that
            name positional parameters moved into ``args``).
        statics: ``(position or keyword, value)`` of each static argument, in order.
        dynamic_args / dynamic_kwargs: what is left, the values being traced.
        flat: the dynamic leaves with the paths the user wrote.
        donated: one flag per flat leaf: its argument is donated.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    statics: Statics
    dynamic_args: tuple[Any, ...]
    dynamic_kwargs: dict[str, Any]
    flat: FlatArguments
    donated: tuple[bool, ...]

    def rebuild(self, leaves: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Flat dynamic leaves -> ``(args, kwargs)`` for the function, statics re-inserted."""
        d_args, d_kwargs = tree_unflatten(self.flat.in_tree, list(leaves))
        full, kw = list(d_args), dict(d_kwargs)
        for i, v in self.statics:
            if isinstance(i, int):
                full.insert(i, v)
            else:
                kw[i] = v
        return tuple(full), kw

    def trace_key(self) -> tuple[Any, ...]:
        """The call's structure and static values, as part of a trace cache key."""
        return (self.flat.in_tree, statics_key(self.statics))


def bind_call(binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BoundCall:
    """Bind a call's arguments: the one place a front door's call is split and flattened.

    Keyword arguments naming positional parameters move into place; then, as
    jax.jit picks them, static and donated positions apply to the arguments
    passed positionally and names to those passed by keyword; the dynamic
    arguments flatten with the paths the user wrote.

    Raises:
        TypeError: the call does not fit the signature, or a static value is not hashable.
    """
    n_raw = len(args)
    if binding.bind_keywords:
        args, kwargs = _bind_signature(binding.signature, args, kwargs)
    names = binding.positional_names()
    static, static_kw = _select(
        binding.static_positions(n_raw), binding.static_argnames, names, n_raw, args, kwargs
    )
    donate, donate_kw = _select(
        binding.donate_argnums, binding.donate_argnames, names, n_raw, args, kwargs
    )
    split = _split(args, kwargs, static, static_kw)
    _check_hashable(split.statics, binding.api)
    flat = _flatten(
        split, [i for i in range(len(args)) if i not in static], names, binding.varargs_name()
    )
    donated = tuple(
        path[0].idx in donate if i < flat.positional else path[0].key in donate_kw  # type: ignore[attr-defined]
        for i, path in enumerate(flat.paths)
    )
    return BoundCall(
        args, kwargs, split.statics, split.dynamic_args, split.dynamic_kwargs, flat, donated
    )


def _bind_signature(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Move keyword arguments that name positional parameters into ``args``."""
    if not kwargs or signature is None:
        return args, kwargs
    bound = signature.bind(*args, **kwargs)
    return tuple(bound.args), dict(bound.kwargs)


def split_call(binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SplitCall:
    """A raw call's statics and dynamic arguments, without binding the signature (fast)."""
    return _split(args, kwargs, binding.static_positions(len(args)), binding.static_argnames)


def call_leaves(
    binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Statics, list[Any], PyTreeDef]:
    """A raw call's statics, flat dynamic leaves and their tree: the dispatcher's cache key.

    No signature binding and no paths, so it costs little; it only has to tell one
    call form from another, as jaxlib's C++ dispatcher does.
    """
    split = split_call(binding, args, kwargs)
    leaves, tree = tree_flatten((split.dynamic_args, split.dynamic_kwargs))
    return split.statics, leaves, tree


def flat_arguments(
    binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> FlatArguments:
    """A raw call's dynamic leaves with their paths (what a message found while running names)."""
    statics = binding.static_positions(len(args))
    split = _split(args, kwargs, statics, binding.static_argnames)
    dyn_idx = [i for i in range(len(args)) if i not in statics]
    return _flatten(split, dyn_idx, binding.positional_names(), binding.varargs_name())


def _select(
    nums: tuple[int, ...],
    names: tuple[str, ...],
    params: list[str],
    n_raw: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[set[int], set[str]]:
    """Which bound positions and keywords ``nums``/``names`` pick: positions among the
    ``n_raw`` arguments passed positionally, names among those passed by keyword
    (bound to positions ``n_raw..`` or left in ``kwargs``)."""
    picked = {i for i in nums if 0 <= i < n_raw}
    picked |= {i for i in range(n_raw, len(args)) if i < len(params) and params[i] in names}
    return picked, {k for k in kwargs if k in names}


@dataclass(frozen=True)
class SplitCall:
    """A call's arguments with the static ones taken out."""

    statics: Statics
    dynamic_args: tuple[Any, ...]
    dynamic_kwargs: dict[str, Any]


def _split(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    static_positions: Collection[int],
    static_names: Collection[str],
) -> SplitCall:
    statics: list[tuple[int | str, Any]] = [
        (i, args[i]) for i in sorted(static_positions) if i < len(args)
    ]
    statics += sorted((k, v) for k, v in kwargs.items() if k in static_names)
    return SplitCall(
        statics=tuple(statics),
        dynamic_args=tuple(a for i, a in enumerate(args) if i not in static_positions),
        dynamic_kwargs={k: v for k, v in kwargs.items() if k not in static_names},
    )


def _check_hashable(statics: Statics, api: str) -> None:
    """Raise jax's ValueError naming the first static argument that cannot be a cache key."""
    for where, value in statics:
        if not isinstance(value, Hashable):
            raise ValueError(
                "Non-hashable static arguments are not supported, as this can lead to "
                f"unexpected cache-misses. Static argument (index {where}) of type "
                f"{type(value)} for function {api.partition(' ')[2]} is non-hashable.\n"
                f"{api}: static argument {where!r} of type {type(value).__name__} is not "
                "hashable; static arguments must be hashable (e.g. a tuple instead of a list)."
            )


class HashableStatic:
    """A static value in a cache key: equal values of the same type match (as jax.jit's keys:
    ``1``, ``True`` and ``1.0`` are three signatures)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashableStatic):
            return NotImplemented
        if type(self.value) is not type(other.value):
            return False
        try:
            return bool(self.value == other.value)
        except Exception as e:
            raise ValueError(
                "static arguments should be comparable using __eq__. The following error was "
                f"raised when comparing two objects of types {type(self.value)} and "
                f"{type(other.value)}. The error was:\n{type(e).__name__}: {e}"
            ) from e


def statics_key(statics: Statics) -> tuple[tuple[int | str, HashableStatic], ...]:
    """The static values as part of a trace cache key."""
    return tuple((k, HashableStatic(v)) for k, v in statics)


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
    # The function's positional parameter names (empty where it has no signature),
    # and its ``*args`` parameter's name (what names arguments passed past them).
    parameters: tuple[str, ...] = ()
    varargs: str = "args"

    def where(self, i: int, api: str) -> str:
        """``"jit f: argument params['w']"``: leaf ``i`` named for a message."""
        return f"{api}: {self.name(i)}"

    def name(self, i: int) -> str:
        """``"argument params['w']"``: leaf ``i`` named for a message."""
        return f"argument {self.label(i)}"

    def label(self, i: int) -> str:
        """``"params['w']"``: leaf ``i`` as jax names it, by the parameter it was passed
        as (``x[0]``, ``x['b']``; a keyword by its key; ``args[2]`` past the named
        parameters)."""
        head, rest = self.paths[i][0], keystr(tuple(self.paths[i][1:]))
        if i < self.positional:
            index = head.idx  # type: ignore[attr-defined]
            n = len(self.parameters)
            root = self.parameters[index] if index < n else f"{self.varargs}[{index - n}]"
            return f"{root}{rest}"
        return f"{head.key}{rest}"  # type: ignore[attr-defined]


def _flatten(
    split: SplitCall, dyn_idx: Sequence[int], parameters: Sequence[str] = (), varargs: str = "args"
) -> FlatArguments:
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
    return FlatArguments(
        [leaf for _, leaf in with_paths], in_tree, paths, n_pos, tuple(parameters), varargs
    )
