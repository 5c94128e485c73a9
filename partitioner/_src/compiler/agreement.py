"""Every process of a multi-process program compiles the same program.

NOTE [program agreement]: a program over a mesh spanning processes is one SPMD
program that every process must run with the same shapes, dtypes and layouts.
If one process passes a (16, 8) array where another passes (8, 8), their
collectives disagree on sizes and gloo kills the process ("Received data size
doesn't match expected size") or waits forever. So before compiling such a
program, each process publishes a summary of it (name, input and output avals
with their specs) in the coordination service's key-value store under its
sequence number among this process's multi-process compiles, and compares it
with every other process's. SPMD jobs compile the same programs in the same
order, so the k-th summaries must be equal; a difference is a ``ValueError``
naming both processes and both summaries. A process that does not arrive within
the timeout (it compiles something else, or never gets there) is a
``TimeoutError``; a process that died is reported by the lost-process watchdog
(NOTE [lost processes]) while this one waits.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import jax

from .. import jax_private as jp
from ..lower.module import LoweredModule

_KEY = "partitioner/program/{}/{}"
_count = itertools.count()
_lock = threading.Lock()
_timeout_s = 300.0


def set_timeout(seconds: float) -> None:
    """How long a process waits for the others to reach the same compile."""
    global _timeout_s
    if not seconds > 0:
        raise ValueError(f"program agreement timeout must be > 0 seconds, got {seconds}")
    _timeout_s = float(seconds)


def spans_processes(lowered: LoweredModule) -> bool:
    me = jax.process_index()
    return any(d.process_index != me for d in lowered.mesh.devices.flat)


def summary(lowered: LoweredModule) -> str:
    """What every process must agree on: the program's name and its typed, laid-out signature."""

    def side(avals: Any, specs: Any) -> str:
        return ", ".join(
            f"{aval.str_short()}@{spec.describe() if spec is not None else 'auto'}"
            for aval, spec in zip(avals, specs, strict=True)
        )

    return (
        f"{lowered.name}({side(lowered.in_avals, lowered.in_specs)}) -> "
        f"({side(lowered.out_avals, lowered.out_specs)}) on mesh {dict(lowered.mesh.shape)}"
    )


def check_same_program(lowered: LoweredModule) -> None:
    """NOTE [program agreement]; a no-op unless the program spans processes.

    Raises:
        ValueError: another process compiled a different program at this point.
        TimeoutError: another process did not get here within the timeout.
    """
    if not spans_processes(lowered):
        return
    check_agreement(
        f"{lowered.api} {lowered.name}",
        "program",
        summary(lowered),
        f"Every process must call a multi-process {lowered.api} with the same shapes, dtypes "
        "and specs (each passes the *global* value, or builds it with host_local_to_global).",
    )


def check_agreement(api: str, what: str, mine: str, fix: str) -> None:
    """Every process of the job reached this point with the same ``mine`` (a summary of ``what``).

    The k-th check of each process is compared with the k-th of every other
    (NOTE [program agreement]), so all processes raise, none waits forever.

    Raises:
        ValueError: another process's summary differs (``fix`` says what to do).
        TimeoutError: another process did not get here within the timeout.
    """
    client = jp.distributed_client()
    me, n = jax.process_index(), jax.process_count()
    with _lock:
        k = next(_count)
    client.key_value_set(_KEY.format(k, me), mine)
    deadline = time.monotonic() + _timeout_s
    for other in range(n):
        if other == me:
            continue
        theirs = _wait_for(client, _KEY.format(k, other), deadline)
        if theirs is None:
            raise TimeoutError(
                f"{api}: process {other} did not reach its check number {k} within "
                f"{_timeout_s:g} s (this process {me} has the {what} {mine}). Every process "
                "must run the same multi-process calls in the same order."
            )
        if theirs != mine:
            raise ValueError(
                f"{api}: the processes do not agree on the {what}. Process {me} has\n  {mine}\n"
                f"but process {other} has\n  {theirs}\n{fix}"
            )


def _wait_for(client: Any, key: str, deadline: float) -> str | None:
    # Short waits, so the lost-process watchdog's exception can land in between.
    while time.monotonic() < deadline:
        try:
            return str(client.blocking_key_value_get(key, 1000))
        except Exception:  # not there yet (DEADLINE_EXCEEDED)
            continue
    return None
