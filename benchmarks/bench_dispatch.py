"""Figure 1: cost of a cached call, partitioner vs jax.jit, against the raw executable.

Why: a cached call must cost almost nothing beyond running the executable (issue 5).
Per-call time is measured over loops of many back-to-back calls that block only at the
end, as user code does. Programs here are elementwise with no collectives, so an
un-blocked loop can never hang the CPU rendezvous (README, "block on results").

Rows: partitioner through jaxlib's C++ dispatcher (the default), jax.jit, the raw
``execute_sharded`` floor of the same executable, partitioner's pure-Python path
(``partitioner.options.fast_path(False)``), and ``partitioner.jit`` (the jax.jit
front door, issue 25) with the same shardings.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import argparse
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P

NAME = "dispatch"


@dataclass(frozen=True)
class Case:
    name: str
    n_devices: int
    n_args: int
    spec: P
    target: common.Target


CASES = (
    Case("1dev_1arg", 1, 1, P(), common.Target("<= 1.10x", hi=1.10)),
    Case("8dev_1arg", 8, 1, P("x"), common.Target("<= 1.05x", hi=1.05)),
    Case("8dev_10args", 8, 10, P("x"), common.Target("<= 1.05x", hi=1.05)),
    Case("8dev_100args", 8, 100, P("x"), common.Target("<= 1.05x", hi=1.05)),
)


def _elementwise(*xs: jax.Array) -> jax.Array:
    """Sum of the arguments plus one: elementwise, so no collectives on any mesh."""
    return functools.reduce(operator.add, xs) + 1.0


def _block(out: Any) -> None:
    jax.block_until_ready(out)


def _block_raw(results: Any) -> None:
    jax.block_until_ready(results.disassemble_into_single_device_arrays())


@dataclass
class Contenders:
    """The timed loops of one case, and what the report says about them."""

    samplers: dict[str, Callable[[], common.Timing]]
    calls_per_loop: int
    ours: Any  # the pjit-ed function, to read its C++ cache afterwards


def contenders(case: Case, mesh: Mesh, quick: bool) -> Contenders:
    """One sampler per contender, each timing a loop of cached calls."""
    sharding = NamedSharding(mesh, case.spec)
    args = [
        jax.device_put(np.full((16 * case.n_devices,), i, np.float32), sharding)
        for i in range(case.n_args)
    ]
    ours = partitioner.pjit(_elementwise, case.spec, case.spec)
    ours_jit = partitioner.jit(_elementwise, in_shardings=sharding, out_shardings=sharding)
    theirs = jax.jit(_elementwise, in_shardings=sharding, out_shardings=sharding)
    executable = ours.lower(*args).compile().executable.loaded

    def call_ours() -> Any:
        return ours(*args)

    def call_theirs() -> Any:
        return theirs(*args)

    def call_ours_jit() -> Any:
        return ours_jit(*args)

    def call_raw() -> Any:
        return executable.execute_sharded(args)

    call_ours(), call_theirs(), call_ours_jit()
    # Short loops and many rounds, so both contenders sample the same load phases
    # of a shared machine (they last seconds); at least 100 calls, so the block at
    # the end of a loop amortises.
    n = max(common.calibrate(call_theirs, _block, 0.025), 20 if quick else 100)

    def sample(
        call: Callable[[], Any], block: Callable[[Any], None] = _block
    ) -> Callable[[], common.Timing]:
        def run() -> common.Timing:
            block(call())  # a warm call: the fast-path switch may have emptied caches
            return common.time_loop(call, n, block)

        return run

    def python_path() -> common.Timing:
        with partitioner.options.fast_path(False):
            return sample(call_ours)()

    samplers = {
        "partitioner": sample(call_ours),
        "jax.jit": sample(call_theirs),
        "raw execute_sharded": sample(call_raw, _block_raw),
        "partitioner (python path)": python_path,
        "partitioner.jit": sample(call_ours_jit),
    }
    return Contenders(samplers, n, ours)


def _cpp_cache_size(f: Any) -> int | None:
    """Entries in jaxlib's C++ cache behind ``f`` (1: cached calls skip Python); None if hidden."""
    for obj in (f, getattr(f, "_cpp", None)):
        size = getattr(obj, "_cache_size", None)
        if callable(size):
            return int(size())
    return None


def measure(
    case: Case, rounds: int, args: argparse.Namespace
) -> tuple[list[common.Row], dict[str, Any], list[str]]:
    """Rows (ours, raw floor, Python path; each against jax.jit), raw samples, profile lines."""
    devices = np.array(jax.devices()[: case.n_devices])
    with partitioner.mesh(devices, ("x",)):
        c = contenders(case, Mesh(devices, ("x",)), args.quick)
        samples = common.interleave(c.samplers, rounds)
        c.samplers["partitioner"]()
        # 1 after the loops: jaxlib's C++ dispatcher held the entry (calls skipped Python).
        info = {"calls_per_loop": c.calls_per_loop, "cpp_cache_size": _cpp_cache_size(c.ours)}
        theirs = samples["jax.jit"]
        us = 1e6
        rows = [
            common.compare(
                case.name, "us/call", samples["partitioner"], theirs, case.target, us, **info
            ),
            common.compare(
                f"{case.name} raw floor",
                "us/call",
                samples["raw execute_sharded"],
                theirs,
                None,
                us,
            ),
            common.compare(
                f"{case.name} python path",
                "us/call",
                samples["partitioner (python path)"],
                theirs,
                None,
                us,
            ),
            common.compare(
                f"{case.name} jit", "us/call", samples["partitioner.jit"], theirs, case.target, us
            ),
        ]
        profile: list[str] = []
        if common.should_profile(args, rows[0]):
            run = c.samplers["partitioner"]
            profile = common.profile_top(lambda: [run() for _ in range(5)])
    return rows, samples, profile


def plot(rows: list[common.Row]) -> None:
    main = [r for r in rows if " " not in r.name]
    floors = {r.name.split()[0]: r.partitioner for r in rows if r.name.endswith("raw floor")}
    python = {r.name.split()[0]: r.partitioner for r in rows if r.name.endswith("python path")}
    jit = {r.name.split()[0]: r.partitioner for r in rows if r.name.endswith(" jit")}

    def draw(fig: Any) -> None:
        common.bar_plot(
            fig,
            "Cached-call dispatch (median per call; lower is better)",
            main,
            "microseconds per call",
            {
                "raw execute_sharded": [floors.get(r.name) for r in main],
                "partitioner python path": [python.get(r.name) for r in main],
                "partitioner.jit": [jit.get(r.name) for r in main],
            },
        )
        fig.axes[0].set_yscale("log")

    common.save_plot(NAME, draw)


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rounds = 3 if args.quick else 100
    rows: list[common.Row] = []
    raw: dict[str, Any] = {}
    profiles: dict[str, list[str]] = {}
    for case in CASES:
        case_rows, raw[case.name], profile = measure(case, rounds, args)
        rows += case_rows
        if profile:
            profiles[case.name] = profile
    common.print_rows("dispatch", rows)
    for name, lines in profiles.items():
        print(f"\n-- cProfile, partitioner side, {name} (the C++ dispatcher shows as one entry) --")
        print("\n".join(lines))
    common.write_json(NAME, rows, args.quick, samples_s=raw, profiles=profiles)
    plot(rows)


if __name__ == "__main__":
    main()
