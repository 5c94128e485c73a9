"""The one cache of choices partitioner makes for a program: bounded, thread-safe, cleared
by ``partitioner.clear_caches()``.

Why one: AUTO's layouts (``resolve.py``) and a pipeline's microbatch count
(``_src/pipeline/microbatches.py``) are both decisions made once per program
signature and kept, as the trace and executable caches keep theirs. Kept apart, one
of them would grow without bound or survive ``clear_caches()`` while the other did
not; here both live under one bound (:data:`SIZE` entries, least recently used
first out) and one ``clear()``.

NOTE [choices in flight]: a choice can take a whole AUTO search (tens of seconds of
XLA compiles), so no lock is held while one is made: the lock guards the dictionaries
only, and a caller waits only for the thread making the same key's choice, then takes
its value (made once). Callers of other keys go on. Choices nest (a search tracing a
pipeline makes that pipeline's microbatch choice), so a caller never waits on a
choice it is itself making, directly or through threads waiting on it in turn: it
would wait forever. It calls its own ``choose`` instead, as the one re-entrant lock
of before had it do. A ``choose`` that raises is not kept, and its waiters try again
as later callers would: one of them makes the choice, the others wait on that one
(so an interrupt in one thread is never raised in another, and each error carries
its own caller's traceback). ``clear()`` forgets the choices in flight too: each
still finishes for its caller and those waiting on it, and is not kept.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

#: Choices kept, AUTO's and pipelines' together; the least recently used goes first.
SIZE = 64

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class _Making:
    """A choice in flight: the thread making it, and what it made once ``done`` is set."""

    owner: int  # threading.get_ident() of the thread calling choose()
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    made: bool = False  # False once done: choose() raised
    value: Any = None


_cache: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_making: dict[Hashable, _Making] = {}  # keys whose choice is in flight
_waiting: dict[int, _Making] = {}  # thread -> the choice it waits on
# Guards the three dictionaries, never a choose() (NOTE [choices in flight]).
_lock = threading.Lock()


def chosen(key: Hashable, choose: Callable[[], T]) -> T:
    """The choice kept for ``key``, made by ``choose()`` the first time (and again after
    :func:`clear`, or once :data:`SIZE` later choices pushed it out).

    A caller of a key being chosen in another thread waits for that choice and returns
    the same value; ``choose`` is then not called. No caller waits on another key's
    choice (NOTE [choices in flight]).
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
            return choose()  # waiting would be waiting on ourselves
        try:
            making.done.wait()
        finally:
            with _lock:
                del _waiting[me]
        if making.made:
            return making.value  # type: ignore[no-any-return]
    return _make(key, making, choose)


def _leads_back(making: _Making, me: int) -> bool:
    """Whether waiting on ``making`` would wait on thread ``me``: it makes it, or the
    thread that does waits, in turn, on a choice ``me`` makes. Called under the lock;
    the waits form no cycle (none is ever entered), so the walk ends."""
    owner = making.owner
    while owner != me:
        blocking = _waiting.get(owner)
        if blocking is None or blocking.done.is_set():
            return False
        owner = blocking.owner
    return True


def _make(key: Hashable, making: _Making, choose: Callable[[], T]) -> T:
    """``choose()``'s value, kept for ``key`` unless :func:`clear` forgot ``making``
    meanwhile; ``making``'s waiters woken either way, with the value or to retry."""
    try:
        value = choose()
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
    """Forget every choice, and the choices in flight (NOTE [choices in flight])."""
    with _lock:
        _cache.clear()
        _making.clear()


def size() -> int:
    """Choices kept now."""
    with _lock:
        return len(_cache)
