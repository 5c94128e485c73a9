"""``python -m partitioner.launch``: N local processes forming one job.

NOTE [launcher environment]: each child gets ``PARTITIONER_COORDINATOR_ADDRESS``
(``127.0.0.1:<free port>``), ``PARTITIONER_NUM_PROCESSES``, ``PARTITIONER_PROCESS_ID``,
``PARTITIONER_DEVICES_PER_PROCESS`` (when given) and ``PARTITIONER_HEARTBEAT_TIMEOUT``;
``partitioner.distributed.initialize()`` reads them. Nothing else is special about
the children: the same script runs under a cluster's own launcher, where
``initialize()`` falls back to jax's cluster detection.

Each child runs in its own session (process group), so stopping it stops whatever
it started. Every line a child prints is prefixed with ``[i]`` (stdout to stdout,
stderr to stderr). When a child fails, the launcher reports which and why, gives
the others ``--grace`` seconds to notice (they raise a ``ProcessLostError``), then
stops them: SIGTERM, and SIGKILL shortly after (jax catches SIGTERM once
distributed). Ctrl-C stops them all the same way. The exit status is the first
failure's (128 + signal number for a signal), else 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from . import cluster

#: Seconds between SIGTERM and SIGKILL when stopping a child.
_KILL_AFTER = 3.0


def free_port() -> int:
    """A TCP port free on localhost now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def describe(returncode: int) -> str:
    """``"exit status 3"`` or ``"signal SIGKILL (killed)"``."""
    if returncode >= 0:
        return f"exit status {returncode}"
    sig = -returncode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    why = {"SIGKILL": " (killed)", "SIGSEGV": " (crashed)", "SIGABRT": " (aborted)"}.get(name, "")
    return f"signal {name}{why}"


def exit_status(returncode: int) -> int:
    """The shell's convention: a signal n becomes 128 + n."""
    return returncode if returncode >= 0 else 128 - returncode


class _Child:
    def __init__(self, index: int, command: Sequence[str], env: dict[str, str]) -> None:
        self.index = index
        self.proc = subprocess.Popen(
            list(command),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: stopping it stops its children
            preexec_fn=_die_with_the_launcher,
        )
        self.pumps = [
            threading.Thread(target=_pump, args=(self.proc.stdout, sys.stdout, index), daemon=True),
            threading.Thread(target=_pump, args=(self.proc.stderr, sys.stderr, index), daemon=True),
        ]
        for pump in self.pumps:
            pump.start()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def _die_with_the_launcher() -> None:
    """In the child, before exec: a SIGKILL when the launcher dies (Linux), so no orphans."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1
_write_lock = threading.Lock()


def _pump(source: IO[bytes] | None, sink: IO[str], index: int) -> None:
    assert source is not None
    for raw in iter(source.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with _write_lock:
            sink.write(f"[{index}] {line}\n")
            sink.flush()


def _report(message: str) -> None:
    with _write_lock:
        sys.stderr.write(f"partitioner.launch: {message}\n")
        sys.stderr.flush()


def launch(
    command: Sequence[str],
    num_processes: int,
    devices_per_process: int | None = None,
    heartbeat_timeout: float = cluster.DEFAULT_HEARTBEAT_TIMEOUT,
    grace: float | None = None,
) -> int:
    """Run ``command`` as ``num_processes`` processes of one job; return the exit status.

    Raises:
        ValueError: ``num_processes`` or ``devices_per_process`` not positive, or an
            empty command.
    """
    if num_processes < 1:
        raise ValueError(f"partitioner.launch: -n must be >= 1, got {num_processes}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ValueError(
            f"partitioner.launch: --devices-per-process must be >= 1, got {devices_per_process}"
        )
    if not command:
        raise ValueError("partitioner.launch: no command given (put it after --)")
    grace = heartbeat_timeout + 10.0 if grace is None else grace
    base = dict(os.environ)
    base[cluster.ENV_COORDINATOR] = f"127.0.0.1:{free_port()}"
    base[cluster.ENV_NUM_PROCESSES] = str(num_processes)
    base[cluster.ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout)
    base.setdefault("PYTHONUNBUFFERED", "1")  # lines arrive as they are printed
    if devices_per_process is not None:
        base[cluster.ENV_DEVICES_PER_PROCESS] = str(devices_per_process)
        base.setdefault("JAX_PLATFORMS", "cpu")
        # A forced host device count (say, a test session's 8) would override it.
        flags = base.get("XLA_FLAGS", "").split()
        base["XLA_FLAGS"] = " ".join(
            f for f in flags if not f.startswith("--xla_force_host_platform_device_count")
        )
    children: list[_Child] = []
    # `timeout` (or a scheduler) stops the launcher with SIGTERM: stop the job too. The
    # handler goes in before the first child starts: a SIGTERM that arrived between the
    # two would kill the launcher and leave the stopping to PDEATHSIG (Linux only).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for i in range(num_processes):
            children.append(_Child(i, command, {**base, cluster.ENV_PROCESS_ID: str(i)}))
        return _supervise(children, grace)
    except KeyboardInterrupt:
        _report("interrupted: stopping every process")
        _stop(children)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in children:
            for pump in child.pumps:
                pump.join(timeout=2.0)


def _interrupt(signum: int, frame: object) -> None:
    # Stop once: `timeout` sends its SIGTERM twice (to the launcher, then to its process
    # group), and a second KeyboardInterrupt inside the stopping would abandon it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _supervise(children: list[_Child], grace: float) -> int:
    start = time.monotonic()
    first_failure: int | None = None
    deadline = None
    while True:
        running = [c for c in children if c.proc.poll() is None]
        for c in children:
            code = c.proc.returncode
            if code is not None and code != 0 and first_failure is None:
                first_failure = code
                _report(
                    f"process {c.index} failed after {time.monotonic() - start:.1f} s: "
                    f"{describe(code)}; the others get {grace:g} s to stop"
                )
                deadline = time.monotonic() + grace
        if not running:
            break
        if deadline is not None and time.monotonic() > deadline:
            _report(
                "stopping the processes still running: " + ", ".join(str(c.index) for c in running)
            )
            _stop(running)
            break
        time.sleep(0.05)
    for c in children:
        if c.proc.returncode not in (0, None) and c.proc.returncode != first_failure:
            _report(f"process {c.index}: {describe(c.proc.returncode)}")
    return 0 if first_failure is None else exit_status(first_failure)


def _stop(children: list[_Child]) -> None:
    for c in children:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + _KILL_AFTER
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in children):
        time.sleep(0.05)
    for c in children:
        if c.proc.poll() is None:
            c.signal(signal.SIGKILL)
        c.proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m partitioner.launch",
        description="Run a command as N local processes of one jax.distributed job.",
    )
    parser.add_argument("-n", "--num-processes", type=int, required=True)
    parser.add_argument(
        "--devices-per-process", type=int, default=None, help="CPU devices each process simulates"
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=cluster.DEFAULT_HEARTBEAT_TIMEOUT,
        help="seconds without a heartbeat before a process counts as lost",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=None,
        help="seconds the others get to stop after one fails (default: heartbeat timeout + 10)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return launch(
            command,
            args.num_processes,
            args.devices_per_process,
            args.heartbeat_timeout,
            args.grace,
        )
    except ValueError as e:
        parser.error(str(e))
        return 2
