"""README's first command runs ``examples/quickstart.py``: it must run as written.

A subprocess, as a newcomer runs it (bounded in time; it checks its own losses and
parameters against jax.jit and exits non-zero if they differ).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.clients.clients_helpers import EXAMPLES

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes


def test_the_quickstart_runs_and_agrees_with_jax_jit() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "pjit and jax.jit agree" in done.stdout
    assert "sdy.sharding" in done.stdout and "mhlo.sharding" in done.stdout, done.stdout
