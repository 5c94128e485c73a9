"""colocated_python over 2 processes x 4 devices: semantics and the loader example;
the drop-in's objects, threads, nesting, memory kinds and strings.

Each test starts a job through ``python -m partitioner.launch`` (``mp_helpers.run_job``:
bounded by ``timeout -k``, no orphans, localhost only) and reads what the
processes printed; the single-process semantics are in tests/colocated/test_colocated.py.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from tests.distributed.mp_helpers import explain, lines_of, run_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes

CHECKS = [
    "discovery call on the host-local part",
    "once per call per process, outputs assembled into global arrays",
    "asynchronous, in call order",
    "an error surfaces on the process that raised, later calls are clean",
    "no inputs, specialized devices and out_specs_fn",
    "outputs that disagree with out_specs_fn",
    "typed PRNG keys out, assembled",
    "non-jax.Array input",
    "colocated_cpu_devices",
    "a colocated object per process, its calls in order",
    "calls from two threads run at once",
    "nested calls across device lists finish",
    "outputs keep their memory kind",
    "string outputs on this process's devices; a clear error over processes",
]


def test_every_semantic_across_two_processes() -> None:
    proc = run_job("colocated")
    assert proc.returncode == 0, explain(proc)
    for process in (0, 1):
        lines = lines_of(proc.stdout, process)
        assert [line[3:] for line in lines if line.startswith("OK ")] == CHECKS, explain(proc)
        assert lines[-1] == "DONE"


def test_the_per_host_loader_example_matches_jax_jit_on_the_whole_data() -> None:
    proc = run_job("examples/colocated_loader.py")
    assert proc.returncode == 0, explain(proc)

    def whole_batch(step: int) -> np.ndarray:
        index = np.arange(64, dtype=np.float32)[:, None] + 64 * step
        return np.sin(index + np.arange(16, dtype=np.float32))

    @jax.jit
    def step(w: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(lambda w: jax.numpy.mean(jax.numpy.tanh(x @ w) ** 2))(w)
        return w - 0.5 * g, loss

    w = np.full((16, 8), 0.1, np.float32)
    want = []
    for i in range(5):
        w, loss = step(w, whole_batch(i))
        want.append(f"{float(loss):.6f}")
    for process in (0, 1):
        lines = lines_of(proc.stdout, process)
        got = [line.split()[-1] for line in lines if line.startswith("step ")]
        assert got == want, explain(proc)
        assert "batch (64, 16) P('data',)" in lines, explain(proc)
