"""Training loops as users run them.

``state, loss = step(state, batch)`` with donated state and collectives, on the C++
fast path: no error after the in-flight window fills (it never waits on a donated
buffer), reusing a donated state raises instead of crashing the process, and the
window holds no more memory than jax.jit's loop does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from partitioner._testing import MAX_IN_FLIGHT, call_is_guarded
from tests.helpers import arange, assert_close


@pytest.fixture(params=["cpp", "python"])
def dispatch_path(request: pytest.FixtureRequest):
    with partitioner.options.fast_path(request.param == "cpp"):
        yield request.param


def _step(state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], Any]:
    """A gradient over sharded data: the update and the loss need all-reduces."""

    def loss_fn(params: dict[str, Any]) -> Any:
        h = jnp.tanh(batch @ params["w1"])
        return jnp.mean((h @ params["w2"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), loss


SPECS = {"w1": P(None, "model"), "w2": P("model", None)}


def _init() -> dict[str, np.ndarray]:
    return {"w1": arange(8, 16, start=-0.5), "w2": arange(16, 4, start=-0.25)}


def _jax_losses(mesh: Mesh, batch: Any, steps: int) -> list[float]:
    shardings = {k: NamedSharding(mesh, s) for k, s in SPECS.items()}
    step = jax.jit(
        _step,
        in_shardings=(shardings, NamedSharding(mesh, P("data"))),
        out_shardings=(shardings, None),
        donate_argnums=0,
    )
    state, losses = jax.device_put(_init(), shardings), []
    for _ in range(steps):
        state, loss = step(state, batch)
        losses.append(float(loss))
    return losses


def test_donated_loop_with_collectives_runs_past_the_window(dispatch_path, in_mesh_4x2) -> None:
    batch = arange(32, 8)
    step = pjit(_step, (SPECS, P("data")), (SPECS, None), donate_argnums=0)
    assert step(
        jax.device_put(_init(), {k: NamedSharding(in_mesh_4x2, s) for k, s in SPECS.items()}), batch
    )
    state, losses = _init(), []
    for _ in range(3 * MAX_IN_FLIGHT):
        state, loss = step(state, batch)
        losses.append(float(loss))  # blocks on the loss each step, as loops do
    np.testing.assert_allclose(
        losses, _jax_losses(in_mesh_4x2, batch, 3 * MAX_IN_FLIGHT), rtol=1e-5
    )
    for k, spec in SPECS.items():
        assert state[k].sharding.is_equivalent_to(NamedSharding(in_mesh_4x2, spec), 2)


def test_unblocked_donated_chain_does_not_hang(dispatch_path, in_mesh_4x2) -> None:
    """200 donated launches with collectives, never blocked on: the window bounds them."""
    batch = arange(32, 8)
    step = pjit(_step, (SPECS, P("data")), (SPECS, None), donate_argnums=0)
    state, losses = _init(), []
    with partitioner.recording() as events:
        for _ in range(200):
            state, loss = step(state, batch)
            losses.append(loss)
    got = [float(x) for x in losses]
    assert events["window_wait"] >= 200 // MAX_IN_FLIGHT - 2  # the bound was kept
    np.testing.assert_allclose(got[:20], _jax_losses(in_mesh_4x2, batch, 20), rtol=1e-5)


def test_the_cpp_path_runs_donated_steps(in_mesh_4x2) -> None:
    batch = arange(32, 8)
    step = pjit(_step, (SPECS, P("data")), (SPECS, None), donate_argnums=0)
    state, _ = step(_init(), batch)
    state, _ = step(state, batch)  # the first committed-input call: misses once
    with partitioner.recording() as events:
        for _ in range(5):
            state, loss = step(state, batch)
            float(loss)
    assert events["dispatch_miss"] == 0  # neither planned nor run by the Python path


def test_reusing_a_donated_state_raises(dispatch_path, in_mesh_4x2) -> None:
    """``step(state)`` twice without taking the new state: a RuntimeError, not a crash.

    On the C++ path this is caught for a state passed again to its function's
    next call (NOTE [guarded C++ calls]); the Python path checks every leaf.
    """
    batch = arange(32, 8)
    step = pjit(_step, (SPECS, P("data")), (SPECS, None), donate_argnums=0)
    state, _ = step(_init(), batch)
    old = state
    state, loss = step(state, batch)
    float(loss)
    with pytest.raises(
        RuntimeError, match=r"(?s)^Array has been deleted.*argument state\['w1'\].*deleted"
    ):
        step(old, batch)
    # The process is fine and the live state still steps.
    state, loss = step(state, batch)
    assert np.isfinite(float(loss))


@pytest.mark.parametrize("donate", [False, True])
def test_a_loop_holds_no_more_arrays_than_jax_jit(dispatch_path, in_mesh_4x2, donate: bool) -> None:
    """20 steps updating a (1024, 1024) weight: one live copy, as under jax.jit."""

    def update(w: Any, x: Any) -> Any:
        return w - 0.01 * jnp.sum(x) * w  # the sum over sharded x is an all-reduce

    x = arange(64, 4)
    weight_shape = (1024, 1032)  # a shape no other test leaves alive

    def live_weights() -> int:
        return sum(a.shape == weight_shape for a in jax.live_arrays())

    def run(step: Any) -> tuple[np.ndarray, list[int]]:
        w, counts = jnp.ones(weight_shape, jnp.float32), []
        for _ in range(20):
            w = jax.block_until_ready(step(w, x))
            counts.append(live_weights())
        value = np.asarray(w)
        del w
        counts.append(live_weights())  # after the loop: nothing kept alive
        return value, counts

    donate_argnums = (0,) if donate else ()
    ours = pjit(update, (P("data"), P("data")), P("data"), donate_argnums=donate_argnums)
    shard = NamedSharding(in_mesh_4x2, P("data"))
    theirs = jax.jit(
        update, in_shardings=(shard, shard), out_shardings=shard, donate_argnums=donate_argnums
    )
    w_ours, ours_live = run(ours)
    w_theirs, theirs_live = run(theirs)
    assert ours_live == theirs_live == [1] * 20 + [0]
    assert_close(w_ours, w_theirs)


def test_only_donating_or_windowed_functions_are_guarded(in_mesh_4x2) -> None:
    batch = arange(32, 8)
    donating = pjit(_step, (SPECS, P("data")), (SPECS, None), donate_argnums=0)
    plain = pjit(lambda x: x * 2, P("data"), P("data"))
    for _ in range(2):
        state, _ = donating(_init(), batch)
        plain(batch)
    assert call_is_guarded(donating) and not call_is_guarded(plain)
