"""Memoise functions of a jaxpr, so derived programs are the same objects every time.

NOTE [derived jaxpr cache]: the trace layer and the rules build jaxprs derived
from another (a pjit around a pmap region, a transposed or DCE'd body). The
executable cache holds its programs *weakly* (NOTE [executable cache]), so a
derived jaxpr built afresh on every call would be a new program each time, and
would compile again once the previous one was collected. Returning the *same*
object for the same inputs, for as long as the source jaxpr lives, keeps one
executable per signature. Results holding tracers are never cached (they belong
to one trace).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import jax_private as jp

R = TypeVar("R")


def cache_per_jaxpr(fn: Callable[..., R]) -> Callable[..., R]:
    """Memoise ``fn(jaxpr, *hashable_args)``, dropping entries with the jaxpr."""
    cache: weakref.WeakKeyDictionary[Any, dict[Any, R]] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(jaxpr: Any, *args: Any) -> R:
        with lock:
            hit = cache.get(jaxpr, {}).get(args)
        if hit is not None:
            return hit
        result = fn(jaxpr, *args)
        derived = result[0] if isinstance(result, tuple) else getattr(result, "jaxpr", result)
        if not any(isinstance(c, jp.Tracer) for c in getattr(derived, "consts", ())):
            with lock:
                cache.setdefault(jaxpr, {})[args] = result
        return result

    return wrapper


class ByIdentity:
    """A tuple of values in a memo key, equal only to the very same objects.

    Constants (numpy or jax arrays) are neither hashable nor comparable as keys;
    the constants of one source jaxpr are the same objects on every call.
    """

    __slots__ = ("values",)

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = tuple(values)

    def __hash__(self) -> int:
        return hash(tuple(map(id, self.values)))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ByIdentity)
            and len(self.values) == len(other.values)
            and all(a is b for a, b in zip(self.values, other.values))
        )
