"""Running a multi-process job from a test: the launcher, bounded in time.

Every job goes through ``python -m partitioner.launch`` under ``timeout -k``: the
launcher stops its processes when one fails or when ``timeout`` stops it, and each
child dies with the launcher (``PR_SET_PDEATHSIG``), so a test never leaves an
orphan. Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def run_job(
    worker: str,
    *args: str,
    n: int = 2,
    devices_per_process: int = 4,
    timeout: float = 120,
    heartbeat_timeout: float = 3.0,
    grace: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``workers/<worker>.py args`` (or ``worker``, a path under the repository root,
    e.g. ``examples/x.py``) as ``n`` processes; return the launcher's result."""
    flags = ["-n", str(n), "--devices-per-process", str(devices_per_process)]
    flags += ["--heartbeat-timeout", str(heartbeat_timeout)]
    if grace is not None:
        flags += ["--grace", str(grace)]
    script = ROOT / worker if worker.endswith(".py") else WORKERS / f"{worker}.py"
    return subprocess.run(
        launcher_command(timeout, flags, [sys.executable, str(script), *args]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=timeout + 30,
    )


def launcher_command(timeout: float, flags: list[str], command: list[str]) -> list[str]:
    """``python -m partitioner.launch FLAGS -- COMMAND``, bounded by ``timeout -k``."""
    launcher = [sys.executable, "-m", "partitioner.launch", *flags, "--", *command]
    return ["timeout", "-k", "5", str(timeout), *launcher]


def child_env() -> dict[str, str]:
    """The test's environment, with the repository importable."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


def lines_of(output: str, process: int) -> list[str]:
    """The lines process ``process`` printed, without the launcher's ``[i] `` prefix."""
    prefix = f"[{process}] "
    return [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]


def values(output: str, process: int, key: str) -> list[str]:
    """The rest of each line ``key ...`` process ``process`` printed."""
    return [
        line[len(key) + 1 :] for line in lines_of(output, process) if line.startswith(key + " ")
    ]


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    """A failed job's exit status and the tails of its output, for an assertion message."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
