"""Stage 1 of the pipeline: partition specs, the mesh context, OpSharding <-> mesh axes.

The package re-exports what the public surface (``partitioner/__init__.py``) offers;
the stages above import the modules they use directly.
"""

from .mesh_env import mesh
from .op_sharding import get_aval_sharding_proto, parse_op_sharding
from .parsed import REPLICATED, ParsedPartitionSpec, SpecSync
from .partition_spec import UNCONSTRAINED, PartitionSpec
from .tree import prepare_axis_resources

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
