"""One process of bench_compile.py's warm-cache row: the train step's first compile, timed.

Run as ``python warm_compile_worker.py {partitioner,jax.jit} CACHE_DIR [--profile]`` by
``bench_compile.py`` (never alone): a new process, so nothing of an earlier compile
is in memory and only jax's persistent compilation cache (``CACHE_DIR``) can help.
Times ``lower(*args).compile()`` of the transformer train step on a 4x2 mesh (trace
+ lower + the cache lookup, or a compile when the cache is cold) and prints one
JSON line: wall and CPU seconds, and how many entries jax's cache served.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import collections
import json
import sys

import jax
import models

import partitioner


def main() -> None:
    who, cache_dir = sys.argv[1], sys.argv[2]
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    events: collections.Counter[str] = collections.Counter()
    jax.monitoring.register_event_listener(lambda event, **kw: events.update([event]))
    mesh = models.mesh_4x2()
    args = (models.block_params(), models.block_batch())
    specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    step = models.train_step()
    hits_before = events["/jax/compilation_cache/cache_hits"]

    def first_compile() -> None:
        if who == "partitioner":
            with partitioner.mesh(mesh.devices, mesh.axis_names):
                partitioner.pjit(step, specs, models.BLOCK_PARAM_SPECS).lower(*args).compile()
        else:
            jax.jit(
                step,
                in_shardings=models.to_jax(specs, mesh),
                out_shardings=models.to_jax(models.BLOCK_PARAM_SPECS, mesh),
            ).lower(*args).compile()

    if "--profile" in sys.argv:
        print(json.dumps({"profile": common.profile_top(first_compile, 25, "cumulative")}))
        return
    with common.stopwatch() as t:
        first_compile()
    hits = events["/jax/compilation_cache/cache_hits"] - hits_before
    print(json.dumps({"wall": t[0].wall, "cpu": t[0].cpu, "hits": hits}))


if __name__ == "__main__":
    main()
