"""Wrap-time argnums: statics and donation read and checked once, when a function is wrapped.

Why apart from ``arguments.py``: these run once per wrapped function and raise
jax.jit's messages about the *options* (argnums that are not ints, names the
function does not take); ``arguments.py`` binds each *call* by the
:class:`~.arguments.Binding` built here. Positions stay as the user gave them;
a negative static position is resolved per call (``Binding.static_positions``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .arguments import Binding


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
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """jax.jit's rule: given only one of argnums / argnames, infer the other from the
    signature; given both, use them as they are (they may disagree).

    Positions then apply to arguments passed positionally and names to arguments
    passed by keyword, as in jax (and its C++ dispatcher). Positions stay as given:
    a negative static position counts from the end of the arguments a call passes
    (:func:`bind_call`), a negative donated one matches no argument (as jax.jit's).
    """
    params = list(signature.parameters.values()) if signature is not None else []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    nums = tuple(dict.fromkeys(argnums or ()))
    names = tuple(argnames or ())
    if argnames is None and argnums is not None:
        names = tuple(
            positional[i].name
            for i in nums
            if 0 <= i < len(positional)
            and positional[i].kind is positional[i].POSITIONAL_OR_KEYWORD
        )
    elif argnums is None and argnames is not None:
        nums = tuple(i for i, p in enumerate(positional) if p.name in names)
    return nums, names


def validate_argnums(
    signature: inspect.Signature | None, argnums: tuple[int, ...] | None, what: str, api: str
) -> None:
    """As jax.jit: every position within the positional parameters (any with ``*args``).

    Raises:
        ValueError: jax's message, then which function.
    """
    if signature is None or not argnums:
        return
    params = signature.parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if -min(argnums) > n or max(argnums) >= n:
        raise ValueError(
            f"Jitted function has {what}={argnums}, but only accepts {n} positional "
            f"arguments. ({api})"
        )


def validate_argnames(
    signature: inspect.Signature | None, argnames: tuple[str, ...] | None, what: str, api: str
) -> None:
    """As jax.jit: every name a parameter that can be passed by keyword.

    Raises:
        ValueError: jax's message (positional-only parameters; names the function
            does not take, unless it takes ``**kwargs``), then which function.
    """
    if signature is None or not argnames:
        return
    params = signature.parameters.values()
    positional_only = {p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
    if invalid := positional_only & set(argnames):
        raise ValueError(
            f"Jitted function has invalid argnames {invalid} in {what}. These are "
            f"positional-only ({api})"
        )
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if invalid := set(argnames) - keyword:
        raise ValueError(
            f"Jitted function has invalid argnames {invalid} in {what}. Function does not "
            f"take these args. ({api})"
        )


def check_callable(fun: Any, api: str) -> None:
    """What a front door can wrap, as jax.jit checks it (jax's messages, then which API).

    Raises:
        TypeError: a ``staticmethod`` object, a non-callable, or a generator function.
    """
    if isinstance(fun, staticmethod):
        raise TypeError(f"staticmethod arguments are not supported, got {fun} ({api})")
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun} ({api})")
    if inspect.isgeneratorfunction(fun):
        raise TypeError(f"Expected a function, got a generator function: {fun} ({api})")


def jit_binding(
    fun: Callable[..., Any],
    label: str,
    static_argnums: Any,
    static_argnames: Any,
    donate_argnums: Any,
    donate_argnames: Any,
    bind_keywords: bool,
) -> Binding:
    """Statics and donation as jax.jit reads and checks them: one of argnums/argnames
    infers the other; every one must fit the signature; none both static and donated.

    Raises:
        TypeError: argnums that are not ints, argnames that are not strings.
        ValueError: jax.jit's messages, in jax.jit's order.
    """
    try:
        signature: inspect.Signature | None = inspect.signature(fun)
    except (TypeError, ValueError):
        signature = None
    if signature is None and donate_argnames is not None:
        raise ValueError(
            f"Getting the signature of function {fun} failed. Pass donate_argnums instead of "
            f"donate_argnames. ({label})"
        )
    nums = {
        "static": optional_index_tuple(static_argnums, "static_argnums", label),
        "donate": optional_index_tuple(donate_argnums, "donate_argnums", label),
    }
    names = {
        "static": optional_name_tuple(static_argnames, "static_argnames", label),
        "donate": optional_name_tuple(donate_argnames, "donate_argnames", label),
    }
    static = infer_argnums_and_argnames(signature, nums["static"], names["static"])
    donate = infer_argnums_and_argnames(signature, nums["donate"], names["donate"])
    for what, (inferred_nums, inferred_names) in (("static", static), ("donate", donate)):
        validate_argnums(signature, nums[what] or inferred_nums, f"{what}_argnums", label)
        validate_argnames(signature, inferred_names, f"{what}_argnames", label)
    if both := set(static[1]) & set(donate[1]):
        raise ValueError(
            "static_argnames and donate_argnames cannot intersect. Argument names "
            f"{both} appear in both static_argnames and donate_argnames ({label})"
        )
    if set(static[0]) & set(donate[0]):
        raise ValueError(
            f"`static_argnums` {sorted(set(static[0]))} and `donate_argnums` "
            f"{sorted(set(donate[0]))} cannot intersect. ({label})"
        )
    return Binding(label, signature, *static, *donate, bind_keywords=bind_keywords)
