"""The executable cache: compile once per signature, even under threads.

NOTE [executable cache]:
- Key: (jaxpr, specs in/out, mesh, donation, partitioner choice). The jaxpr is
  held *weakly*: when the function that produced it is dropped (and with it
  the trace cache entry), its executables are freed.
- Bounded: least-recently-used entries beyond ``capacity`` are evicted.
- Compile once: the first caller of a key compiles; concurrent callers with
  the same key wait on an event (GIL released) and share the result. A
  compile error is stored and re-raised, with its original message, to every
  waiter and to later callers. A thread that re-enters its own in-flight key
  (a compile that calls the same pjit) raises instead of waiting forever.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    owner: int = field(default_factory=threading.get_ident)
    value: Any = None
    error: BaseException | None = None


class ExecutableCache:
    """A bounded, thread-safe, weakly-keyed compile-once cache."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[Hashable, _Entry] = collections.OrderedDict()
        self._by_owner: dict[int, set[Hashable]] = {}
        # Re-entrant: an owner's finalizer may run while this thread holds the lock.
        self._lock = threading.RLock()

    def _key(self, owner: Any, rest: Hashable) -> Hashable:
        oid = id(owner)
        if oid not in self._by_owner:
            self._by_owner[oid] = set()
            weakref.finalize(owner, self._drop_owner, oid)
        key = (oid, rest)
        self._by_owner[oid].add(key)
        return key

    def _drop_owner(self, oid: int) -> None:
        with self._lock:
            for key in self._by_owner.pop(oid, ()):
                self._entries.pop(key, None)

    def get_or_compile(
        self, owner: Any, rest: Hashable, compile_fn: Callable[[], Any]
    ) -> tuple[Any, bool]:
        """The cached value for ``(owner, rest)``, compiling it at most once.

        Args:
            owner: the object whose lifetime bounds the entry (the jaxpr).
            rest: the hashable remainder of the key.
            compile_fn: builds the value on a miss.

        Returns:
            ``(value, missed)``.
        """
        with self._lock:
            key = self._key(owner, rest)
            entry = self._entries.get(key)
            mine = entry is None
            if entry is None:
                entry = self._entries[key] = _Entry()
                self._evict()
            else:
                self._entries.move_to_end(key)
        if not mine:
            if not entry.done.is_set():
                if entry.owner == threading.get_ident():
                    raise RuntimeError(
                        "partitioner: a compilation re-entered itself (the function being "
                        "compiled calls the same pjit with the same signature)."
                    )
                entry.done.wait()
            if entry.error is not None:
                raise entry.error
            return entry.value, False
        try:
            entry.value = compile_fn()
        except BaseException as e:
            entry.error = e
            raise
        finally:
            entry.done.set()
        return entry.value, True

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            key, _ = self._entries.popitem(last=False)
            owned = self._by_owner.get(key[0])  # type: ignore[index]
            if owned is not None:
                owned.discard(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            for keys in self._by_owner.values():
                keys.clear()

    def __len__(self) -> int:
        return len(self._entries)
