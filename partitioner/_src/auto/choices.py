"""The one cache of choices partitioner makes for a program: bounded, thread-safe, cleared
by ``partitioner.clear_caches()``.

Why one: AUTO's layouts (``resolve.py``) and a pipeline's microbatch count
(``_src/pipeline/microbatches.py``) are both decisions made once per program
signature and kept, as the trace and executable caches keep theirs. Kept apart, one
of them would grow without bound or survive ``clear_caches()`` while the other did
not; here both live under one bound (:data:`SIZE` entries, least recently used
first out) and one ``clear()``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

#: Choices kept, AUTO's and pipelines' together; the least recently used goes first.
SIZE = 64

T = TypeVar("T")

_cache: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
# One choice at a time: a second caller of the same key waits and reuses it.
_lock = threading.RLock()  # re-entrant: a choice may make another (a search tracing a pipeline)


def chosen(key: Hashable, choose: Callable[[], T]) -> T:
    """The choice kept for ``key``, made by ``choose()`` the first time (and again after
    :func:`clear`, or once :data:`SIZE` later choices pushed it out)."""
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]  # type: ignore[no-any-return]
        value = choose()
        _cache[key] = value
        if len(_cache) > SIZE:
            _cache.popitem(last=False)
        return value


def clear() -> None:
    """Forget every choice."""
    with _lock:
        _cache.clear()


def size() -> int:
    """Choices kept now."""
    with _lock:
        return len(_cache)
