"""The tap receiver: a byte-bounded queue, program order, one consumer thread.

The design of the seed's ``outfeed_receiver.cc``, on today's runtime: there is no
outfeed, so the producers are the host callbacks XLA runs inside a program (and
eager taps). A producer only copies its arrays to host memory and hands them
over; one consumer thread runs the tap functions, in program order.

NOTE [tap back pressure]: the queue is bounded in *bytes*. A producer queues its
tap, then waits while the queued bytes are at or over the cap, so the queue holds
at most the cap plus one tap (one round of a ``tap_with_device`` tap, which
arrives whole), however slow the tap functions: the program producing taps slows
down instead (its callback blocks). Producers never wait while holding a lock
another producer needs. The consumer takes an item off the queue before running
its tap function, so a tap function that itself calls jax (``np.asarray``, a
jitted function) finds room freed for the program it waits on; a tap the consumer
thread itself produces (an eager ``id_tap`` inside a tap function) never waits,
since nobody else would make room. (A tap function that runs a program which
itself taps can still wait forever once the queue is full: that program's tap
waits for the consumer, which waits for the program.)

NOTE [device tap order]: a global tap runs once, on the program's first device,
threaded on the ordered-effect token, so global taps arrive in program order and
in call order. A ``tap_with_device`` tap runs on every device, concurrently and
without a token (XLA cannot partition a token through a per-device callback), so
its lowering adds a *marker*: a global callback without operands, on the token,
that opens the site's next round in program order. (In a multi-process program
the marker runs only in the process owning the first device; the others open a
round when their own first device's shard arrives.) The :class:`Sequencer` matches
the k-th shard device p sends from a site to that site's k-th round (every device
of an SPMD program runs every tap site, in its own order), and hands a round to
the queue once all its devices have sent theirs, in device order, never ahead of
an earlier tap. Taps parked behind an unfinished round are not in the queue yet
and do not count against its cap: how many there are is bounded by how far the
devices of one program run apart.

Errors: a tap function that raises is logged with its traceback and counted; later
taps still run. A ``call`` whose host function raises is reported to the computation
(which fails) and kept the same way (:meth:`Receiver.record_error`). The errors kept
are raised, the first one chained, as :class:`CallbackException` (also named
``TapFunctionException``) at the next :meth:`Receiver.barrier` or at
:meth:`Receiver.stop`: the 2021-2024 module's protocol.

Shutdown: :meth:`Receiver.stop` waits for every launched program's taps and for
the queue to drain, at most ``timeout_sec`` (a hanging tap function is logged, not
waited for), then ends the thread. The process's receiver does this at
interpreter exit, so no tap is lost.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

logger = logging.getLogger("partitioner.host_callback")

#: Default cap on the bytes of tap payloads waiting for the consumer.
DEFAULT_MAX_QUEUE_BYTES = 256 << 20
#: Default bound on how long a receiver's stop (and interpreter exit) waits for taps.
DEFAULT_TIMEOUT_SEC = 10.0
#: How long the consumer, woken by a first tap, lets more gather (NOTE [tap speed]):
#: when taps come less than BURST_SEC apart and fewer than LINGER_BYTES wait.
LINGER_SEC = 0.001
BURST_SEC = 0.005
LINGER_BYTES = 64 << 10


class CallbackException(Exception):
    """A tap or ``call`` function raised; raised at the next ``barrier_wait()`` or receiver stop.

    The first error is the ``__cause__``; the message has the count and the last
    error's class and text ("Last one was: ValueError: ..."), as jax's had.
    """


#: The seed's name for it (jax's module kept both names for the one class).
TapFunctionException = CallbackException


@dataclass(frozen=True)
class TapItem:
    """One tap function call waiting in the queue: ``run()`` calls it; ``nbytes`` of payload."""

    run: Callable[[], None]
    nbytes: int


# --- program order across devices ---


class _Slot:
    """One tap in program order: a global tap, or a round of a device tap (one part per device)."""

    __slots__ = ("missing", "parts")

    def __init__(self, positions: tuple[int, ...]) -> None:
        self.parts: dict[int, TapItem | None] = dict.fromkeys(positions)
        self.missing = len(positions)

    def fill(self, position: int, item: TapItem) -> None:
        self.parts[position] = item
        self.missing -= 1


class Sequencer:
    """Puts taps into the queue in program order (NOTE [device tap order]).

    Args:
        append: queues an item without waiting (called under the sequencer's lock,
            so items keep their order).
        wait_for_room: back pressure, applied after the lock is released: a thread
            waiting for room never holds up another producer's bookkeeping.
    """

    def __init__(
        self, append: Callable[[TapItem], None], wait_for_room: Callable[[], None]
    ) -> None:
        self._deliver = append
        self._wait_for_room = wait_for_room
        self._lock = threading.Lock()
        self._slots: collections.deque[_Slot] = collections.deque()
        self._open: dict[object, collections.deque[_Slot]] = {}  # site -> rounds lacking a device
        self._early: dict[tuple[object, int], collections.deque[TapItem]] = {}

    def put(self, item: TapItem) -> None:
        """A global tap: next in program order."""
        with self._lock:
            if self._slots:  # behind an unfinished round
                slot = _Slot((0,))
                slot.fill(0, item)
                self._slots.append(slot)
                self._drain()
            else:
                self._deliver(item)
        self._wait_for_room()

    def open_round(self, site: object, positions: tuple[int, ...]) -> None:
        """The next round of device tap ``site`` is next in program order.

        ``positions``: the devices (positions in the program's device assignment)
        whose shards this process receives.
        """
        slot = _Slot(positions)
        with self._lock:
            for p in positions:
                early = self._early.get((site, p))
                if early:
                    slot.fill(p, early.popleft())
                    if not early:
                        del self._early[(site, p)]
            self._slots.append(slot)
            if slot.missing:
                self._open.setdefault(site, collections.deque()).append(slot)
            self._drain()
        self._wait_for_room()

    def put_shard(self, site: object, position: int, item: TapItem) -> None:
        """Device ``position``'s part of its next round of tap ``site``."""
        with self._lock:
            rounds = self._open.get(site)
            slot = next((s for s in rounds if s.parts[position] is None), None) if rounds else None
            if slot is None:  # its round is not open yet
                self._early.setdefault((site, position), collections.deque()).append(item)
            else:
                slot.fill(position, item)
                while rounds and not rounds[0].missing:
                    rounds.popleft()
                if not rounds:
                    del self._open[site]
                self._drain()
        self._wait_for_room()

    def flush(self) -> None:
        """Hand over what arrived of unfinished rounds (every program has finished)."""
        with self._lock:
            if any(s.missing for s in self._slots) or self._early:
                logger.error(
                    "partitioner.host_callback: some tap_with_device taps arrived from only "
                    "part of their devices; delivering the parts that arrived."
                )
            for slot in self._slots:
                slot.missing = 0
            self._drain()
            for items in self._early.values():
                for item in items:
                    self._deliver(item)
            self._open.clear()
            self._early.clear()

    def _drain(self) -> None:
        while self._slots and not self._slots[0].missing:
            for _, item in sorted(self._slots.popleft().parts.items()):
                if item is not None:
                    self._deliver(item)


# --- the receiver ---


@dataclass
class _Stats:
    taps_enqueued: int = 0
    taps_delivered: int = 0  # tap functions that ran (raising or not)
    queued_bytes: int = 0
    peak_queued_bytes: int = 0
    tap_exceptions: int = 0
    errors_since_barrier: list[BaseException] = field(default_factory=list)


class _Queue:
    """The byte-bounded queue between the producers and the consumer thread.

    NOTE [tap speed]: one lock. The consumer waits on ``_items`` and is woken only
    while it waits; producers waiting for room and barriers wait on ``_changed``,
    notified only while someone does. Waking the consumer costs a thread switch,
    which on a busy machine costs more than a small tap: when taps come in a burst
    (woken less than ``BURST_SEC`` after the previous wake-up), the consumer lets
    more arrive for ``LINGER_SEC`` (while fewer than ``LINGER_BYTES`` wait: holding
    big taps' memory longer costs more than the switch) and runs them all in the
    same wake-up; a lone tap (one a step) runs at once. A barrier, an ordered ``call`` or a producer waiting
    for room cuts the wait short (:meth:`hurry`). A tap's callback itself only
    copies its arrays and queues one call built ahead (``Tap.site``).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.stats = _Stats()
        self.stopping = False  # producers no longer wait for room
        self.closed = False  # the consumer has ended: late taps run where they arrive
        self._lock = threading.Lock()
        self._items = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)
        self._deque: collections.deque[TapItem] = collections.deque()
        self._consumer_waits = False
        self._lingering = False
        self._urgent = False  # someone waits for the consumer: no lingering
        self._last_wake = 0.0  # when the consumer last woke for taps (time.monotonic)
        self._watchers = 0  # threads waiting on _changed

    def append(self, item: TapItem) -> bool:
        """Queue ``item``; False (not queued) once the consumer has ended."""
        with self._lock:
            if self.closed:
                return False
            self._deque.append(item)
            stats = self.stats
            stats.taps_enqueued += 1
            stats.queued_bytes += item.nbytes
            if stats.queued_bytes > stats.peak_queued_bytes:
                stats.peak_queued_bytes = stats.queued_bytes
            if self._consumer_waits and (not self._lingering or stats.queued_bytes >= LINGER_BYTES):
                self._items.notify()
        return True

    def wait_for_room(self) -> None:
        """Wait while the queue is at its cap (not on the consumer's thread)."""
        with self._lock:
            while self.stats.queued_bytes >= self.max_bytes and not self.stopping:
                self._hurry()
                self._wait_changed()

    def hurry(self) -> None:
        """Someone waits for the consumer: it runs at once, without lingering."""
        with self._lock:
            self._hurry()

    def _hurry(self) -> None:
        self._urgent = True
        self._items.notify()

    def _wait_changed(self, timeout: float | None = None) -> None:
        self._watchers += 1
        try:
            self._changed.wait(timeout)
        finally:
            self._watchers -= 1

    # --- the consumer's side ---

    def take(self, ran: int) -> collections.deque[TapItem]:
        """Count ``ran`` taps delivered; wait for taps and take them all (none: stopped)."""
        with self._lock:
            self.stats.taps_delivered += ran
            if not self._deque and not self.stopping:
                self._wait_for_taps()
            if not self._deque:
                self._changed.notify_all()
            batch, self._deque = self._deque, collections.deque()
            return batch

    def _wait_for_taps(self) -> None:
        while not self._deque and not self.stopping:
            if self._watchers:  # a barrier may be done
                self._changed.notify_all()
            self._consumer_waits = True
            self._items.wait()
            self._consumer_waits = False
        now, last = time.monotonic(), self._last_wake
        self._last_wake = now
        burst = now - last < BURST_SEC
        small = self.stats.queued_bytes < LINGER_BYTES
        if burst and small and not self._urgent and not self.stopping:
            self._consumer_waits = self._lingering = True
            self._items.wait(LINGER_SEC)
            self._consumer_waits = self._lingering = False
        self._urgent = False

    def taken(self, item: TapItem, delivered: int = 0) -> None:
        """``item`` is off the queue (about to run): room for waiting producers."""
        with self._lock:
            self.stats.queued_bytes -= item.nbytes
            self.stats.taps_delivered += delivered
            if self._watchers:
                self._changed.notify_all()

    def record_error(self, error: BaseException) -> None:
        with self._lock:
            self.stats.tap_exceptions += 1
            self.stats.errors_since_barrier.append(error)

    # --- barriers and stopping ---

    def wait_delivered(self, timeout: float | None) -> list[BaseException]:
        """Wait until every tap queued so far has run; the errors since the last call.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._hurry()
            target = self.stats.taps_enqueued
            while self.stats.taps_delivered < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"{target - self.stats.taps_delivered} taps still pending after "
                        f"{timeout} s (a tap function may hang)"
                    )
                self._wait_changed(left)
            errors, self.stats.errors_since_barrier = self.stats.errors_since_barrier, []
            return errors

    def stop(self) -> None:
        """No more waiting for room; the consumer ends once the queue is empty."""
        with self._lock:
            self.stopping = True
            self._items.notify_all()
            self._changed.notify_all()

    def close(self) -> list[TapItem]:
        """The consumer has ended: take what is left (taps queued since it drained)."""
        with self._lock:
            self.closed = True
            late, self._deque = list(self._deque), collections.deque()
            return late

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            s = self.stats
            return {
                "taps_delivered": s.taps_delivered,
                "queued_bytes": s.queued_bytes,
                "peak_queued_bytes": s.peak_queued_bytes,
                "tap_exceptions": s.tap_exceptions,
            }


class Receiver:
    """A bounded tap queue with one consumer thread (NOTE [tap back pressure]).

    Args:
        name: shown in the thread name and the logs.
        max_queue_bytes: the cap on queued payload bytes (producers wait above it).
        timeout_sec: how long :meth:`stop` waits for pending taps.
    """

    def __init__(self, name: str, max_queue_bytes: int, timeout_sec: float) -> None:
        if isinstance(max_queue_bytes, bool) or not isinstance(max_queue_bytes, int):
            raise TypeError(
                f"outfeed_receiver: max_queue_bytes must be an int, got {max_queue_bytes!r}"
            )
        if max_queue_bytes <= 0:
            raise ValueError(
                f"outfeed_receiver: max_queue_bytes must be positive, got {max_queue_bytes}"
            )
        if isinstance(timeout_sec, bool) or not isinstance(timeout_sec, (int, float)):
            raise TypeError(f"outfeed_receiver: timeout_sec must be a number, got {timeout_sec!r}")
        if not timeout_sec > 0:
            raise ValueError(f"outfeed_receiver: timeout_sec must be > 0, got {timeout_sec}")
        self.name = name
        self.max_queue_bytes = max_queue_bytes
        self.timeout_sec = float(timeout_sec)
        self.sequencer = Sequencer(self._append, self._wait_for_room)
        self._queue = _Queue(max_queue_bytes)
        self._thread = threading.Thread(
            target=self._consume, name=f"partitioner-tap-receiver{'-' + name if name else ''}"
        )
        # Daemon: a tap function that hangs must not hang interpreter exit; stop()
        # (at exit too) waits for the queue, at most timeout_sec.
        self._thread.daemon = True
        self._thread.start()

    def in_consumer(self) -> bool:
        """True on the thread that runs tap functions."""
        return threading.current_thread() is self._thread

    # --- producers ---

    def _append(self, item: TapItem) -> None:
        """Queue a tap (the sequencer's order); after the receiver stopped, run it here."""
        if not self._queue.append(item):  # a straggler (launched during stop): never dropped
            self._run(item)

    def _wait_for_room(self) -> None:
        """Back pressure (NOTE [tap back pressure]): wait while the queue is at its cap."""
        # Read without the lock: this thread's own tap is already counted, so a
        # producer goes on only if the queue was under the cap after it.
        if self._queue.stats.queued_bytes < self.max_queue_bytes or self.in_consumer():
            return  # under the cap, or nobody else would make room
        self._queue.wait_for_room()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the consumer thread after every tap queued before it; its result.

        Why there: a ``call`` in program order after a tap sees the tap's effects
        (the seed's single receiver ran both). ``fn``'s error is raised here, to the
        caller (``HostCall.on_host`` keeps it for the barrier).
        """
        if self.in_consumer():
            return fn()
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the waiting caller
                box["error"] = e
            finally:
                done.set()

        self.sequencer.put(TapItem(run, 0))
        self._queue.hurry()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    # --- the consumer ---

    def _consume(self) -> None:
        ran = 0
        while batch := self._queue.take(ran):
            ran = len(batch)
            while batch:  # each item dropped once run: its arrays are freed at once
                item = batch.popleft()
                self._queue.taken(item)
                self._call(item)

    def _call(self, item: TapItem) -> None:
        """Call a tap function; an error is logged and kept for the next barrier.

        (Kept before the tap counts as delivered: the barrier that waits for it sees it.)
        """
        try:
            item.run()
        except Exception as e:
            self.record_error(e, "a tap function")

    def _run(self, item: TapItem) -> None:
        """Call a tap function here (a straggler after stop) and count it delivered."""
        self._call(item)
        self._queue.taken(TapItem(item.run, 0), delivered=1)

    def record_error(self, error: BaseException, who: str) -> None:
        """Log ``error`` (raised by ``who``) and keep it for the next barrier."""
        logger.error(
            "partitioner.host_callback: %s raised (it is reported at the next barrier_wait()):\n%s",
            who,
            "".join(traceback.format_exception(error)),
        )
        self._queue.record_error(error)

    # --- synchronisation ---

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every tap launched so far has run; raise a pending tap error.

        Raises:
            RuntimeError: called from a tap function (it would wait for itself).
            TimeoutError: ``timeout`` seconds passed first.
            CallbackException: a tap or call function raised since the last barrier.
        """
        if self.in_consumer():
            raise RuntimeError(
                "barrier_wait() was called from inside a tap function; it would wait for "
                "itself. Call it from the code that launches the computations."
            )
        started = time.monotonic()
        _wait_for_launched_programs(timeout)
        self.sequencer.flush()
        left = None if timeout is None else timeout - (time.monotonic() - started)
        errors = self._queue.wait_delivered(left)
        if errors:
            raise CallbackException(_errors_message(errors)) from errors[0]

    def stop(self) -> None:
        """Drain (at most ``timeout_sec``), end the consumer thread; raise pending tap errors."""
        drained = False
        try:
            self.barrier(timeout=self.timeout_sec)
            drained = True
        except TimeoutError as e:
            logger.error(
                "partitioner.host_callback: receiver %r stopped with taps pending: %s",
                self.name,
                e,
            )
        finally:
            self._queue.stop()
            if drained:  # else a tap function hangs: the daemon thread is left to it
                self._thread.join(timeout=self.timeout_sec)
                if not self._thread.is_alive():  # taps queued between the drain and its end
                    for item in self._queue.close():
                        self._queue.taken(item)
                        self._run(TapItem(item.run, 0))

    def stats(self) -> dict[str, int]:
        """Taps delivered, bytes queued now and at most, tap functions that raised."""
        return self._queue.snapshot()

    def __repr__(self) -> str:
        return f"<tap receiver {self.name!r} max_queue_bytes={self.max_queue_bytes}>"


def _errors_message(errors: list[BaseException]) -> str:
    """jax's wording ("... processing. Last one was: ValueError: ..."), then the count."""

    def text(e: BaseException) -> str:
        return "".join(traceback.format_exception_only(e)).strip()

    first = f"; the first one, the __cause__, was: {text(errors[0])}" if len(errors) > 1 else ""
    return (
        f"There were exceptions during callback processing. Last one was: {text(errors[-1])}\n"
        f"({len(errors)} tap or call function(s) raised since the last barrier_wait(); "
        f"tracebacks were logged{first})"
    )


def _wait_for_launched_programs(timeout: float | None) -> None:
    """``jax.effects_barrier()``, given up on after ``timeout`` seconds.

    Why bounded: a program whose tap callback waits for room in a full queue
    finishes only when a tap function returns; at exit, a hanging one must not
    hang the interpreter (the waiting helper thread is a daemon).
    """
    if timeout is None:
        jax.effects_barrier()
        return
    waiter = threading.Thread(target=jax.effects_barrier, daemon=True)
    waiter.start()
    waiter.join(timeout)


# --- the process's receiver ---

_lock = threading.RLock()
_current: Receiver | None = None
_settings: dict[str, Any] = {
    "name": "",
    "max_queue_bytes": DEFAULT_MAX_QUEUE_BYTES,
    "timeout_sec": DEFAULT_TIMEOUT_SEC,
}
_exit_hook_installed = False


def current() -> Receiver:
    """The running receiver; the first call starts one with the current settings."""
    global _current
    receiver = _current
    if receiver is not None:
        return receiver
    with _lock:
        if _current is None:
            _current = _start(_settings)
        return _current


def _start(settings: dict[str, Any]) -> Receiver:
    global _exit_hook_installed
    receiver = Receiver(**settings)
    if not _exit_hook_installed:
        # Registered after jax is imported, so it runs before jax's own exit
        # hooks: the programs can still finish their taps.
        atexit.register(_stop_at_exit)
        _exit_hook_installed = True
    return receiver


def running() -> Receiver | None:
    """The running receiver, or None (nothing started one yet)."""
    return _current


def restart(*, persist: bool, **settings: Any) -> Receiver:
    """Stop the running receiver (draining it), then start one with ``settings``.

    ``persist``: later lazily started receivers use these settings too (a config
    call) rather than the defaults (an ``outfeed_receiver()`` context).

    Raises:
        TapFunctionException: a tap function of the old receiver raised (the new one
            is started first).
    """
    global _current
    with _lock:
        old = _current
        new = _start({**_settings, **settings})  # validates before stopping the old one
        if persist:
            _settings.update(settings)
        try:
            if old is not None:
                old.stop()
        finally:
            _current = new
    return new


def stop() -> None:
    """Drain and stop the running receiver; the next tap starts a new one."""
    global _current
    with _lock:
        receiver = _current
        if receiver is None:
            return
        try:
            # Still current while it drains: the taps of programs in flight reach
            # it, not a fresh receiver that would run them after the drain.
            receiver.stop()
        finally:
            _current = None


def _stop_at_exit() -> None:
    try:
        stop()
    except CallbackException as e:
        logger.error("partitioner.host_callback: at exit: %s (cause: %r)", e, e.__cause__)
