"""Worker: a job whose watchdog spends most of its time inside jaxlib, then exits.

Each time the heartbeat thread reads a peer's heartbeat, it first waits ``SLOW``
(0.4 of the heartbeat timeout) inside a real jaxlib call: a blocking get of a key
nobody sets, as a call to the coordination service can take on a loaded machine.
When the main thread finishes, the watchdog is then most likely inside jaxlib: the
moment that aborted a finished process at interpreter exit (NOTE [exit in order] in
``partitioner/_src/distributed/cluster.py``). Prints ``saved`` at the end, like the
save job, after a collective over both processes.
"""

from __future__ import annotations

import threading
from typing import Any

import partitioner.distributed as pd
from partitioner._src.distributed import cluster
from tests.distributed.workers.collective import say, sum_over_the_job

#: The share of the heartbeat timeout each heartbeat read spends inside jaxlib.
SLOW = 0.4


def slow_reads() -> None:
    """Make the heartbeat thread's reads wait inside jaxlib first (not the main thread's)."""
    read = cluster._try_get
    job = cluster._job
    assert job is not None
    wait_ms = int(SLOW * job.heartbeat_timeout * 1000)

    def slow_try_get(job: Any, key: str) -> str | None:
        if threading.current_thread().name == "partitioner-heartbeat":
            try:
                job.client.blocking_key_value_get("slow-heartbeat/never-set", wait_ms)
            except Exception:  # DEADLINE_EXCEEDED: the wait was the point
                pass
        return read(job, key)

    cluster._try_get = slow_try_get


def main() -> None:
    pd.initialize()
    slow_reads()
    sum_over_the_job()
    say("saved")


if __name__ == "__main__":
    main()
