"""Where colocated functions run: one FIFO lane per calling thread, and output promises.

NOTE [colocated lanes]: every thread that calls colocated functions has its own
*lane*, a FIFO of calls run by a worker thread of its own. Calls made by one
thread therefore run one at a time, in call order (each sees the effects of the
earlier ones, whatever devices they use), while calls made by different threads
run concurrently (three threads meeting at a ``threading.Barrier`` inside the
function all get there). A colocated function that calls another runs it inline,
on the worker running it, as part of its own call: no call ever waits for a
lane it is itself holding up, so every nesting pattern finishes. A worker with
nothing to do for ``IDLE_S`` ends; its lane starts a new one on the next call.

NOTE [colocated execution]: a call hands the function and this process's
host-local arguments to its lane, then, while waiting is cheaper than a promise
(the function's recent runs were shorter than the promise costs), waits that long
for the outputs and returns them as they are. Otherwise it asks for *promised*
arrays for its outputs (this process's part of each, on its devices) and returns
those at once; the worker fulfils the promise when the function has run, with
its outputs, or, when it raised, with *error arrays* that carry
``"colocated_python function 'f' raised Type: message"``. Either way an error
surfaces where an output is consumed, never at the call.

The promise is a transfer of jax's transfer server (``jax.experimental.transfer``)
from this process to itself over localhost: ``pull`` hands out arrays whose
buffers are defined later, when the matching ``await_pull`` supplies the data.
Until then the runtime treats them as any array still being computed: a program
that consumes them is queued (it waits for its inputs without holding a thread),
``block_until_ready`` and ``np.asarray`` wait. It costs about 60 us per shard
(each shard is one transfer), which is why a short function is waited for.

Why not the obvious "output program" (a partitioned program whose per-device
host callback waits for the result): a host callback that waits holds one of
the CPU client's executor threads, and with 8 devices one such program in flight
holds them all; the next launch on those devices, ours or jax.jit's, then waits
for the function to finish (measured on jax 0.10.2, jax.jit alike). Promises hold
no thread.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental import transfer

logger = logging.getLogger("partitioner.colocated")

#: How long a lane's worker waits for another call before it ends.
IDLE_S = 10.0

#: How long the interpreter's exit waits for queued calls (NOTE [colocated exit]).
EXIT_TIMEOUT_S = 300.0

_local = threading.local()  # .lane: the calling thread's lane; .worker: True on a worker


def on_worker() -> bool:
    """True inside a colocated function (its call runs nested calls inline)."""
    return getattr(_local, "worker", False)


class Lane:
    """One calling thread's colocated calls, run in call order by a worker of its own.

    Why a ``SimpleQueue`` and not a condition: handing a call to the worker is
    most of what a short call costs, and the C queue's hand-off is the cheapest
    Python has (NOTE [colocated execution]).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unfinished = 0  # queued or running
        self._idle = threading.Condition(self._lock)
        self._has_worker = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:  # counted before it is queued: the worker ends only at zero
            self._unfinished += 1
            start, self._has_worker = not self._has_worker, True
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def drain(self, deadline: float) -> int:
        """Wait until every queued call has run, or ``deadline``; how many did not."""
        with self._lock:
            self._idle.wait_for(lambda: not self._unfinished, max(0.0, deadline - time.monotonic()))
            return self._unfinished

    def _run(self) -> None:
        _local.worker = True
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if not self._unfinished:  # nothing queued, nothing about to be
                        self._has_worker = False
                        return
                continue
            try:
                job()
            except BaseException:  # a job reports its own errors; never lose the worker
                logger.error("partitioner.colocated: worker error\n%s", traceback.format_exc())
            # Drop the job now: what it holds (a colocated object's last reference) is
            # released here, before the next call, not when the next job replaces it.
            del job
            with self._lock:
                self._unfinished -= 1
                if not self._unfinished:
                    self._idle.notify_all()


_lanes: weakref.WeakSet[Lane] = weakref.WeakSet()
_lanes_lock = threading.Lock()
_lane_names = itertools.count()


