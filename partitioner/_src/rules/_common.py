"""Small helpers shared by the rule modules."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import jax_private as jp

T = TypeVar("T")
R = TypeVar("R")


def keep_where(xs: Sequence[T], keep: Sequence[bool]) -> tuple[T, ...]:
    """The entries of ``xs`` whose flag in ``keep`` is true."""
    return tuple(x for x, k in zip(xs, keep, strict=True) if k)


def cache_per_jaxpr(fn: Callable[..., R]) -> Callable[..., R]:
    """Memoise ``fn(jaxpr, *hashable_args)``, dropping entries with the jaxpr.

    NOTE [derived jaxpr cache]: rules build derived jaxprs (transposed, DCE'd).
    Returning the *same* object for the same inputs lets repeated calls hit the
    executable cache instead of recompiling. Results holding tracers are
    never cached (they belong to one trace).
    """
    cache: weakref.WeakKeyDictionary[Any, dict[Any, R]] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(jaxpr: Any, *args: Any) -> R:
        with lock:
            hit = cache.get(jaxpr, {}).get(args)
        if hit is not None:
            return hit
        result = fn(jaxpr, *args)
        consts = getattr(result[0] if isinstance(result, tuple) else result, "consts", ())
        if not any(isinstance(c, jp.core.Tracer) for c in consts):
            with lock:
                cache.setdefault(jaxpr, {})[args] = result
        return result

    return wrapper
