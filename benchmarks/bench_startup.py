"""Figure 12: start-up, partitioner vs jax.jit: import, first calls, whole processes.

Why: once compiled, partitioner is at parity with jax.jit; a short job, a test
process, a CLI or a restarted (preempted) training job also pays for everything
before that. Every sample here is a *new process* (``startup_worker.py``), run
in turn with its jax.jit counterpart, so what one process leaves behind cannot
help the next:

- import: ``import jax, partitioner`` against ``import jax`` (timed inside the
  process); the target is on the difference, <= 0.06 s (issue 53).
- first call, warm: jax's persistent compilation cache already holds the program
  (a restarted job); the first call of a 30-matmul chain on a 4x2 mesh, from
  making the wrapper to the blocked result, for ``pjit`` and ``partitioner.jit``;
  target <= 1.10x jax.jit's (issue 53). The timed region starts from a collected
  heap in every process (the worker's ``_watched_heap`` says why): where the next
  full collection (~50 ms over jax's heap) falls is set by everything allocated
  before, and a bare jax.jit process is ~6,500 allocations short of one after this
  call: these rows time the code, the raw ones below that luck too.
- first call, warm, raw heap: the same from the heap as the script left it, as a
  user's process has it (issue 53's figure: 0.13-0.16 s against jax.jit's
  0.065-0.09 s when jax's first full collection fell inside partitioner's call), the
  same target; the rows say in how many samples a full collection fell inside each
  call and, after it, how many more objects the process allocates before the next
  one: its margin, a number where the timing is a cliff. Everything partitioner
  allocates before the call (its import: ~5,600 objects) brings the collection
  closer; in this script jax.jit's margin is ~6,500, partitioner's a few hundred.
- first call, cold: the same with no persistent cache (XLA compiles).
- whole process: ``python script.py`` of a restarted job (import, the cache, the
  mesh, the parameters, one step of the transformer block's train step), timed from
  outside; and ``python -m partitioner.inspect`` on a small program (reported).
- pytest start-up on a one-test file with partitioner's plugin loaded against
  ``-p no:partitioner`` (the plugin loads wherever partitioner is installed).

The byte-code cache is allowed (``PYTHONDONTWRITEBYTECODE`` is dropped for the
children, and a warm-up process writes it): an installed package has one, and
compiling partitioner's sources on every import would measure the interpreter.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NAME = "startup"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the checkout whose partitioner the children import
WORKER = HERE / "startup_worker.py"
TIMEOUT_S = 300  # one process; a hang fails the figure instead of stalling the run
IMPORT_BUDGET_S = 0.06  # issue 53
PLUGIN_BUDGET_S = 0.05  # pytest start-up with the plugin over without it
FIRST_CALL = common.Target("<= 1.10x", hi=1.1)  # issue 53: within 1.1x jax.jit's
WHOLE_PROCESS = common.Target("<= 1.05x", hi=1.05)
INSPECT_ARGS = (
    "-m",
    "partitioner.inspect",
    "startup_worker:small",
    "--mesh",
    "data=4,model=2",
    "--arg",
    "f32[64,64]",
    "--in",
    "P('data')",
    "--arg",
    "f32[64,64]",
    "--in",
    "P(None, 'model')",
)


def _env() -> dict[str, str]:
    """The children's environment: this checkout's partitioner first on the path (an
    environment's installed copy may be another checkout's), byte-code allowed."""
    env = dict(os.environ)  # common.setup_env's XLA_FLAGS and platform
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _checked(out: dict[str, Any]) -> dict[str, Any]:
    """A worker's line, after checking that it imported this checkout's partitioner."""
    where = out.get("partitioner")
    if where is not None and not Path(where).resolve().is_relative_to(ROOT):
        raise RuntimeError(f"the worker imported partitioner from {where}, not from {ROOT}")
    return out


def _process(args: Sequence[str]) -> tuple[common.Timing, str]:
    """Run ``python ARGS`` in the benchmarks folder as one new process, bounded in time.

    Returns its wall time and CPU time (all its threads, from the kernel's accounting
    of the finished child) and its standard output.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # subprocess.run kills the child if it outlives the timeout, and reaps it.
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        cwd=HERE,
        env=_env(),
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return common.Timing(wall, cpu), done.stdout


def _worker(*args: str) -> dict[str, Any]:
    _, out = _process([str(WORKER), *args])
    return _checked(json.loads(out.strip().splitlines()[-1]))


