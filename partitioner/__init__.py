"""partitioner: run ordinary JAX functions partitioned over a device mesh.

The public surface, and only it. See docs/architecture.md for the pipeline.
"""

from .spec import (
    REPLICATED,
    UNCONSTRAINED,
    ParsedPartitionSpec,
    PartitionSpec,
    SpecSync,
    get_aval_sharding_proto,
    mesh,
    parse_op_sharding,
    prepare_axis_resources,
)

__all__ = [
    "REPLICATED",
    "UNCONSTRAINED",
    "ParsedPartitionSpec",
    "PartitionSpec",
    "SpecSync",
    "get_aval_sharding_proto",
    "mesh",
    "parse_op_sharding",
    "prepare_axis_resources",
]
