"""Where colocated functions run: one FIFO worker per device list, and output promises.

NOTE [colocated execution]: a call does not run the function itself. It asks for
*promised* arrays for its outputs (this process's part of each, on its devices),
queues the function and this process's host-local arguments on the worker of the
call's device list, and returns the promised arrays at once. The worker runs the
function and then fulfils the promise with its outputs, or, when it raised, with
*error arrays* that carry ``"colocated_python function 'f' raised Type: message"``.

The promise is a transfer of jax's transfer server (``jax.experimental.transfer``)
from this process to itself over localhost: ``pull`` hands out arrays whose
buffers are defined later, when the matching ``await_pull`` supplies the data.
Until then the runtime treats them as any array still being computed: a program
that consumes them is queued (it waits for its inputs without holding a thread),
``block_until_ready`` and ``np.asarray`` wait, and an error array's message is
raised there, in whoever consumes an output. So the call is asynchronous, device
work goes on meanwhile, and an exception surfaces where an output is consumed and
nowhere else: the next call starts clean.

Why not the obvious "output program" (a partitioned program whose per-device
host callback waits for the result): a host callback that waits holds one of
the CPU client's executor threads, and with 8 devices one such program in flight
holds them all; the next launch on those devices, ours or jax.jit's, then waits
for the function to finish (measured on jax 0.10.2, jax.jit alike). Promises hold
no thread.

The worker runs its calls one at a time in call order, so successive calls on the
same devices see each other's effects in order.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental import transfer

logger = logging.getLogger("partitioner.colocated")


class Worker:
    """One thread running a device list's colocated calls in call order."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._jobs: list[Callable[[], None]] = []
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()

    def is_current(self) -> bool:
        """True on the worker's own thread (a colocated function calling another)."""
        return threading.current_thread() is self._thread

    def drain(self, deadline: float) -> int:
        """Wait until every queued call has run, or ``deadline``; how many did not."""
        with self._cond:
            while self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return len(self._jobs) + self._busy
                self._cond.wait(left)
            return 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.pop(0)
                self._busy = True
            try:
                job()
            except BaseException:  # a job reports its own errors; never lose the worker
                logger.error("partitioner.colocated: worker error\n%s", traceback.format_exc())
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


_workers: dict[tuple[int, ...], Worker] = {}
_workers_lock = threading.Lock()

#: How long the interpreter's exit waits for queued calls (NOTE [colocated exit]).
EXIT_TIMEOUT_S = 300.0


def worker_for(device_ids: tuple[int, ...]) -> Worker:
    """The worker of a device list (created on first use)."""
    with _workers_lock:
        worker = _workers.get(device_ids)
        if worker is None:
            if not _workers:
                # Registered at first use, after jax and partitioner.distributed have
                # registered theirs: exit handlers run last-in first-out, so queued
                # calls run while the runtime (and a multi-process job) is still up.
                atexit.register(drain_all, EXIT_TIMEOUT_S)
            worker = _workers[device_ids] = Worker(f"partitioner-colocated-{device_ids[0]}")
        return worker


def drain_all(timeout_s: float) -> int:
    """NOTE [colocated exit]: run every queued call before the interpreter exits.

    A colocated function often has effects (it writes a file, fills a cache), and
    the caller may exit right after the call returned: the calls already made
    still run, in order, before exit. The wait is bounded: after ``timeout_s``
    the calls not yet run are named in an error log and abandoned.

    Returns:
        How many calls were abandoned.
    """
    deadline = time.monotonic() + timeout_s
    with _workers_lock:
        workers = list(_workers.items())
    abandoned = 0
    for device_ids, worker in workers:
        left = worker.drain(deadline)
        if left:
            logger.error(
                "partitioner.colocated: exiting with %d colocated call(s) on devices %s not run "
                "after %.0f s",
                left,
                list(device_ids),
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
        """A promise id and its arrays (pending until :meth:`fulfil`) of ``structs``."""
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