def _sampled(
    samplers: dict[str, Callable[[], common.Timing]], rounds: int
) -> dict[str, list[common.Timing]]:
    """Each contender once per round, the order rotated every round (one warm-up)."""
    return common.interleave(samplers, rounds, warmup=1)


# --- import ---


def import_row(rounds: int) -> tuple[common.Row, dict[str, Any]]:
    def sample(what: str) -> Callable[[], common.Timing]:
        def run() -> common.Timing:
            out = _worker("import", what)
            return common.Timing(out["total_s"], out["total_s"])

        return run

    samples = _sampled({"partitioner": sample("partitioner"), "jax": sample("jax")}, rounds)
    ours = [t.wall for t in samples["partitioner"]]
    theirs = [t.wall for t in samples["jax"]]
    over = statistics.median(ours) - statistics.median(theirs)
    paired = [a - b for a, b in zip(ours, theirs, strict=True)]
    noise = (common.quantile(paired, 0.75) - common.quantile(paired, 0.25)) / 2
    row = common.compare(
        "import jax, partitioner vs import jax",
        "ms",
        ours,
        theirs,
        None,
        1e3,
        over_jax_ms=1e3 * over,
        over_jax_noise_ms=1e3 * noise,
    )
    row.target = f"+<= {IMPORT_BUDGET_S * 1e3:.0f} ms"
    row.met = over <= IMPORT_BUDGET_S
    row.status = "ok" if row.met else ("noise" if over - noise <= IMPORT_BUDGET_S else "MISSED")
    return row, {"import_s": samples}


# --- first calls ---


def first_call_rows(
    rounds: int, warm: bool, heap: str = "collected"
) -> tuple[list[common.Row], dict[str, Any]]:
    """The first call in a new process, with jax's persistent cache populated or absent,
    from a collected heap or (``heap="raw"``) the heap as the script left it, with the
    full collections that fell in each call and, raw, the allocations left before the
    next one after it."""
    doors = ("partitioner", "partitioner.jit", "jax.jit")
    seen: dict[str, list[dict[str, Any]]] = {who: [] for who in doors}
    with tempfile.TemporaryDirectory(prefix="partitioner-bench-startup-") as cache_dir:
        where = cache_dir if warm else "-"
        if warm:  # each contender's program written once, by a cold process
            for who in doors:
                _worker("first-call", who, where)

        def sample(who: str) -> Callable[[], common.Timing]:
            def run() -> common.Timing:
                out = _worker("first-call", who, where, heap)
                if warm and out["hits"] < 1:
                    raise RuntimeError(f"{who}: the persistent cache served nothing: {out}")
                seen[who].append(out)
                return common.Timing(out["wall"], out["cpu"])

            return run

        samples = _sampled({w: sample(w) for w in doors}, rounds)
    counted = {who: outs[-rounds:] for who, outs in seen.items()}  # the warm-up left out

    def gc_figures(who: str, prefix: str = "") -> dict[str, Any]:
        fulls = sum(out["full_collections"] for out in counted[who])
        margins = [m for out in counted[who] if (m := out["to_full_collection"]) is not None]
        figures: dict[str, Any] = {f"{prefix}full_collections": f"{fulls} of {rounds}"}
        if heap == "raw":
            figures[f"{prefix}to_full_collection"] = statistics.median(margins) if margins else None
        return figures

    kind = "warm persistent cache" if warm else "no persistent cache"
    if heap == "raw":
        kind += ", raw heap"
    rows = [
        common.compare(
            f"first call, {kind} ({door})",
            "ms",
            samples[who],
            samples["jax.jit"],
            FIRST_CALL,
            1e3,
            **gc_figures(who),
            **gc_figures("jax.jit", "jax_jit_"),
        )
        for door, who in (("pjit", "partitioner"), ("jit", "partitioner.jit"))
    ]
    return rows, {"first_call_s": samples, "gc": counted}


# --- whole processes ---


def train_step_row(rounds: int) -> tuple[common.Row, dict[str, Any]]:
    """``python script.py`` of a restarted job: import + its first (cached) train step."""
    with tempfile.TemporaryDirectory(prefix="partitioner-bench-startup-") as cache_dir:
        for who in ("partitioner", "jax.jit"):
            _worker("train-step", who, cache_dir)

        def sample(who: str) -> Callable[[], common.Timing]:
            def run() -> common.Timing:
                timing, out = _process([str(WORKER), "train-step", who, cache_dir])
                if json.loads(out.strip().splitlines()[-1])["hits"] < 1:
                    raise RuntimeError(f"{who}: the persistent cache served nothing")
                return timing

            return run

        samples = _sampled({w: sample(w) for w in ("partitioner", "jax.jit")}, rounds)
    row = common.compare(
        "whole process: cached train step (import + first step)",
        "ms",
        samples["partitioner"],
        samples["jax.jit"],
        WHOLE_PROCESS,
        1e3,
        partitioner_min_ms=1e3 * min(t.wall for t in samples["partitioner"]),
        jax_jit_min_ms=1e3 * min(t.wall for t in samples["jax.jit"]),
    )
    return row, {"train_step_process_s": samples}


