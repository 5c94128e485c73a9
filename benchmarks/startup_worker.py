"""One new process of bench_startup.py: an import, a first call, or a whole train-step script.

Run by ``bench_startup.py`` (never alone), which sets ``XLA_FLAGS`` (8 CPU devices)
in the environment it passes down. Nothing is imported at module level beyond the
standard library: what a mode imports is what it measures, so a jax.jit process
never imports partitioner (``models.py`` uses jax's own ``PartitionSpec``).

Modes (each prints one JSON line):

- ``import jax|partitioner``: ``import jax`` (then ``import partitioner``), timed.
- ``first-call WHO CACHE_DIR [HEAP]``: builds the mesh and places the arguments, then
  times the first call of a 30-matmul chain on a 4x2 mesh (the wrapper made, traced,
  lowered, compiled or loaded from jax's persistent cache in ``CACHE_DIR``, run,
  blocked). ``WHO`` is ``partitioner`` (pjit), ``partitioner.jit`` or ``jax.jit``; a
  ``CACHE_DIR`` of ``-`` means no persistent cache (a cold first call). ``HEAP`` is
  ``collected`` (the default: the timed region starts from a collection,
  ``_watched_heap``) or ``raw`` (the heap as the script left it, as a user's process
  has it); either way the line says how many full collections fell in the region.
- ``train-step WHO CACHE_DIR``: the whole script of a restarted training job (import,
  the persistent cache, the mesh, the parameters, one step of the transformer block's
  train step, blocked). Timed from outside, as a whole process, by the parent.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

WHO = ("partitioner", "partitioner.jit", "jax.jit")
CHAIN_LENGTH = 30


def _import(what: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    import jax  # noqa: F401

    t1 = time.perf_counter()
    where = None
    if what == "partitioner":
        import partitioner

        where = partitioner.__file__
    t2 = time.perf_counter()
    return {"jax_s": t1 - t0, "total_s": t2 - t0, "partitioner": where}


def _use_cache(cache_dir: str) -> Any:
    """jax with its persistent compilation cache in ``cache_dir`` (``-``: none); counts hits."""
    import jax

    hits = [0]
    if cache_dir != "-":
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

        def count(event: str, **_: Any) -> None:
            hits[0] += event == "/jax/compilation_cache/cache_hits"

        jax.monitoring.register_event_listener(count)
    return hits


def chain(x: Any, ws: Any) -> Any:
    """A chain of matmuls: activations split over data, weights over model."""
    import jax.numpy as jnp

    for w in ws:
        x = jnp.tanh(x @ w)
    return x


def small(x: Any, w: Any) -> Any:
    """The program ``python -m partitioner.inspect`` reports in bench_startup.py."""
    import jax.numpy as jnp

    return jnp.tanh(x @ w)


def _watched_heap(collect: bool) -> list[tuple[int, float]]:
    """Start the timed region from a collected heap (``collect``; else from the heap as
    the script left it); returns the collector's pauses in it, ``(generation, seconds)``.

    Why: when the next full collection falls is set by how many objects everything
    allocated before (partitioner's import: ~5,600), and a full one over jax's heap
    takes ~50 ms. Measured raw, the row also asks which process happens to be a few
    hundred allocations from that threshold: in this script a jax.jit process is
    ~6,500 short of it after this call, a partitioner process ~600 (issue 53: until
    its import shed ~1,000, the collection fell inside its call's lowering). Both
    contenders start from a collection, as every in-process figure does
    (``common.interleave``), in the rows that time the code; the raw rows and the
    whole-process row pay every pause, uncollected.
    """
    import gc

    if collect:
        gc.collect()
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def clock(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(clock)
    return pauses


def _first_call(who: str, cache_dir: str, heap: str = "collected") -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if who != "jax.jit":
        import partitioner
    hits = _use_cache(cache_dir)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    x_spec, w_spec = P("data", None), P(None, "model")
    x = jax.device_put(rng.standard_normal((64, 64), np.float32), NamedSharding(mesh, x_spec))
    ws = [
        jax.device_put(rng.standard_normal((64, 64), np.float32) / 8, NamedSharding(mesh, w_spec))
        for _ in range(CHAIN_LENGTH)
    ]
    jax.block_until_ready((x, ws))
    if heap not in ("collected", "raw"):
        raise SystemExit(f"startup_worker.py: HEAP is collected or raw, not {heap!r}")
    pauses = _watched_heap(collect=heap == "collected")
    t0, c0 = time.perf_counter(), time.process_time()
    if who == "partitioner":
        with partitioner.mesh(mesh.devices, mesh.axis_names):
            out = partitioner.pjit(chain, (x_spec, w_spec), x_spec)(x, ws)
    else:
        make = jax.jit if who == "jax.jit" else partitioner.jit
        in_shardings = (NamedSharding(mesh, x_spec), NamedSharding(mesh, w_spec))
        out = make(chain, in_shardings=in_shardings, out_shardings=in_shardings[0])(x, ws)
    out.block_until_ready()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    fulls = sum(generation == 2 for generation, _ in pauses)
    return {
        "wall": wall,
        "cpu": cpu,
        "hits": hits[0],
        "gc_pause": sum(seconds for _, seconds in pauses),
        "full_collections": fulls,
        "full_pause": sum(seconds for generation, seconds in pauses if generation == 2),
        # After the call, from the heap as the script left it: the margin (a full
        # collection in the call, or a collected heap, leaves none to measure).
        "to_full_collection": _allocations_to_full_collection()
        if heap == "raw" and not fulls
        else None,
        "partitioner": None if who == "jax.jit" else partitioner.__file__,
        "sum": float(np.asarray(out).sum()),
    }


def _allocations_to_full_collection(limit: int = 50_000) -> int | None:
    """How many more objects this process allocates before its next full collection
    starts (None: not within ``limit``).

    The raw rows' margin, as a number instead of a cliff: a change that allocates
    this many more objects before the call (an import's modules, a user's set-up)
    moves the ~50 ms collection into it (issue 53).
    """
    import gc

    started: list[bool] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            started.append(True)

    gc.callbacks.append(watch)
    kept: list[list[None]] = []
    try:
        while not started and len(kept) < limit:
            kept.append([])  # one object the collector tracks, kept alive
    finally:
        gc.callbacks.remove(watch)
    return len(kept) if started else None


def _train_step(who: str, cache_dir: str) -> dict[str, Any]:
    """A restarted job's script: everything up to its first step's result."""
    import jax
    import models

    if who != "jax.jit":
        import partitioner
    hits = _use_cache(cache_dir)
    mesh = models.mesh_4x2()
    specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    if who == "partitioner":
        with partitioner.mesh(mesh.devices, mesh.axis_names):
            step = partitioner.pjit(models.train_step(), specs, models.BLOCK_PARAM_SPECS)
            params = step(models.block_params(), models.block_batch())
    else:
        step = jax.jit(
            models.train_step(),
            in_shardings=models.to_jax(specs, mesh),
            out_shardings=models.to_jax(models.BLOCK_PARAM_SPECS, mesh),
        )
        params = step(models.block_params(), models.block_batch())
    jax.block_until_ready(params)
    return {"hits": hits[0]}


def main() -> None:
    mode, *rest = sys.argv[1:]
    if mode == "import":
        out = _import(rest[0])
    elif mode == "first-call":
        out = _first_call(*rest)
    elif mode == "train-step":
        out = _train_step(*rest)
    else:
        raise SystemExit(f"startup_worker.py: unknown mode {mode!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
