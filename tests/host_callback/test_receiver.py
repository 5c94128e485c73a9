"""The tap receiver: bounded bytes, back pressure, errors, shutdown (seed 004).

Subprocess tests bound each child in time (``subprocess.run(timeout=)`` kills it)
and talk to nobody.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from partitioner.host_callback import (
    TapFunctionException,
    barrier_wait,
    configure_receiver,
    id_tap,
    outfeed_receiver,
    receiver_stats,
)
from tests.helpers import devices

ROOT = Path(__file__).resolve().parents[2]


def test_slow_consumer_keeps_the_queue_under_cap_plus_one_payload(partitioner_mode) -> None:
    cap, payload = 1 << 20, 100 << 10  # 1 MiB cap, 100 KiB taps
    n = 60
    seen: list[int] = []

    def slow(x: Any, transforms: Any) -> None:
        time.sleep(0.005)
        seen.append(int(x[0]))

    def f(x: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            return id_tap(slow, x + i.astype(x.dtype), result=x)

        return jax.lax.fori_loop(0, n, body, x)

    x = np.zeros(payload // 4, np.float32)  # 100 KiB of float32
    with outfeed_receiver(max_queue_bytes=cap), partitioner.mesh(devices(8), ("x",)):
        pjit(f, P("x"), P("x"))(x)
        barrier_wait()
        stats = receiver_stats()
    assert seen == list(range(n))  # nothing lost, in order
    assert stats["taps_delivered"] == n and stats["queued_bytes"] == 0
    # Back pressure held: never more than the cap and one payload; and it was needed.
    assert cap <= stats["peak_queued_bytes"] <= cap + payload, stats


def test_slow_consumer_of_device_taps_stays_under_cap_plus_one_round(partitioner_mode) -> None:
    cap, shard = 1 << 20, 100 << 10  # 1 MiB cap; 100 KiB per device, 800 KiB a round
    n = 20
    seen: list[tuple[int, int]] = []

    def slow(x: Any, transforms: Any, device: Any) -> None:
        time.sleep(0.002)
        seen.append((int(x[0]), device.id))

    def f(x: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            return id_tap(
                slow, x + i.astype(x.dtype), result=x, tap_with_device=True, per_shard=True
            )

        return jax.lax.fori_loop(0, n, body, x)

    x = np.zeros(8 * shard // 4, np.float32)
    with outfeed_receiver(max_queue_bytes=cap), partitioner.mesh(devices(8), ("x",)):
        pjit(f, P("x"), P("x"))(x)
        barrier_wait()
        stats = receiver_stats()
    assert seen == [(i, d) for i in range(n) for d in range(8)]
    assert cap <= stats["peak_queued_bytes"] <= cap + 8 * shard, stats


def test_tap_errors_are_counted_raised_at_the_barrier_and_later_taps_run() -> None:
    seen: list[float] = []

    def tap(x: Any, transforms: Any) -> None:
        if x in (2.0, 4.0):
            raise ZeroDivisionError(f"bad value {x}")
        seen.append(float(x))

    f = jax.jit(lambda x: id_tap(tap, x) * 2)
    before = receiver_stats()["tap_exceptions"]
    for i in range(6):
        f(np.float32(i))
    with pytest.raises(TapFunctionException, match="2 tap or call function") as info:
        barrier_wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "bad value 2.0" in str(info.value.__cause__)
    assert seen == [0.0, 1.0, 3.0, 5.0]
    assert receiver_stats()["tap_exceptions"] == before + 2
    barrier_wait()  # reported once


def test_tap_errors_are_raised_at_receiver_exit() -> None:
    def tap(x: Any, transforms: Any) -> None:
        raise ValueError("from the tap")

    with pytest.raises(TapFunctionException) as info, outfeed_receiver():
        jax.jit(lambda x: id_tap(tap, x))(np.ones(2))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_tap_function_may_call_jax(partitioner_mode) -> None:
    double = jax.jit(lambda v: v * 2)
    got: list[np.ndarray] = []

    def tap(x: Any, transforms: Any) -> None:
        got.append(np.asarray(double(jnp.asarray(x))))

    with outfeed_receiver(max_queue_bytes=64), partitioner.mesh(devices(8), ("x",)):
        f = pjit(lambda x: id_tap(tap, x + 1), P("x"), P("x"))
        for i in range(30):  # a tiny cap: producers wait on the consumer throughout
            f(np.arange(8.0) + i)
        barrier_wait()
    assert len(got) == 30
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, (np.arange(8.0) + i + 1) * 2)


def test_barrier_wait_inside_a_tap_function_is_an_error_not_a_hang() -> None:
    def tap(x: Any, transforms: Any) -> None:
        barrier_wait()

    id_tap(tap, np.ones(1))
    with pytest.raises(TapFunctionException) as info:
        barrier_wait()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "inside a tap function" in str(info.value.__cause__)


def test_outfeed_receiver_is_restartable_and_stats_are_per_receiver() -> None:
    for round_ in range(2):
        seen: list[int] = []
        with outfeed_receiver(receiver_name=f"round{round_}", max_queue_bytes=1 << 16):
            f = jax.jit(lambda x, seen=seen: id_tap(lambda v, transforms: seen.append(int(v)), x))
            for i in range(5):
                f(np.int32(i))
        assert seen == list(range(5))  # exit drained the receiver
        assert receiver_stats()["taps_delivered"] == 0  # it stopped; none runs now
    id_tap(lambda v, transforms: None, np.ones(1))  # a later tap starts the default again
    barrier_wait()
    stats = receiver_stats()
    assert set(stats) == {"taps_delivered", "queued_bytes", "peak_queued_bytes", "tap_exceptions"}
    assert stats["taps_delivered"] >= 1


def test_configure_receiver_sets_the_cap_of_later_receivers() -> None:
    try:
        configure_receiver(max_queue_bytes=4096)
        big = np.zeros(10_000, np.float32)  # one payload over the cap: still admitted
        seen: list[int] = []
        for _ in range(3):
            id_tap(lambda v, transforms: seen.append(v.nbytes), big)
        barrier_wait()
        assert seen == [40_000] * 3
        assert receiver_stats()["peak_queued_bytes"] <= 4096 + 40_000
    finally:
        configure_receiver(max_queue_bytes=256 << 20)


def test_receiver_bad_settings_are_clear_errors() -> None:
    with (
        pytest.raises(ValueError, match="max_queue_bytes must be positive"),
        outfeed_receiver(max_queue_bytes=0),
    ):
        pass
    with pytest.raises(TypeError, match="max_queue_bytes must be an int"):
        configure_receiver(max_queue_bytes=1.5)  # type: ignore[arg-type]
    with (
        pytest.raises(ValueError, match="timeout_sec must be > 0"),
        outfeed_receiver(timeout_sec=-1),
    ):
        pass
    with outfeed_receiver(), pytest.raises(ValueError, match="already inside"):  # noqa: PT012
        with outfeed_receiver():
            pass


def test_many_producer_threads_one_consumer_nothing_lost() -> None:
    seen: list[tuple[int, int]] = []
    f = jax.jit(lambda t, i: id_tap(lambda v, transforms: seen.append(tuple(v)), (t, i)))

    def launch(t: int) -> None:
        for i in range(50):
            f(np.int32(t), np.int32(i))

    threads = [threading.Thread(target=launch, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    barrier_wait()
    assert sorted(seen) == [(t, i) for t in range(4) for i in range(50)]
    for t in range(4):  # each thread's calls in its call order
        assert [i for tt, i in seen if tt == t] == list(range(50))


# --- interpreter exit ---

_EXIT_FLUSH = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
import partitioner
from partitioner import pjit, PartitionSpec as P
from partitioner.host_callback import id_tap

def tap(x, transforms):
    sys.stdout.write(f"tap {{int(x)}}\\n")  # one write: lines from two threads never interleave
    sys.stdout.flush()

with partitioner.mesh(jax.devices(), ("x",)):
    f = pjit(lambda i, x: id_tap(tap, i, result=x * 2), (None, P("x")), P("x"))
    x = np.ones(8, np.float32)
    for i in range({n}):
        f(np.int32(i), x)  # launched, never waited for
sys.stdout.write("main done\\n")
"""


