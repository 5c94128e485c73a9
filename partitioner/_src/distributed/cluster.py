"""Joining a multi-process job, and noticing when a member is lost.

``initialize()`` reads what ``python -m partitioner.launch`` sets (the ``PARTITIONER_*``
variables below); without them it defers to ``jax.distributed.initialize()``'s own
cluster detection (SLURM, Open MPI, Kubernetes, TPU pods...), so one script runs on
the launcher and on a cluster unchanged.

NOTE [lost processes]: when a process of the job dies, jax's coordination service
notices only after its heartbeat timeout and then *aborts* every other process
(``LOG(FATAL)``), and an exiting process waits up to its shutdown timeout for the
dead one. partitioner runs its own, faster watchdog instead: every process writes a
heartbeat counter into the coordination service's key-value store and reads the
others'. A peer whose counter stops for ``heartbeat_timeout`` seconds is *lost*: the
main thread gets a :class:`ProcessLostError` naming it (raised asynchronously, at
its next Python instruction), and if the main thread is stuck inside XLA (a
collective waiting for the dead peer), the process prints that error and exits
after ``grace`` seconds. jax's own heartbeat timeout is set well above ours, and at
exit a bounded barrier replaces jax's unbounded shutdown wait. A killed peer also
makes gloo collectives fail at once ("Connection closed by peer"); such an error
escaping to the top level is reported with the lost process's name too.

NOTE [exit in order]: the watchdog is a daemon thread that calls into jaxlib's
distributed client (``key_value_set`` / ``key_value_try_get``, which release the GIL).
If Python starts finalizing while it is inside such a call, the call's return tries to
take the GIL back, CPython ends the thread there (``pthread_exit``), and the forced
unwind through jaxlib's ``noexcept`` binding aborts the whole process ("terminate
called after throwing an instance of ''", "FATAL: exception not rethrown", exit 134)
after its work is done. So the exit hook stops the watchdog and joins it once every
process has arrived, before jax's own exit hook shuts the client down; and once
``jax.distributed.shutdown()`` has ended the job, there is nothing left to watch: the
watchdog ends instead of counting the silent peers as lost. Before the processes meet
at exit, each waits for its local computations (a device still connecting a collective
to a peer that has left would hang the CPU client's destructor at exit).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import jax

from .. import jax_private as jp
from ..compiler import agreement

logger = logging.getLogger("partitioner.distributed")

# The launcher's contract (NOTE [launcher environment] in launcher.py).
ENV_COORDINATOR = "PARTITIONER_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "PARTITIONER_NUM_PROCESSES"
ENV_PROCESS_ID = "PARTITIONER_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "PARTITIONER_DEVICES_PER_PROCESS"
ENV_HEARTBEAT_TIMEOUT = "PARTITIONER_HEARTBEAT_TIMEOUT"

#: Seconds without a heartbeat after which a peer counts as lost (default).
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
#: Exit status of a process that ends because a peer was lost while it was stuck.
EXIT_PEER_LOST = 75

_HEARTBEAT_KEY = "partitioner/heartbeat/{}"
_EXIT_BARRIER = "partitioner/exit"


class ProcessLostError(RuntimeError):
    """Another process of the job stopped: killed, crashed or hung.

    ``processes`` holds the lost process indices.
    """

    def __init__(self, message: str, processes: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.processes = processes


@dataclass
class _Job:
    process_id: int
    num_processes: int
    heartbeat_timeout: float
    grace: float
    client: Any
    lost: tuple[int, ...] = ()
    lost_message: str = ""
    exited: bool = False  # this process is in its exit rendezvous
    stop: threading.Event = field(default_factory=threading.Event)  # the watchdog ends
    watcher: threading.Thread | None = None


_job: _Job | None = None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    devices_per_process: int | None = None,
    heartbeat_timeout: float | None = None,
    initialization_timeout: int = 120,
    program_check_timeout: float = 300.0,
) -> None:
    """Join the job: the launcher's settings, else the arguments, else jax's cluster detection.

    Must run before anything touches a jax backend (devices, arrays, compilation).

    Args:
        coordinator_address: ``host:port`` of process 0's coordination service.
        num_processes: the job's size (number of processes).
        process_id: this process's index in the job.
        devices_per_process: on CPU, how many devices each process simulates
            (``jax_num_cpu_devices``).
        heartbeat_timeout: seconds without a heartbeat before a peer counts as lost
            (NOTE [lost processes]); default 10, or what the launcher set.
        initialization_timeout: seconds to wait for every process to join.
        program_check_timeout: seconds a process waits for the others to compile the
            same multi-process program (NOTE [program agreement]).

    Raises:
        RuntimeError: called twice, or after a jax backend was initialized.
        ValueError, TypeError: bad settings (from here or from jax).
    """
    global _job
    if _job is not None:
        raise RuntimeError("partitioner.distributed.initialize() was already called")
    env = os.environ
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR)
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if devices_per_process is None:
        devices_per_process = _env_int(ENV_DEVICES_PER_PROCESS)
    if heartbeat_timeout is None:
        heartbeat_timeout = float(env.get(ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT))
    agreement.set_timeout(program_check_timeout)
    if not heartbeat_timeout > 0:
        raise ValueError(f"initialize: heartbeat_timeout must be > 0, got {heartbeat_timeout}")
    if devices_per_process is not None:
        if not isinstance(devices_per_process, int) or devices_per_process <= 0:
            raise ValueError(
                f"initialize: devices_per_process must be a positive int, got {devices_per_process!r}"
            )
        jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        initialization_timeout=initialization_timeout,
        # jax's own detection aborts the process; ours raises first (NOTE [lost processes]).
        heartbeat_timeout_seconds=int(4 * heartbeat_timeout + 30),
    )
    job = _Job(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        heartbeat_timeout=heartbeat_timeout,
        grace=min(5.0, heartbeat_timeout),
        client=jp.distributed_client(),
    )
    _job = job
    if job.num_processes > 1:
        job.watcher = threading.Thread(
            target=_watch, args=(job,), name="partitioner-heartbeat", daemon=True
        )
        job.watcher.start()
        sys.excepthook = _name_the_lost_process(sys.excepthook)
        atexit.register(_bounded_exit)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"initialize: environment variable {name}={value!r} is not an int"
        ) from None


# --- the watchdog (NOTE [lost processes]) ---

_exiting = False  # the main thread is unwinding or in atexit: no asynchronous raise
_uncaught = False  # an exception reached the top level


def _watch(job: _Job) -> None:
    interval = job.heartbeat_timeout / 5
    others = [p for p in range(job.num_processes) if p != job.process_id]
    last: dict[int, tuple[str | None, float]] = {p: (None, time.monotonic()) for p in others}
    beat = 0
    while not job.lost and not job.stop.is_set():
        if jp.distributed_client() is not job.client:
            return  # jax.distributed.shutdown() ended the job (NOTE [exit in order])
        beat += 1
        now = time.monotonic()
        _set_heartbeat(job, "exited" if job.exited else str(beat))
        lost = []
        for p in others:
            value = _try_get(job, _HEARTBEAT_KEY.format(p))
            if value == "exited":
                last[p] = (value, now)
            elif value != last[p][0] and value is not None:
                last[p] = (value, now)
            elif now - last[p][1] > job.heartbeat_timeout:
                lost.append(p)
        if lost:
            _declare_lost(job, tuple(lost))
            return
        job.stop.wait(interval)


def _set_heartbeat(job: _Job, value: str) -> None:
    try:
        job.client.key_value_set(_HEARTBEAT_KEY.format(job.process_id), value, True)
    except Exception:  # the coordination service (process 0) is gone: its peers notice
        pass


def _try_get(job: _Job, key: str) -> str | None:
    try:
        return job.client.key_value_try_get(key)
    except Exception:  # not set yet, or the service is gone
        return None


def _declare_lost(job: _Job, lost: tuple[int, ...]) -> None:
    names = ", ".join(str(p) for p in lost)
    job.lost_message = (
        f"partitioner.distributed: process {names} of {job.num_processes} was lost: no "
        f"heartbeat for {job.heartbeat_timeout:g} s (it was killed, crashed or hangs). The job "
        f"cannot go on without it; process {job.process_id} stops too."
    )
    job.lost = lost
    if not _exiting:
        _raise_in_main_thread(ProcessLostError, job.lost_message, lost)
    # The main thread may be stuck in XLA (a collective waiting for the lost peer).
    timer = threading.Timer(job.grace, _exit_stuck, args=(job,))
    timer.daemon = True
    timer.start()


def _raise_in_main_thread(
    base: type[ProcessLostError], message: str, lost: tuple[int, ...]
) -> None:
    """Raise ``base(message, lost)`` in the main thread at its next Python instruction."""

    def __init__(self: ProcessLostError, *args: Any) -> None:
        base.__init__(self, message, lost)

    bound = type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})
    main = threading.main_thread().ident
    if main is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(bound))


def _exit_stuck(job: _Job) -> None:
    sys.stderr.write(f"{job.lost_message}\n(exiting: the main thread is blocked)\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_PEER_LOST)


def _name_the_lost_process(previous: Any) -> Any:
    """An excepthook that adds the lost process's name to an error it caused."""

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        global _exiting, _uncaught
        _exiting = _uncaught = True
        previous(kind, value, tb)
        job = _job
        if job is None or isinstance(value, ProcessLostError):
            return
        # A collective that failed because a peer died ("Connection closed by
        # peer") beats the watchdog: give it the time to name the peer.
        deadline = time.monotonic() + job.heartbeat_timeout * 1.5
        while not job.lost and time.monotonic() < deadline and "Jax" in kind.__name__:
            time.sleep(0.1)
        if job.lost:
            sys.stderr.write(job.lost_message + "\n")

    return hook


