"""A bounded in-flight window for CPU programs with collectives.

NOTE [CPU collective window]: XLA's CPU backend hangs its collective rendezvous
when more than ~32 executions of a multi-device program with collectives are
in flight at once (its per-device limit is not exposed; a chain of donated
train steps hangs too). So no more than ``MAX_IN_FLIGHT`` (K below) launches of
ours may be in flight.

How, at the price jax.jit pays (nothing) in time, memory and errors:
- *Sampled.* One launch in K is tracked: its *marker* (one of its outputs) sits
  in a single slot, and K launches later that launch is waited for (launches on
  the same devices finish in order, so the K-1 after it are then the most in
  flight). The other launches cost a counter increment: on 2 cores XLA's worker
  threads spin on after a step, and every Python operation near a launch costs
  several times its usual price.
- *Small, or not held.* The marker is the output with the fewest bytes per
  device (the loss, in a train step). A large one (over ``SMALL_MARKER_BYTES``:
  the program returns only big arrays) is held by a weak reference, never kept
  alive by the window, and let go as soon as its launch is done. If the caller
  drops it first, the launch is no longer tracked, which is handled like a
  donated marker below.
- *Never a donated buffer.* A marker donated to a later call is deleted and must
  never be waited on (``BlockHostUntilReady() called on deleted or donated
  buffer``). When the tracked launch's marker was donated, the next launch is
  tracked instead and waited for at the launch after it: the bound still holds.

Other backends, and programs without collectives, are never windowed. No lock:
the window is process-wide, and a race between threads can only move a wait by
a launch or two.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from .events import emit

#: Launches allowed in flight.
MAX_IN_FLIGHT = 16
#: Markers up to this size per device stay in the slot until waited for.
SMALL_MARKER_BYTES = 1 << 16

_COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "collective-permute",
    "all-to-all",
    "reduce-scatter",
    "collective-broadcast",
)


class _Slot:
    """The tracked launch: its marker, whether that is small, and launches since."""

    marker: Any = None  # the marker, or a weak reference to a large one
    small = True
    since = 0  # launches made since the tracked one (or, when empty, since the last wait)

    def get(self) -> Any:
        """The marker, or None when there is none (or a large one was dropped)."""
        return self.marker if self.small or self.marker is None else self.marker()


_slot = _Slot()


def needs_window(executable: Any, platform: str, num_devices: int) -> bool:
    """True for a multi-device CPU executable whose partitioned HLO has collectives."""
    if platform != "cpu" or num_devices <= 1:
        return False
    text = "\n".join(m.to_string() for m in executable.hlo_modules())
    return any(op in text for op in _COLLECTIVES)


def marker_index(out_avals: Sequence[Any], bytes_per_device: Sequence[int]) -> int | None:
    """Which output a launch is tracked by: the smallest per device (the last of equals)."""
    if not out_avals:
        return None
    return min(range(len(out_avals)), key=lambda i: (bytes_per_device[i], -i))


def make_room() -> None:
    """Before a launch: wait for the tracked launch once K launches followed it."""
    slot = _slot
    slot.since += 1
    if slot.marker is None:
        return
    marker = slot.get()
    if marker is None:  # a large marker the caller dropped: as if donated
        slot.marker, slot.since = None, max(slot.since, MAX_IN_FLIGHT - 1)
        return
    if slot.since >= MAX_IN_FLIGHT:
        slot.marker = None
        # Donated since: track the launch about to happen and wait for it at
        # the next one (``launched`` keeps since == K - 1).
        slot.since = 0 if _wait(marker) else MAX_IN_FLIGHT - 1
        return
    if not slot.small and _finished(marker):
        slot.marker = None


def wants_marker() -> bool:
    """Whether the launch just made is to be tracked (the slot is free)."""
    return _slot.marker is None


def launched(marker: Any, small: bool) -> None:
    """After a launch: track it by ``marker`` if the slot is free (None: nothing to track)."""
    slot = _slot
    if slot.marker is None and marker is not None:
        slot.marker, slot.small = (marker if small else weakref.ref(marker)), small
        if slot.since != MAX_IN_FLIGHT - 1:
            slot.since = 0


def _finished(x: Any) -> bool:
    try:
        return bool(x.is_ready())
    except Exception:  # deleted (donated): its launch is no longer ours to track
        return True


def _wait(x: Any) -> bool:
    """Wait for the launch ``x`` tracks; False if ``x`` was donated since."""
    emit("window_wait")
    try:
        if not x.is_ready():  # block_until_ready() releases the GIL: costly even when done
            x.block_until_ready()
        return True
    except Exception:
        if x.is_deleted():
            return False
        raise


def drain() -> None:
    """Wait for the tracked launch and forget it (used before clearing caches)."""
    marker = _slot.get()
    _slot.marker, _slot.since = None, 0
    if marker is not None:
        _wait(marker)