def _run(code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, XLA_FLAGS=""),
    )


@pytest.mark.multiprocess
@pytest.mark.slow
def test_exit_right_after_launching_taps_runs_all_of_them() -> None:
    n = 200
    proc = _run(_EXIT_FLUSH.format(n=n), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    taps = [line for line in lines if line.startswith("tap")]
    assert taps == [f"tap {i}" for i in range(n)], proc.stdout[-2000:]
    assert "main done" in lines


_EXIT_HANG = """
import time, jax, numpy as np
from partitioner.host_callback import configure_receiver, id_tap
configure_receiver(timeout_sec=2)
def tap(x, transforms):
    print("tap started", flush=True)
    time.sleep(600)
jax.jit(lambda x: id_tap(tap, x))(np.ones(2))
print("main done", flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_hanging_tap_function_does_not_hang_exit_beyond_the_timeout() -> None:
    start = time.monotonic()
    proc = _run(_EXIT_HANG, timeout=120)
    took = time.monotonic() - start
    assert "main done" in proc.stdout and "tap started" in proc.stdout
    assert "stopped with taps pending" in proc.stderr, proc.stderr[-2000:]
    assert took < 60, took


# --- program order across devices (the Sequencer, driven directly) ---


def _sequencer() -> tuple[Any, list[str]]:
    from partitioner._testing import Sequencer

    out: list[str] = []
    return Sequencer(lambda item: out.append(item.run()), lambda: None), out


def _item(name: str) -> Any:
    from partitioner._testing import TapItem

    return TapItem(lambda: name, 1)


def test_sequencer_delivers_rounds_whole_in_program_order() -> None:
    seq, out = _sequencer()
    site = object()
    seq.put(_item("g0"))
    seq.put_shard(site, 1, _item("d1 r0"))  # before its round opens
    seq.open_round(site, (0, 1, 2))
    seq.put(_item("g1"))  # waits behind the open round
    seq.put_shard(site, 2, _item("d2 r0"))
    seq.put_shard(site, 2, _item("d2 r1"))  # device 2 runs ahead, into round 1
    seq.open_round(site, (0, 1, 2))
    assert out == ["g0"]
    seq.put_shard(site, 0, _item("d0 r0"))
    assert out == ["g0", "d0 r0", "d1 r0", "d2 r0", "g1"]
    seq.put_shard(site, 1, _item("d1 r1"))
    seq.put_shard(site, 0, _item("d0 r1"))
    assert out[5:] == ["d0 r1", "d1 r1", "d2 r1"]


def test_sequencer_rounds_of_a_process_holding_some_devices() -> None:
    # Process 1 of a two-process program holds positions 4..7 of 8.
    seq, out = _sequencer()
    site = object()
    seq.put_shard(site, 6, _item("d6"))
    seq.open_round(site, (4, 5, 6, 7))
    for p in (7, 5):
        seq.put_shard(site, p, _item(f"d{p}"))
    assert out == []
    seq.put_shard(site, 4, _item("d4"))
    assert out == ["d4", "d5", "d6", "d7"]


def test_sequencer_flush_hands_over_partial_rounds() -> None:
    seq, out = _sequencer()
    site = object()
    seq.open_round(site, (0, 1))
    seq.put(_item("g"))
    seq.put_shard(site, 1, _item("d1"))
    seq.flush()
    assert out == ["d1", "g"]
