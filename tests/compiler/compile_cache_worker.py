"""One process of the persistent-cache test (``test_compile_cache.py``): compile, report, exit.

Run as ``python compile_cache_worker.py MODE``, with ``JAX_COMPILATION_CACHE_DIR``
and the companion settings in the environment. MODE picks the partitioner
(``shardy`` / ``gspmd``) and, with a ``+opts`` suffix, passes a compiler
option. Prints one JSON line: jax.monitoring's persistent-cache event counts,
the warnings raised, and whether the pjit and pmap results equal numpy's.
"""

from __future__ import annotations

import collections
import json
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import partitioner
from partitioner import PartitionSpec as P


def main() -> None:
    mode = sys.argv[1]
    events: collections.Counter[str] = collections.Counter()
    jax.monitoring.register_event_listener(lambda event, **kw: events.update([event]))
    durations: collections.Counter[str] = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: durations.update([event])
    )
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    w = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(4, 4)
    partitioner.set_spmd_partitioner(mode.split("+")[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with partitioner.mesh(np.array(jax.devices()[:2]), ("data",)):
            f = partitioner.pjit(lambda x, w: jnp.tanh(x @ w), (P("data"), None), P("data"))
            if mode.endswith("+opts"):
                options = {"xla_cpu_enable_fast_math": False}
                y = f.lower(x, w).compile(compiler_options=options)(x, w)
            else:
                y = f(x, w)
        g = partitioner.pmap(lambda b: jax.lax.psum(b, "i"), "i")
        z = g(x.reshape(2, 4, 4))
    report = {
        "hits": events["/jax/compilation_cache/cache_hits"],
        "misses": events["/jax/compilation_cache/cache_misses"],
        "backend_compile_timed": durations["/jax/core/compile/backend_compile_duration"],
        "lowering_timed": durations["/jax/core/compile/jaxpr_to_mlir_module_duration"],
        "warnings": [str(w.message) for w in caught],
        "pjit_ok": bool(np.allclose(np.asarray(y), np.tanh(x @ w), atol=1e-5)),
        "pmap_ok": bool(np.allclose(np.asarray(z)[0], x.reshape(2, 4, 4).sum(0))),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
