"""pmap-style ``ShardingSpec``: which slice of an array each device holds.

A layout written per array dimension (``NoSharding``, ``Chunked``, ``Unstacked``)
and per mesh axis (``ShardedAxis``, ``Replicated``), as jax's pmap described its
outputs; ``sharding_spec_from_parsed`` converts a partition spec over a mesh, and
``devices_indices_map`` gives each device's slice.
"""

from ._src.sharding.sharding_spec import (
    Chunked,
    NoSharding,
    Replicated,
    ShardedAxis,
    ShardingSpec,
    Unstacked,
    devices_indices_map,
    sharding_spec_from_parsed,
)

__all__ = [
    "Chunked",
    "NoSharding",
    "Replicated",
    "ShardedAxis",
    "ShardingSpec",
    "Unstacked",
    "devices_indices_map",
    "sharding_spec_from_parsed",
]
