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
import numpy as np
from jax.experimental import multihost_utils

import partitioner.distributed as pd


def main(seconds: str) -> None:
    pd.initialize()
    total = multihost_utils.process_allgather(np.array([jax.process_index()]), tiled=True)
    assert total.tolist() == list(range(jax.process_count())), total
    jax.distributed.shutdown()
    time.sleep(float(seconds))  # stands for local work after the job: writing a report
    print("saved")


if __name__ == "__main__":
    main(*sys.argv[1:])
