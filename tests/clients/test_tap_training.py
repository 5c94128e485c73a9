"""id_tap in real training loops: flax linen + optax, flax nnx.

The linen loop is examples/tap_training.py's (loaded as a module, so the example
and this test cannot drift apart): metrics tapped from a donated pjit step,
compared with jax.jit running the same steps without taps. The nnx test taps an
activation inside a module's ``__call__``, through ``nnx.value_and_grad``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from partitioner import PartitionSpec as P
from partitioner import pjit
from partitioner.host_callback import barrier_wait, id_tap
from tests.clients.clients_helpers import load_example

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow


def _is_spec(s: Any) -> bool:
    return s is None or isinstance(s, P)


def test_linen_optax_step_taps_metrics_in_step_order(partitioner_mode, mesh_4x2: Mesh) -> None:
    ex = load_example("tap_training")
    x, y = ex.make_data()
    specs = ex.state_specs(ex.init_state())
    state, ref_state = ex.init_state(), ex.init_state()
    with jax.set_mesh(mesh_4x2):
        step = pjit(
            lambda s, x, y: ex.train_step(s, x, y, tap=True),
            (specs, P("data"), P("data")),
            (specs, None),
            donate_argnums=0,
        )
        for _ in range(ex.STEPS):
            state, _ = step(state, x, y)
        barrier_wait()
        shardings = jax.tree.map(
            lambda s: NamedSharding(mesh_4x2, s or P()), specs, is_leaf=_is_spec
        )
        data = NamedSharding(mesh_4x2, P("data"))

        def reference(s: Any, x: Any, y: Any) -> Any:
            (loss, _), grads = jax.value_and_grad(ref_loss(s), has_aux=True)(s["params"])
            new_state, _ = ex.train_step(s, x, y, tap=False)
            return new_state, loss, optax.tree.norm(grads)

        def ref_loss(s: Any) -> Any:
            _, dropout = jax.random.split(s["rng"])

            def loss_fn(params: Any) -> Any:
                pred = ex.MODEL.apply({"params": params}, x, train=True, rngs={"dropout": dropout})
                per_example = jnp.mean((pred - y) ** 2, axis=-1)
                return per_example.mean(), per_example

            return loss_fn

        ref = jax.jit(reference, in_shardings=(shardings, data, data))
        ref_losses, ref_norms = [], []
        for _ in range(ex.STEPS):
            ref_state, loss, norm = ref(ref_state, x, y)
            ref_losses.append(float(loss))
            ref_norms.append(float(norm))
    assert [m["step"] for m in ex.LOG] == list(range(ex.STEPS))
    np.testing.assert_allclose([m["loss"] for m in ex.LOG], ref_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([m["grad_norm"] for m in ex.LOG], ref_norms, rtol=1e-4)
    # tap_with_device: each device saw its quarter of the batch (data axis = 4) every step.
    assert sorted(ex.SHARD_LOSSES) == list(range(8))
    assert all([n for n, _ in v] == [ex.BATCH // 4] * ex.STEPS for v in ex.SHARD_LOSSES.values())


class Tapped(nnx.Module):
    """Linear -> tapped activation -> Linear."""

    def __init__(self, rngs: nnx.Rngs, seen: list[Any]) -> None:
        self.up = nnx.Linear(8, 16, rngs=rngs)
        self.down = nnx.Linear(16, 2, rngs=rngs)
        self.seen = seen

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.up(x))
        h = id_tap(lambda v, transforms: self.seen.append((transforms, v)), h)
        return self.down(h)


def test_nnx_module_taps_activations_and_their_cotangents(partitioner_mode, mesh_4x2: Mesh) -> None:
    seen: list[Any] = []
    graphdef, params = nnx.split(Tapped(nnx.Rngs(0), seen))
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)

    def loss(params: Any, x: Any) -> Any:
        model = nnx.merge(graphdef, params)
        return jnp.sum(model(x) ** 2)

    with jax.set_mesh(mesh_4x2):
        grads = pjit(jax.grad(loss), (None, P("data")), None)(params, x)
    barrier_wait()
    assert [t for t, _ in seen] == [(), ("jvp", "transpose")]
    model = nnx.merge(graphdef, params)
    h = np.asarray(jax.nn.relu(model.up(x)))
    np.testing.assert_allclose(seen[0][1], h, rtol=1e-5, atol=1e-6)
    out = h @ np.asarray(model.down.kernel[...]) + np.asarray(model.down.bias[...])
    ct_h = (2 * out) @ np.asarray(model.down.kernel[...]).T
    np.testing.assert_allclose(seen[1][1], ct_h, rtol=1e-4, atol=1e-5)
    want = jax.jit(jax.grad(loss))(params, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, want)
