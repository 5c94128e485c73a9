"""Every pjit feature over a 2x4 mesh spanning two processes; prints ``OK <name>`` per check.

Each check compares this process's block of the result with numpy on the same
(global) inputs, which every process holds whole.
"""

from __future__ import annotations

import partitioner.distributed as pd

pd.initialize()

# isort: split
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import partitioner  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import pjit, with_sharding_constraint  # noqa: E402
from partitioner.host_callback import barrier_wait, id_tap  # noqa: E402

ME = jax.process_index()
MESH = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
X = np.arange(64.0, dtype=np.float32).reshape(8, 8) / 64
W = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)


def check(name: str, got: Any, spec: Any, want: np.ndarray) -> None:
    """``got`` (a global array laid out as ``spec``) equals ``want`` on this process's block."""
    block = np.asarray(pd.global_to_host_local(got, MESH, spec))
    np.testing.assert_allclose(block, want[pd.host_local_slice(want.shape, MESH, spec)], atol=1e-5)
    print(f"OK {name}", flush=True)


with partitioner.mesh(MESH.devices, MESH.axis_names):
    layer = pjit(lambda x, w: jnp.tanh(x @ w), (P("a"), P(None, "b")), P("a", "b"))
    want = np.tanh(X @ W)
    check("numpy inputs", layer(X, W), P("a", "b"), want)

    x_global = pd.host_local_to_global(X[pd.host_local_slice(X.shape, MESH, P("a"))], MESH, P("a"))
    assert x_global.shape == (8, 8) and not x_global.is_fully_addressable
    check("global array inputs", layer(x_global, W), P("a", "b"), want)

    with partitioner.recording() as counts:
        for _ in range(5):
            out = layer(x_global, W)
    assert counts.get("dispatch_miss", 0) == 0, dict(counts)
    check("cached calls on the fast path", out, P("a", "b"), want)

    scaled = pjit(lambda x, k: x * k, P("a"), P("a"), static_argnums=1)
    check("static args", scaled(X, 3), P("a"), X * 3)

    donating = pjit(lambda x: x + 1, P("a"), P("a"), donate_argnums=0)
    fresh = pd.host_local_to_global(X[pd.host_local_slice(X.shape, MESH, P("a"))], MESH, P("a"))
    out = donating(fresh)
    assert fresh.is_deleted()
    check("donation", out, P("a"), X + 1)

    compiled = layer.lower(X, W).compile()
    check("lower().compile()", compiled(X, W), P("a", "b"), want)

    def loss(w: Any, x: Any) -> Any:
        return (jnp.tanh(x @ w) ** 2).sum()

    grad = pjit(jax.grad(loss), (P(None, "b"), P("a")), P(None, "b"))
    check("grad", grad(W, X), P(None, "b"), np.asarray(jax.grad(loss)(W, X)))

    rows = pjit(jax.vmap(lambda r, w: jnp.tanh(r @ w), (0, None)), (P("a"), None), P("a"))
    check("vmap", rows(X, W), P("a"), want)

    inner = pjit(lambda x: x * 2, P("a", "b"), P(None, "b"))

    def outer(x: Any, w: Any) -> Any:
        h = with_sharding_constraint(x @ w, P("a", "b"))
        return inner(jnp.tanh(h)) + 1

    nested = pjit(outer, (P("a"), None), P("a"))
    check("nested pjit and constraints", nested(X, W), P("a"), want * 2 + 1)

    found = partitioner.residuals(lambda w, x: grad(w, x).sum(), W, X)
    assert found, found
    print(f"OK residuals {len(found)}", flush=True)

    seen: list[float] = []
    tapped = pjit(
        lambda x: id_tap(lambda v, transforms: seen.append(float(v.sum())), x * 2) + 1,
        P("a"),
        P("a"),
    )
    tapped(X)
    devices: list[int] = []
    per_device = pjit(
        lambda x: id_tap(
            lambda v, transforms, device: devices.append(device.id),
            x,
            tap_with_device=True,
            per_shard=True,
        ),
        P("a"),
        P("a"),
    )
    per_device(X)
    whole: list[int] = []
    pjit(
        lambda x: id_tap(lambda v, _, device: whole.append(device.id), x, tap_with_device=True),
        P("a"),
        P("a"),
    )(X)
    barrier_wait()
    print(f"WHOLE {whole}", flush=True)
    own = sorted(d.id for d in jax.local_devices())
    print(f"TAPS {len(seen)} {'own-devices' if sorted(devices) == own else devices}", flush=True)
    if seen:
        np.testing.assert_allclose(seen[0], float((X * 2).sum()), rtol=1e-6)
print("DONE", flush=True)
