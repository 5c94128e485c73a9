"""Shared helpers for the test suite (pjit's numbers, layouts and meshes).

Plain functions, imported by the test modules (``from helpers import ...``);
the fixtures that use them live in ``conftest.py``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P

#: Meshes the numeric tests run over: (shape, axis names).
MESH_1D = ((8,), ("x",))
MESH_2D = ((4, 2), ("a", "b"))
MESH_3D = ((2, 2, 2), ("a", "b", "c"))


def devices(*shape: int) -> np.ndarray:
    """The first ``prod(shape)`` devices as an object array of ``shape``."""
    return np.array(jax.devices()[: math.prod(shape)]).reshape(shape)


def mesh_ctx(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """``partitioner.mesh`` over the first devices arranged as ``shape``."""
    return partitioner.mesh(devices(*shape), names)


def jax_spec(spec: Any) -> jax.sharding.PartitionSpec:
    """A ``jax.sharding.PartitionSpec`` for ours, jax's, or None (replicated)."""
    if spec is None:
        return jax.sharding.PartitionSpec()
    if isinstance(spec, P):
        return spec
    return spec


def named(mesh: Mesh, spec: Any) -> NamedSharding:
    return NamedSharding(mesh, jax_spec(spec))


def layout(x: jax.Array) -> list[tuple[int, tuple[Any, ...], int]]:
    """``(device id, index, replica_id)`` of every addressable shard, by device id."""
    out = []
    for s in x.addressable_shards:
        index = tuple((i.start, i.stop, i.step) if isinstance(i, slice) else i for i in s.index)
        out.append((s.device.id, index, s.replica_id))
    return sorted(out, key=lambda t: t[0])


def assert_laid_out(out: Any, mesh: Mesh, spec: Any, expected: Any = None) -> None:
    """``out`` is a jax.Array laid out exactly as ``NamedSharding(mesh, spec)`` lays it out.

    Checks the sharding's equivalence, and that the addressable shards (device,
    index, replica_id, contents) equal those of ``jax.device_put(ref, sharding)``
    where ``ref`` is ``expected`` (or ``out``'s own value).
    """
    assert isinstance(out, jax.Array), type(out)
    sharding = named(mesh, spec)
    assert out.sharding.is_equivalent_to(sharding, out.ndim), (out.sharding, sharding)
    ref_value = np.asarray(out) if expected is None else np.asarray(expected)
    ref = jax.device_put(ref_value, sharding)
    assert layout(out) == layout(ref)
    for got, want in zip(
        sorted(out.addressable_shards, key=lambda s: s.device.id),
        sorted(ref.addressable_shards, key=lambda s: s.device.id),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(got.data), np.asarray(want.data), rtol=1e-5, atol=1e-5
        )


def assert_close(got: Any, want: Any) -> None:
    """Leaf-by-leaf numeric comparison of two pytrees with the same structure."""
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree, (got_tree, want_tree)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert np.shape(g) == np.shape(w)
        assert np.asarray(g).dtype == np.asarray(w).dtype, (
            np.asarray(g).dtype,
            np.asarray(w).dtype,
        )
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def arange(*shape: int, dtype: Any = np.float32, start: float = 0.0) -> np.ndarray:
    """A deterministic array with distinct, moderate values."""
    n = math.prod(shape)
    return (np.arange(n, dtype=np.float64) / max(n, 1) + start).astype(dtype).reshape(shape)


def shard_pointers(x: jax.Array) -> dict[int, int]:
    """Device id -> buffer address of each addressable shard."""
    return {s.device.id: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}


class StandIn:
    """A stand-in device: jax's Mesh and shardings and partitioner's conversions need
    only ``.id`` and identity, so properties over layouts reach meshes of hundreds."""

    def __init__(self, id: int) -> None:
        self.id = id

    def __repr__(self) -> str:
        return f"StandIn({self.id})"


#: 840 = 2^3 * 3 * 5 * 7 stand-ins: every axis size up to 8 divides it, so the public
#: ``meshes`` strategy (axis sizes multiply to a divisor of the count) reaches them all.
#: One pool, so equal meshes are the same interned jax Mesh and jax's caches stay warm.
STAND_INS = [StandIn(i) for i in range(840)]


ROOT = Path(__file__).resolve().parent.parent


def run_json(args: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``python ARGS`` as a new process with this checkout importable; the JSON it prints last.

    Why a new process: start-up and the persistent cache are about what one
    process leaves behind for the next. ``env`` adds to (or overrides) this
    process's environment; the child is bounded in time and reaped.
    """
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    done = subprocess.run(
        [sys.executable, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,  # kills the child if it hangs; subprocess.run reaps it
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
