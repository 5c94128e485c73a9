"""The SPMD partitioner choice under its names: ``spmd_partitioner`` and the deprecated ones.

``partitioner.partitioner`` / ``set_partitioner`` were renamed (they read as the
package's own name); the old names stay for a release, warn ``DeprecationWarning``
naming the new name, and still pick the partitioner.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioner
from partitioner import options
from partitioner.testing.plugin import MeshFactory


def _lowered_text(mesh: jax.sharding.Mesh) -> str:
    f = partitioner.pjit(lambda x: x * 2, in_axis_resources=P("a"), out_axis_resources=P("a"))
    with partitioner.mesh(mesh.devices, mesh.axis_names):
        return f.lower(np.ones((8,), np.float32)).as_text()


@pytest.fixture
def mesh_a(mesh: MeshFactory) -> jax.sharding.Mesh:
    return mesh((4,), ("a",))


@pytest.mark.parametrize("module", [partitioner, options], ids=["partitioner", "options"])
@pytest.mark.parametrize("name", ["gspmd", "shardy"])
def test_old_block_name_warns_and_picks_the_partitioner(module, name, mesh_a) -> None:
    with pytest.warns(DeprecationWarning, match=r"use partitioner\.spmd_partitioner"):
        block = module.partitioner(name)
    with block:
        assert options.use_shardy() is (name == "shardy")
        text = _lowered_text(mesh_a)
    with partitioner.spmd_partitioner(name):
        assert text == _lowered_text(mesh_a)
    assert ("sdy.sharding" in text) is (name == "shardy")


@pytest.mark.parametrize("module", [partitioner, options], ids=["partitioner", "options"])
def test_old_default_name_warns_and_sets_the_default(module) -> None:
    try:
        with pytest.warns(DeprecationWarning, match=r"use partitioner\.set_spmd_partitioner"):
            module.set_partitioner("gspmd")
        assert options.use_shardy() is False
        with pytest.warns(DeprecationWarning, match=r"use partitioner\.set_spmd_partitioner"):
            module.set_partitioner("shardy")
        assert options.use_shardy() is True
    finally:
        partitioner.set_spmd_partitioner(None)


def test_new_names_do_not_warn(mesh_a, recwarn) -> None:
    with partitioner.spmd_partitioner("gspmd"):
        assert options.use_shardy() is False
    partitioner.set_spmd_partitioner(None)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_a_bad_name_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'shardy', 'gspmd' or None, got 'xla'"):
        partitioner.spmd_partitioner("xla").__enter__()
    with pytest.raises(ValueError, match=r"'shardy', 'gspmd' or None, got 'xla'"):
        partitioner.set_spmd_partitioner("xla")