def inspect_row(rounds: int) -> tuple[common.Row, dict[str, Any]]:
    """``python -m partitioner.inspect`` on a small program (reported; no jax.jit twin)."""
    samples = _sampled(
        {
            "inspect": lambda: _process(INSPECT_ARGS)[0],
            "import jax": lambda: _process(["-c", "import jax"])[0],
        },
        rounds,
    )
    walls = [t.wall for t in samples["inspect"]]
    row = common.compare(
        "whole process: python -m partitioner.inspect",
        "ms",
        samples["inspect"],
        None,
        None,
        1e3,
        min_ms=1e3 * min(walls),
        python_import_jax_ms=1e3 * statistics.median(t.wall for t in samples["import jax"]),
    )
    return row, {"inspect_process_s": samples}


def plugin_row(rounds: int) -> tuple[common.Row, dict[str, Any]]:
    """pytest's start-up on a one-test file with partitioner's plugin loaded (its
    ``pytest11`` entry point) against ``-p no:partitioner``: the plugin loads in every
    pytest run where partitioner is installed, so loading it must cost nothing
    (target: within 0.05 s)."""
    with tempfile.TemporaryDirectory() as folder:
        test = os.path.join(folder, "test_one.py")
        with open(test, "w") as f:
            f.write("def test_one():\n    assert 1 + 1 == 2\n")
        base = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", folder, test]
        samples = _sampled(
            {
                "with the plugin": lambda: _process(base)[0],
                "-p no:partitioner": lambda: _process([*base, "-p", "no:partitioner"])[0],
            },
            rounds,
        )
    ours, theirs = samples["with the plugin"], samples["-p no:partitioner"]
    over = statistics.median(a.wall - b.wall for a, b in zip(ours, theirs, strict=True))
    row = common.compare(
        "pytest start-up, one test: plugin loaded / -p no:partitioner",
        "ms",
        ours,
        theirs,
        None,
        1e3,
        over_ms=1e3 * over,
    )
    met = over <= PLUGIN_BUDGET_S
    row = dataclasses.replace(row, target="<= +50 ms", met=met, status="ok" if met else "MISSED")
    return row, {"plugin_s": samples}


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    scale = 1 if args.quick else None
    rows: list[common.Row] = []
    raw: dict[str, Any] = {}
    row, raw["import"] = import_row(scale or 15)
    rows.append(row)
    warm, raw["warm"] = first_call_rows(scale or 15, warm=True)
    loose, raw["warm_raw_heap"] = first_call_rows(scale or 15, warm=True, heap="raw")
    cold, raw["cold"] = first_call_rows(scale or 9, warm=False)
    rows += warm + loose + cold
    row, raw["train_step"] = train_step_row(scale or 11)
    rows.append(row)
    row, raw["inspect"] = inspect_row(scale or 5)
    rows.append(row)
    row, raw["plugin"] = plugin_row(scale or 20)
    rows.append(row)
    common.print_rows("start-up: new processes (import, first calls, whole scripts)", rows)
    for r in rows:
        if "over_jax_ms" in r.extra:
            print(
                f"import partitioner over import jax: {r.extra['over_jax_ms']:.0f} "
                f"+- {r.extra['over_jax_noise_ms']:.0f} ms"
            )
        if "full_collections" in r.extra:
            print(
                f"{r.name}: a full collection inside the call in {r.extra['full_collections']} "
                f"samples (jax.jit: {r.extra['jax_jit_full_collections']})"
            )
        if "to_full_collection" in r.extra:
            print(
                f"  then allocations left before jax's next full collection (median): "
                f"{r.extra['to_full_collection']} (jax.jit: "
                f"{r.extra['jax_jit_to_full_collection']})"
            )
    common.write_json(NAME, rows, args.quick, samples=raw)
    common.save_plot(
        NAME, lambda fig: common.bar_plot(fig, "start-up (lower is better)", rows, "ms")
    )


if __name__ == "__main__":
    main()
