"""The one cache of what partitioner's searches found for a program: bounded, thread-safe,
cleared by ``partitioner.clear_caches()``.

Why one: AUTO's layouts (``resolve.py``), its whole plans (``whole_plan.py``) and a
pipeline's microbatch count (``_src/pipeline/microbatches.py``) are each searched once
per program signature and kept, as the trace and executable caches keep theirs. Kept apart, one
of them would grow without bound or survive ``clear_caches()`` while the other did
not; here both live under one bound (:data:`SIZE` entries, least recently used
first out) and one ``clear()``.

NOTE [searches in flight]: a search can take a whole AUTO search (tens of seconds of
XLA compiles), so no lock is held while one is made: the lock guards the dictionaries
only, and a caller waits only for the thread searching the same key, then takes
its value (found once). Callers of other keys go on. Searches nest (an AUTO search
tracing a pipeline searches that pipeline's microbatches), so a caller never waits on a
search it is itself making, directly or through threads waiting on it in turn: it
would wait forever. It calls its own ``search`` instead, as the one re-entrant lock
of before had it do. A ``search`` that raises is not kept, and its waiters try again
as later callers would: one of them searches, the others wait on that one
(so an interrupt in one thread is never raised in another, and each error carries
its own caller's traceback). ``clear()`` forgets the searches in flight too: each
still finishes for its caller and those waiting on it, and is not kept.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

#: What searches found, AUTO's and pipelines' together; the least recently used goes first.
SIZE = 64

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class _Making:
    """A search in flight: the thread making it, and what it found once ``done`` is set."""

    owner: int  # threading.get_ident() of the thread calling search()
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    made: bool = False  # False once done: search() raised
    value: Any = None


_cache: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_making: dict[Hashable, _Making] = {}  # keys whose search is in flight
_waiting: dict[int, _Making] = {}  # thread -> the search it waits on
# Guards the three dictionaries, never a search() (NOTE [searches in flight]).
_lock = threading.Lock()


def once(key: Hashable, search: Callable[[], T]) -> T:
    """What ``search()`` found for ``key``, searched the first time (and again after
    :func:`clear`, or once :data:`SIZE` later searches pushed it out).

    A caller of a key being searched in another thread waits for that search and returns
    the same value; ``search`` is then not called. No caller waits on another key's
    search (NOTE [searches in flight]).
    """
    me = threading.get_ident()
    while True:
        with _lock:
            if key in _cache:
                _cache.move_to_end(key)
                return _cache[key]  # type: ignore[no-any-return]
            making = _making.get(key)
            if making is None:
                making = _making[key] = _Making(me)
                break
            cycle = _leads_back(making, me)
            if not cycle:
                _waiting[me] = making
        if cycle:
            return search()  # waiting would be waiting on ourselves
        try:
            making.done.wait()
        finally:
            with _lock:
                del _waiting[me]
        if making.made:
            return making.value  # type: ignore[no-any-return]
    return _make(key, making, search)


def _leads_back(making: _Making, me: int) -> bool:
    """Whether waiting on ``making`` would wait on thread ``me``: it makes it, or the
    thread that does waits, in turn, on a search ``me`` makes. Called under the lock;
    the waits form no cycle (none is ever entered), so the walk ends."""
    owner = making.owner
    while owner != me:
        blocking = _waiting.get(owner)
        if blocking is None or blocking.done.is_set():
            return False
        owner = blocking.owner
    return True


def _make(key: Hashable, making: _Making, search: Callable[[], T]) -> T:
    """``search()``'s value, kept for ``key`` unless :func:`clear` forgot ``making``
    meanwhile; ``making``'s waiters woken either way, with the value or to retry."""
    try:
        value = search()
        making.value, making.made = value, True
        return value
    finally:
        with _lock:
            if _making.get(key) is making:
                del _making[key]
                if making.made:
                    _cache[key] = making.value
                    if len(_cache) > SIZE:
                        _cache.popitem(last=False)
        making.done.set()


def clear() -> None:
    """Forget everything found, and the searches in flight (NOTE [searches in flight])."""
    with _lock:
        _cache.clear()
        _making.clear()


def size() -> int:
    """Entries kept now."""
    with _lock:
        return len(_cache)
