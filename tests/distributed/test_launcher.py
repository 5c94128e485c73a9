"""``python -m partitioner.launch`` on its own: prefixes, exit status, stopping, no orphans.

The children here are plain Python (no jax), so each test takes about a second;
every launcher is bounded by ``timeout -k`` and every child it started is checked
to be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.distributed.mp_helpers import ROOT, child_env, launcher_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes


def _launch(code: str, *flags: str, timeout: float = 60) -> subprocess.Popen[str]:
    return subprocess.Popen(
        launcher_command(timeout, list(flags), [sys.executable, "-c", textwrap.dedent(code)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def _all_gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every pid has stopped within ``within`` seconds (a loaded machine is slow)."""
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(pid) for pid in pids)


def _pids(stdout: str) -> list[int]:
    return [int(line.split()[-1]) for line in stdout.splitlines() if " PID " in line]


def _two_pids(proc: subprocess.Popen[str]) -> list[int]:
    """The pids the launcher's two children print first (within 30 s)."""
    pids: list[int] = []
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while len(pids) < 2 and time.monotonic() < deadline:
        pids += _pids(proc.stdout.readline())
    assert len(pids) == 2
    return pids


def test_prefixes_every_line_and_sets_the_environment() -> None:
    proc = _launch(
        """
        import os, sys
        env = {k: v for k, v in os.environ.items() if k.startswith("PARTITIONER_")}
        print("id", env["PARTITIONER_PROCESS_ID"], "of", env["PARTITIONER_NUM_PROCESSES"])
        print("devices", env["PARTITIONER_DEVICES_PER_PROCESS"], env["PARTITIONER_COORDINATOR_ADDRESS"][:10])
        print("to stderr", file=sys.stderr)
        """,
        "-n",
        "3",
        "--devices-per-process",
        "2",
    )
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    for i in range(3):
        assert f"[{i}] id {i} of 3" in out.splitlines()
        assert f"[{i}] devices 2 127.0.0.1:" in out.splitlines()
        assert f"[{i}] to stderr" in err.splitlines()


def test_returns_the_first_failure_and_stops_the_others() -> None:
    proc = _launch(
        """
        import os, sys, time
        print("PID", os.getpid(), flush=True)
        if os.environ["PARTITIONER_PROCESS_ID"] == "1":
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(600)  # never notices: the launcher must stop it
        """,
        "-n",
        "2",
        "--grace",
        "1",
    )
    start = time.monotonic()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err
    assert "process 1 failed" in err and "exit status 3" in err
    assert "stopping the processes still running: 0" in err
    assert time.monotonic() - start < 30
    assert _all_gone(_pids(out))


def test_a_signal_death_is_reported_as_128_plus_the_signal() -> None:
    proc = _launch(
        """
        import os, signal
        if os.environ["PARTITIONER_PROCESS_ID"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        """,
        "-n",
        "2",
    )
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "process 0 failed" in err and "signal SIGKILL (killed)" in err


def test_sigterm_to_the_launcher_stops_every_process() -> None:
    proc = _launch(
        """
        import os, time
        print("PID", os.getpid(), flush=True)
        time.sleep(600)
        """,
        "-n",
        "2",
    )
    pids = _two_pids(proc)
    proc.send_signal(signal.SIGTERM)  # to `timeout`, which passes it on to the launcher
    _, err = proc.communicate(timeout=60)
    assert "interrupted: stopping every process" in err  # the launcher stopped them itself
    assert proc.returncode == 130
    assert _all_gone(pids)


def test_a_second_sigterm_while_stopping_does_not_cut_the_stopping_short() -> None:
    """`timeout` forwards its SIGTERM twice; one arriving while the launcher waits for
    children that ignore SIGTERM must not end the launcher before it has killed them."""
    proc = _launch(
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("PID", os.getpid(), flush=True)
        time.sleep(600)
        """,
        "-n",
        "2",
    )
    pids = _two_pids(proc)
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:  # timeout's child
        (launcher,) = (int(p) for p in f.read().split())
    os.kill(launcher, signal.SIGTERM)
    time.sleep(1.0)  # the launcher is now waiting up to 3 s before SIGKILL
    os.kill(launcher, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "interrupted: stopping every process" in err
    assert proc.returncode == 130, err  # not a second interrupt's death (-2 via timeout)
    assert _all_gone(pids)


def test_children_die_with_a_killed_launcher() -> None:
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "partitioner.launch",
            "-n",
            "2",
            "--",
            sys.executable,
            "-c",
            "import os, time; print('PID', os.getpid(), flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    pids = _two_pids(launcher)
    launcher.kill()  # SIGKILL: no chance to clean up
    launcher.wait(timeout=10)
    assert _all_gone(pids)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-n", "0"], "-n must be >= 1"),
        (["-n", "2", "--devices-per-process", "0"], "--devices-per-process must be >= 1"),
    ],
)
def test_bad_arguments_are_clear_errors(flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "partitioner.launch", *flags, "--", "true"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 2 and message in proc.stderr