def _bounded_exit() -> None:
    """Wait for the other processes to finish too, but never for a lost one; then stop
    the watchdog (NOTE [exit in order]).

    jax's own shutdown then finds everybody and returns at once; with a lost peer
    it would wait minutes, so the process ends here instead.
    """
    global _exiting
    _exiting = True
    job = _job
    if job is None:
        return
    job.exited = True
    _finish_local_work()
    # After jax.distributed.shutdown() the job has already met in its shutdown barrier.
    if jp.distributed_client() is job.client and not _everybody_exited(job):
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1 if _uncaught else EXIT_PEER_LOST)
    _stop_watchdog(job)


def _finish_local_work() -> None:
    """Wait for every computation behind a live array before the job meets at exit.

    NOTE [exit in order]: a device still inside a cross-process collective (gloo
    connects its pairs through the coordination service) when the peers leave waits
    in jaxlib, and the CPU client's destructor at interpreter exit then joins that
    thread: the process hangs after its work is done. Results the program dropped
    cannot be waited on here; a program that leaves the job itself waits on its own.
    """
    for array in jax.live_arrays():
        try:
            array.block_until_ready()
        except Exception:  # a deleted or donated buffer: nothing left to wait on
            continue


def _everybody_exited(job: _Job) -> bool:
    """True once every other process is in its exit hook; False when one is lost."""
    _set_heartbeat(job, "exited")
    others = [p for p in range(job.num_processes) if p != job.process_id]
    while not job.lost:
        if all(_try_get(job, _HEARTBEAT_KEY.format(p)) == "exited" for p in others):
            return True
        time.sleep(0.05)
    return False


def _stop_watchdog(job: _Job) -> None:
    """End the watchdog thread and wait for it: it must not be inside a jaxlib call when
    Python finalizes (NOTE [exit in order])."""
    job.stop.set()
    watcher = job.watcher
    if watcher is None or watcher is threading.current_thread():
        return
    # One round of the watchdog is a few key-value calls to a service every process
    # still reaches; the bound only keeps a hung service from hanging the exit.
    watcher.join(timeout=job.heartbeat_timeout)
    if watcher.is_alive():
        sys.stderr.write(
            "partitioner.distributed: the heartbeat thread is still waiting for the "
            "coordination service at exit\n"
        )
