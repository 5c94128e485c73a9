"""A bounded in-flight window for CPU programs with collectives.

NOTE [CPU collective window]: XLA's CPU backend hangs its collective rendezvous
when more than ~32 executions of a multi-device program with collectives are
in flight at once (its per-device limit is not exposed). Every such launch of
ours records one of its outputs here; once more than ``K`` launches are
pending, the oldest is waited for. Throughput is kept (K launches overlap) and
the hang cannot happen. Other backends, and programs without collectives, are
never windowed.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

#: Launches allowed in flight before the oldest is waited for.
K = 16

_pending: collections.deque[Any] = collections.deque()
_lock = threading.Lock()

_COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "collective-permute",
    "all-to-all",
    "reduce-scatter",
    "collective-broadcast",
)


def needs_window(executable: Any, platform: str, num_devices: int) -> bool:
    """True for a multi-device CPU executable whose partitioned HLO has collectives."""
    if platform != "cpu" or num_devices <= 1:
        return False
    text = "\n".join(m.to_string() for m in executable.hlo_modules())
    return any(op in text for op in _COLLECTIVES)


def launched(outputs: list[Any]) -> None:
    """Record a launch; wait for the oldest pending launches beyond the window."""
    marker = outputs[0] if outputs else None
    to_wait = []
    with _lock:
        _pending.append(marker)
        while len(_pending) > K:
            to_wait.append(_pending.popleft())
    for x in to_wait:
        if x is not None:
            x.block_until_ready()


def drain() -> None:
    """Wait for every pending launch (used before clearing caches)."""
    with _lock:
        items = list(_pending)
        _pending.clear()
    for x in items:
        if x is not None:
            x.block_until_ready()
