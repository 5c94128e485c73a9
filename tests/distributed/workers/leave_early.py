"""Worker: leave the job with ``jax.distributed.shutdown()``, then keep working alone.

``leave_early.py SECONDS``: after a collective over both processes, each one shuts its
distributed client down (jax's way to leave a job in order) and works on alone for
``SECONDS`` (longer than the heartbeat timeout), then prints ``saved``. The peers
fall silent when they leave; that is not a lost process.
"""

from __future__ import annotations

import sys
import time

import jax

import partitioner.distributed as pd
from tests.distributed.workers.collective import say, sum_over_the_job


def main(seconds: str) -> None:
    pd.initialize()
    sum_over_the_job()  # waited for on every local device before leaving
    jax.distributed.shutdown()
    time.sleep(float(seconds))  # stands for local work after the job: writing a report
    say("saved")


if __name__ == "__main__":
    main(*sys.argv[1:])
