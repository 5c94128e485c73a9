"""Host-local <-> global arrays in one process, and ``initialize``'s argument checks.

With one process the host-local block is the whole array, so these pin the
conversions' layouts and errors; the multi-process semantics (each process its
block) are exercised by the multi-process jobs beside this file.
"""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import partitioner.distributed as pd
from partitioner import PartitionSpec as P
from partitioner.testing.plugin import MeshFactory


@pytest.fixture
def mesh_ab(mesh: MeshFactory) -> Mesh:
    return mesh((4, 2), ("a", "b"))


def test_one_process_holds_everything(mesh_ab: Mesh) -> None:
    x = np.arange(32.0).reshape(8, 4)
    assert pd.host_local_slice(x.shape, mesh_ab, P("a", "b")) == (slice(0, 8), slice(0, 4))
    g = pd.host_local_to_global(
        {"x": x, "s": np.float32(2)}, mesh_ab, {"x": P("a", "b"), "s": None}
    )
    assert g["x"].sharding.is_equivalent_to(NamedSharding(mesh_ab, P("a", "b")), 2)
    np.testing.assert_array_equal(np.asarray(g["x"]), x)
    back = pd.global_to_host_local(g, mesh_ab, {"x": P("a", "b"), "s": None})
    np.testing.assert_array_equal(np.asarray(back["x"]), x)
    assert back["x"].addressable_shards[0].data.unsafe_buffer_pointer() == (
        g["x"].addressable_shards[0].data.unsafe_buffer_pointer()
    )  # the same buffers: no copy
    assert float(back["s"]) == 2.0


def test_bad_layouts_are_clear_errors(mesh_ab: Mesh) -> None:
    with pytest.raises(ValueError, match="names the axis 'c'"):
        pd.host_local_to_global(np.ones((8, 4)), mesh_ab, P("c"))
    with pytest.raises(ValueError, match=r"tree\['w'\].*dimension 0 \(6\).*divisible by 4"):
        pd.host_local_to_global({"w": np.ones((6, 4))}, mesh_ab, {"w": P("a")})
    with pytest.raises(ValueError, match="not a pytree prefix"):
        pd.host_local_to_global((np.ones(8),), mesh_ab, (P("a"), P("b")))
    g = pd.host_local_to_global(np.ones((8, 4)), mesh_ab, P("a"))
    with pytest.raises(ValueError, match=r"laid out as P\('b',\)"):
        pd.global_to_host_local(g, mesh_ab, P("b"))


def test_initialize_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARTITIONER_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="PARTITIONER_NUM_PROCESSES='two' is not an int"):
        pd.initialize()
    monkeypatch.delenv("PARTITIONER_NUM_PROCESSES")
    with pytest.raises(ValueError, match="heartbeat_timeout must be > 0"):
        pd.initialize("127.0.0.1:1", 2, 0, heartbeat_timeout=0)
    with pytest.raises(ValueError, match="devices_per_process must be a positive int"):
        pd.initialize("127.0.0.1:1", 2, 0, devices_per_process=0)
