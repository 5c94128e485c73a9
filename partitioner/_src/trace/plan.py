"""A call plan: what a front door hands the dispatcher and the AOT stages.

Why its own module: the front doors (``pjit``, later ``pmap``) build plans, and
dispatch and ``stages`` consume them; with the type down here, below all three,
imports only ever point down the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import PyTreeDef, tree_unflatten

from .. import jax_private as jp
from .primitive import PjitParams


@dataclass(frozen=True)
class CallPlan:
    """Everything one call (or ``.lower``) needs, computed from its arguments."""

    params: PjitParams
    args_flat: tuple[Any, ...]  # tracer constants first, then the dynamic leaves
    in_tree: PyTreeDef  # of (dynamic positional args, dynamic kwargs)
    out_tree: PyTreeDef
    in_avals: tuple[Any, ...]  # of the dynamic leaves
    num_consts: int  # leading inputs that are values of an enclosing trace
    # How a call nested in another front door's body binds instead of pjit_p (a
    # pmap inside a pmap binds its region, which the outer map places).
    nested_bind: Callable[..., Any] | None = None

    @property
    def mesh(self) -> Mesh:
        return self.params.mesh

    def bind(self) -> Any:
        """Bind ``pjit_p`` (staged under a trace, else run by its impl); the output pytree."""
        bind = self.nested_bind or self.params.bind
        return tree_unflatten(self.out_tree, bind(*self.args_flat))


@dataclass(frozen=True)
class SplitArguments:
    """A call's arguments with the static ones taken out."""

    statics: tuple[tuple[int | str, Any], ...]  # (position or keyword, value), in order
    dynamic_args: tuple[Any, ...]
    dynamic_kwargs: dict[str, Any]


def split_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    static_positions: Collection[int],
    static_names: Collection[str],
) -> SplitArguments:
    """Separate static from dynamic arguments (positions must be non-negative).

    Used by the planner (after binding the signature) and by the dispatcher's
    Python fast path (on the raw call), so both key on the same split.
    """
    statics: list[tuple[int | str, Any]] = [
        (i, args[i]) for i in sorted(static_positions) if i < len(args)
    ]
    statics += sorted((k, v) for k, v in kwargs.items() if k in static_names)
    return SplitArguments(
        statics=tuple(statics),
        dynamic_args=tuple(a for i, a in enumerate(args) if i not in static_positions),
        dynamic_kwargs={k: v for k, v in kwargs.items() if k not in static_names},
    )


def check_hashable(statics: tuple[tuple[int | str, Any], ...], name: str) -> None:
    """Raise a TypeError naming the first static argument that cannot be a cache key."""
    for where, value in statics:
        if not isinstance(value, Hashable):
            raise TypeError(
                f"pjit {name}: static argument {where!r} of type {type(value).__name__} is not "
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


def abstractify(leaf: Any, where: str, static_hint: str) -> Any:
    """The abstract value of an argument leaf.

    Raises:
        TypeError: not a JAX type, naming ``where`` (API and argument path) and how
            to mark it static.
    """
    try:
        return jp.shaped_abstractify(leaf)
    except TypeError:
        raise TypeError(
            f"{where} of type {type(leaf).__name__} is not a valid JAX type (arrays, numpy "
            f"arrays, Python scalars or jax.ShapeDtypeStruct). Mark it static with "
            f"{static_hint} if it is configuration."
        ) from None
