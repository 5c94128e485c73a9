"""pmap over the devices of every process, each process passing its local slice.

Jobs of 2 processes x 4 devices through ``mp_helpers.run_job`` (bounded by
``timeout -k``, no orphans, localhost only); the values are checked inside the
workers against numpy on the whole (global) data.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.mp_helpers import explain, lines_of, run_job, values

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes


def test_pmap_maps_over_every_device_of_the_job() -> None:
    proc = run_job("pmap_local")
    assert proc.returncode == 0, explain(proc)
    expected = {
        "local slices over the whole job",
        "outputs as inputs",
        "devices across processes",
        "broadcast arguments",
    }
    for process in (0, 1):
        lines = lines_of(proc.stdout, process)
        assert expected <= {line[3:] for line in lines if line.startswith("OK ")}, explain(proc)


def test_mismatched_local_slices_are_a_clear_error_in_every_process() -> None:
    proc = run_job("pmap_local", "mismatch", timeout=90)
    assert proc.returncode == 0, explain(proc)
    for process in (0, 1):
        (message,) = values(proc.stdout, process, "MISMATCH")
        assert "do not agree on the local slices" in message, explain(proc)
        assert "float32[4]@0" in message and "float32[3]@0" in message


def test_the_pmap_example_sums_over_eight_devices() -> None:
    proc = run_job("examples/pmap_multiprocess.py")
    assert proc.returncode == 0, explain(proc)
    x = np.arange(8, dtype=np.float32)
    for process in (0, 1):
        lines = lines_of(proc.stdout, process)
        mine = x[process * 4 : (process + 1) * 4]
        assert f"my shares: {np.round(mine / x.sum(), 4).tolist()}" in lines, explain(proc)
        assert f"my positions: {list(range(process * 4, process * 4 + 4))}" in lines
        assert f"all values: {x.tolist()}" in lines
