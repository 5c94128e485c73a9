"""Property-test code that produces shardings: strategies, round-trip checks, a pytest plugin.

Code built on partitioner writes its own sharding rules (logical axis names to mesh
axes, FSDP helpers, a custom mesh layout, a checkpoint resharder). This package gives
such code what partitioner's own tests use:

- ``partitioner.testing.strategies`` (needs hypothesis: ``pip install
  "partitioner[hypothesis]"``): meshes, partition specs, shapes, ``OpSharding``,
  ``NamedSharding`` and ``ShardingSpec`` objects and ``jax.Array`` values, valid by
  construction and shrinking to small meshes and short specs.
- The round-trip checks, here: :func:`assert_round_trips` (a spec means the same
  layout as an OpSharding, as HLO sharding text, as a NamedSharding and as pmap's
  ShardingSpec), one check per form, and :func:`assert_same_layout` (the same devices
  hold the same index ranges).
- :func:`assert_sharding_invariant` (needs hypothesis too): a function gives the
  answer ``jax.jit`` gives on one device, whatever the mesh and its arguments' layouts.
- A pytest plugin (``partitioner.testing.plugin``), which pytest loads by itself once
  partitioner is installed: ``pytest --virtual-devices 8`` (or ``virtual_devices = 8``
  in the ini file) runs the tests on 8 virtual CPU devices, set before jax creates
  its devices; the ``mesh`` fixture builds meshes; ``@pytest.mark.needs_devices(n)``
  skips a test when there are fewer devices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._src import lazy
from .round_trips import (
    assert_hlo_text_round_trip,
    assert_named_sharding_round_trip,
    assert_op_sharding_round_trip,
    assert_round_trips,
    assert_same_layout,
    assert_sharding_spec_round_trip,
)

# assert_sharding_invariant needs hypothesis (partitioner[hypothesis]): loaded when first read,
# so the round-trip checks work without it.
if TYPE_CHECKING:
    from .invariance import assert_sharding_invariant
else:
    __getattr__, __dir__ = lazy.attach(
        __name__, {"assert_sharding_invariant": "partitioner.testing.invariance"}
    )

__all__ = [
    "assert_hlo_text_round_trip",
    "assert_named_sharding_round_trip",
    "assert_op_sharding_round_trip",
    "assert_round_trips",
    "assert_same_layout",
    "assert_sharding_invariant",
    "assert_sharding_spec_round_trip",
]
