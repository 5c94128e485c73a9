"""Observable pipeline events (``trace``, ``lower``, ``compile``, ``cache_miss``).

Why: caches are only trustworthy if tests can count what they avoid. Production
code calls :func:`emit`; tests and users subscribe with :func:`recording` or
:func:`add_listener`. With no listener, an event costs one attribute check.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def emit(event: str, **info: Any) -> None:
    """Report ``event`` to every listener."""
    if _listeners:
        for listener in list(_listeners):
            listener(event, info)


def add_listener(listener: Listener) -> Callable[[], None]:
    """Subscribe ``listener(event, info)``; returns a function that unsubscribes it."""
    with _lock:
        _listeners.append(listener)

    def remove() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


@contextlib.contextmanager
def recording() -> Iterator[collections.Counter[str]]:
    """Count events emitted while the block runs: ``with recording() as c: ...; c['trace']``."""
    counts: collections.Counter[str] = collections.Counter()
    remove = add_listener(lambda event, info: counts.update([event]))
    try:
        yield counts
    finally:
        remove()
