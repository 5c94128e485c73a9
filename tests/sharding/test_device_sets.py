"""Which devices a call runs on.

Inside ``jax.jit`` with uncommitted (numpy) arguments, the enclosing program takes
the devices of the mesh a pjit (or a constraint) names, as it does around jax's own
``jit(..., in_shardings=...)``: the result and the intermediates are partitioned.
Arguments committed to devices outside the mesh are an error naming the argument
and both device sets, as under jax.jit; within the mesh's devices they are moved.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit, with_sharding_constraint
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, arange, assert_close, assert_laid_out, devices, mesh_ctx


def _layer(x: Any, w: Any) -> Any:
    return jnp.tanh(x @ w)


def _shard_shapes(compiled_text: str) -> set[str]:
    return set(re.findall(r"f32\[\d+(?:,\d+)*\]", compiled_text))


def test_jit_around_pjit_with_numpy_inputs_is_partitioned(jax_partitioner_mode) -> None:
    x, w = arange(16, 8), arange(8, 8, start=-0.5)
    with mesh_ctx(*MESH_2D) as mesh:
        inner = pjit(_layer, (P("a"), P(None, "b")), P("a", "b"))

        def step(x: Any, w: Any) -> Any:
            return inner(x, w) * 2.0

        got = jax.jit(step)(x, w)
        assert_close(got, jax.jit(lambda x, w: _layer(x, w) * 2.0)(x, w))
        # The result keeps the inner layout: 8 devices, each a (4, 4) block.
        assert_laid_out(got, mesh, P("a", "b"))
        assert {s.data.shape for s in got.addressable_shards} == {(4, 4)}
        # Intermediates too: x split 4 ways (f32[4,8]), the product (f32[4,4]).
        shapes = _shard_shapes(jax.jit(step).lower(x, w).compile().as_text())
        assert {"f32[4,8]", "f32[4,4]"} <= shapes, shapes
        assert "f32[16,8]" not in shapes


def test_jit_around_a_constraint_is_partitioned() -> None:
    x = arange(16, 8)
    with mesh_ctx(*MESH_2D) as mesh:
        got = jax.jit(lambda v: with_sharding_constraint(v * 2, P("b", "a")))(x)
        assert_laid_out(got, mesh, P("b", "a"), 2 * x)


def test_jit_around_pjit_with_inputs_on_another_device_set_fails_like_jax() -> None:
    x = jax.device_put(arange(16, 8), jax.devices()[0])  # committed to device 0 only
    with mesh_ctx(*MESH_2D):
        inner = pjit(_layer, (P("a"), None), P("a"))
        with pytest.raises(ValueError, match="incompatible devices"):
            jax.jit(inner)(x, arange(8, 8))


# --- item 10: arrays committed outside the mesh ---


def test_argument_committed_outside_the_mesh_names_it_and_both_device_sets(
    partitioner_mode,
) -> None:
    other = jax.device_put(arange(8, 4), jax.devices()[7])
    with partitioner.mesh(devices(8)[:4].reshape(2, 2), ("a", "b")):
        f = pjit(lambda t: t["x"] * 2, ({"x": P("a")},), P("a"))
        with pytest.raises(ValueError) as info:
            f({"x": other})
    message = str(info.value)
    assert message.startswith("Received incompatible devices for jitted computation.")
    assert "t['x']" in message and "[7]" in message and "[0, 1, 2, 3]" in message


def test_argument_committed_within_the_mesh_is_moved_only_when_opted_in(
    partitioner_mode, mesh: MeshFactory
) -> None:
    x = arange(8, 4)
    on_one = jax.device_put(x, jax.devices()[1])
    sharded_other_way = jax.device_put(x, jax.sharding.NamedSharding(mesh(*MESH_2D), P(None, "b")))
    with mesh_ctx(*MESH_2D) as in_context:
        f = pjit(lambda t: t + 1, P("a"), P("a"))
        for arg in (on_one, sharded_other_way):
            with pytest.raises(ValueError, match="committed"):  # as jax.jit: no hidden move
                f(arg)
            with partitioner.options.reshard_committed():
                assert_laid_out(f(arg), in_context, P("a"), x + 1)


def test_compiled_call_rejects_arrays_outside_the_mesh() -> None:
    with partitioner.mesh(devices(8)[:4].reshape(2, 2), ("a", "b")):
        compiled = pjit(lambda t: t * 2, P("a"), P("a")).lower(arange(8, 4)).compile()
        with pytest.raises(ValueError, match=r"device ids \[6\]"):
            compiled(jax.device_put(arange(8, 4), jax.devices()[6]))
    np.testing.assert_array_equal(np.asarray(compiled(arange(8, 4))), 2 * arange(8, 4))