def current_lane() -> Lane:
    """The calling thread's lane (created on first use)."""
    lane = getattr(_local, "lane", None)
    if lane is None:
        lane = _local.lane = Lane(f"partitioner-colocated-{next(_lane_names)}")
        with _lanes_lock:
            if not _lanes:
                # Registered at first use, after jax and partitioner.distributed have
                # registered theirs: exit handlers run last-in first-out, so queued
                # calls run while the runtime (and a multi-process job) is still up.
                atexit.register(drain_all, EXIT_TIMEOUT_S)
            _lanes.add(lane)
    return lane


def submit(job: Callable[[], None]) -> None:
    """Run ``job`` after the calling thread's earlier calls (inline on a worker)."""
    if on_worker():
        job()
    else:
        current_lane().submit(job)


def run_sync(job: Callable[[], Any]) -> Any:
    """``job()``'s value, run in call order on the calling thread's lane; raises its error."""
    if on_worker():
        return job()
    done = threading.Event()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["out"] = job()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e
        done.set()

    current_lane().submit(call)
    done.wait()
    if "error" in box:
        raise box.pop("error")
    return box["out"]


def drain_all(timeout_s: float) -> int:
    """NOTE [colocated exit]: run every queued call before the interpreter exits.

    A colocated function often has effects (it writes a file, fills a cache), and
    the caller may exit right after the call returned: the calls already made
    still run, in order, before exit. The wait is bounded: after ``timeout_s``
    the calls not yet run are named in an error log and abandoned. Nothing in
    the runtime waits for itself (NOTE [colocated lanes]), so the bound is only
    reached by a function that itself does not finish.

    Returns:
        How many calls were abandoned.
    """
    deadline = time.monotonic() + timeout_s
    with _lanes_lock:
        lanes = list(_lanes)
    abandoned = 0
    for lane in lanes:
        left = lane.drain(deadline)
        if left:
            logger.error(
                "partitioner.colocated: exiting with %d colocated call(s) not run after %.0f s",
                left,
                timeout_s,
            )
        abandoned += left
    return abandoned


def describe_error(name: str, e: BaseException) -> str:
    """What a consumer of the outputs sees: the function, the type name, the message."""
    return f"colocated_python function {name!r} raised {type(e).__name__}: {e}"


class Promises:
    """Arrays handed out now and filled in later (NOTE [colocated execution])."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._servers: dict[Any, tuple[Any, Any]] = {}  # client -> (server, connection)

    def _server(self, client: Any) -> tuple[Any, Any]:
        with self._lock:
            found = self._servers.get(client)
            if found is None:
                server = transfer.start_transfer_server(client, "127.0.0.1:0", ["127.0.0.1:0"])
                found = self._servers[client] = (server, server.connect(server.address()))
            return found

    def promise(self, structs: Sequence[jax.ShapeDtypeStruct]) -> tuple[int, list[jax.Array]]:
        """A promise id and its arrays (pending until :meth:`fulfil`) of ``structs``.

        Raises:
            JaxRuntimeError: the runtime cannot transfer one of the dtypes (a
                ``StringDType`` array); nothing is promised then.
        """
        with self._lock:
            promise_id = next(self._ids)
        if not structs:
            return promise_id, []
        _, connection = self._server(_client_of(structs))
        return promise_id, list(connection.pull(promise_id, list(structs)))

    def fulfil(self, promise_id: int, arrays: Sequence[jax.Array]) -> None:
        """Define a promise's arrays: copies of ``arrays`` (laid out as promised)."""
        if arrays:
            server, _ = self._server(_client_of([arrays[0]]))
            server.await_pull(promise_id, list(arrays))

    @staticmethod
    def errors(structs: Sequence[jax.ShapeDtypeStruct], message: str) -> list[jax.Array]:
        """Arrays that raise ``message`` wherever they are consumed."""
        return [transfer.make_error_array(s, message) for s in structs]


def _client_of(structs: Sequence[Any]) -> Any:
    """The runtime client of the devices of ``structs[0]`` (a struct or an array)."""
    sharding = structs[0].sharding
    assert sharding is not None
    device: Any = next(iter(sharding.device_set))
    return device.client


PROMISES = Promises()
