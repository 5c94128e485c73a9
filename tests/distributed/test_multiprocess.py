"""pjit over meshes that span processes: features, training, faults.

Each test starts a job of 2 (one test 4) local processes through
``python -m partitioner.launch`` (``mp_helpers.run_job``: bounded by ``timeout -k``,
no orphans, localhost only) and reads what the processes printed.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from tests.distributed.mp_helpers import explain, lines_of, run_job, values
from tests.distributed.workers.train_step import SPECS, STEPS, batch, init_params, train_step

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes


def test_every_pjit_feature_runs_across_two_processes() -> None:
    proc = run_job("features")
    assert proc.returncode == 0, explain(proc)
    expected = {
        "numpy inputs",
        "global array inputs",
        "cached calls on the fast path",
        "static args",
        "donation",
        "lower().compile()",
        "grad",
        "vmap",
        "nested pjit and constraints",
    }
    for process in (0, 1):
        lines = lines_of(proc.stdout, process)
        assert expected <= {line[3:] for line in lines if line.startswith("OK ")}, explain(proc)
        assert any(line.startswith("OK residuals") for line in lines)
        assert "DONE" in lines
    # Host callbacks fire on the process that owns the device: the global tap on
    # process 0 (device 0), each process's tap_with_device on its own 4 devices.
    assert values(proc.stdout, 0, "TAPS") == ["1 own-devices"], explain(proc)
    assert values(proc.stdout, 1, "TAPS") == ["0 own-devices"], explain(proc)
    # tap_with_device without per_shard: one tap of the whole value, on device 0.
    assert values(proc.stdout, 0, "WHOLE") == ["[0]"], explain(proc)
    assert values(proc.stdout, 1, "WHOLE") == ["[]"], explain(proc)


def _reference_losses() -> list[float]:
    """The same steps in this (single, 8-device) process, on a 2x4 mesh."""
    devices = np.array(jax.devices()).reshape(2, 4)
    with partitioner.mesh(devices, ("data", "model")):
        step = partitioner.pjit(train_step, (SPECS, P("data"), P("data")), (SPECS, None))
        params, (x, y) = init_params(), batch()
        losses = []
        for _ in range(STEPS):
            params, loss = step(params, x, y)
            losses.append(float(loss))
    return losses


@pytest.mark.parametrize(("n", "devices_per_process"), [(2, 4), (4, 2)])
def test_train_matches_one_process(n: int, devices_per_process: int) -> None:
    proc = run_job("train", n=n, devices_per_process=devices_per_process)
    assert proc.returncode == 0, explain(proc)
    got = dict(line.split(" ") for line in values(proc.stdout, 0, "LOSS"))
    losses = [float(got[str(i)]) for i in range(STEPS)]
    np.testing.assert_allclose(losses, _reference_losses(), rtol=0, atol=1e-6)
    assert all("DONE" in lines_of(proc.stdout, i) for i in range(n))


def test_a_killed_process_is_named_by_the_others_within_the_heartbeat_timeout() -> None:
    heartbeat = 3.0
    start = time.time()
    proc = run_job("die", heartbeat_timeout=heartbeat, grace=20.0, timeout=90)
    ended = time.time()
    assert proc.returncode == 128 + 9, explain(proc)  # the first failure: SIGKILL
    assert "process 1 failed" in proc.stderr and "signal SIGKILL (killed)" in proc.stderr
    survivor = "\n".join(lines_of(proc.stderr, 0))
    assert "process 1 of 2 was lost" in survivor, explain(proc)
    assert "NOT REACHED" not in proc.stdout
    killed = float(values(proc.stdout, 1, "KILLED")[0])
    # Process 0 stopped on its own (before the launcher's 20 s grace), within the
    # heartbeat timeout plus the watchdog's reaction and the job's teardown.
    assert ended - killed < heartbeat + 10, (ended - killed, explain(proc))
    assert "stopping the processes still running" not in proc.stderr
    print(
        f"lost process noticed and the job ended {ended - killed:.1f} s after the kill "
        f"(job took {ended - start:.1f} s)"
    )


def test_a_mismatched_program_is_a_clear_error_not_a_hang() -> None:
    proc = run_job("mismatch", timeout=90)
    assert proc.returncode == 1, explain(proc)
    for process in (0, 1):
        err = "\n".join(lines_of(proc.stderr, process))
        assert "the processes do not agree on the program" in err, explain(proc)
        assert "float32[8,8]" in err and "float32[16,8]" in err
    assert "RESULT" not in proc.stdout


def test_the_readme_example_matches_jax_jit_on_the_whole_data() -> None:
    proc = run_job("examples/multiprocess_train.py")
    assert proc.returncode == 0, explain(proc)
    x = np.sin(np.arange(64, dtype=np.float32)[:, None] + np.arange(16, dtype=np.float32))
    w = np.full((16, 8), 0.1, np.float32)

    @jax.jit
    def step(w: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(lambda w: jax.numpy.mean(jax.numpy.tanh(x @ w) ** 2))(w)
        return w - 0.5 * g, loss

    want = []
    for _ in range(5):
        w, loss = step(w, x)
        want.append(f"{float(loss):.6f}")
    for process in (0, 1):
        got = [
            line.split()[-1] for line in lines_of(proc.stdout, process) if line.startswith("step ")
        ]
        assert got == want, explain(proc)
        assert "my block of x: (32, 16) of (64, 16)" in lines_of(proc.stdout, process)
