"""Stage 1 of the pipeline: partition specs, the mesh context, OpSharding <-> mesh axes."""

from .checks import check_spec, check_specs
from .mesh_env import as_auto_mesh, current_mesh, maybe_current_mesh, mesh
from .op_sharding import (
    get_aval_sharding_proto,
    get_hlo_sharding,
    hlo_sharding_text,
    parse_op_sharding,
    parse_op_sharding_parsed,
    sdy_mesh_text,
    sdy_sharding_text,
)
from .parsed import REPLICATED, ParsedPartitionSpec, SpecSync
from .partition_spec import UNCONSTRAINED, PartitionSpec
from .sharding_spec import (
    Chunked,
    NoSharding,
    Replicated,
    ShardedAxis,
    ShardingSpec,
    Unstacked,
    devices_indices_map,
    sharding_spec_from_parsed,
)
from .tree import broadcast_prefix, prepare_axis_resources

__all__ = [
    "REPLICATED",
    "UNCONSTRAINED",
    "Chunked",
    "NoSharding",
    "ParsedPartitionSpec",
    "PartitionSpec",
    "Replicated",
    "ShardedAxis",
    "ShardingSpec",
    "SpecSync",
    "Unstacked",
    "as_auto_mesh",
    "broadcast_prefix",
    "check_spec",
    "check_specs",
    "current_mesh",
    "devices_indices_map",
    "get_aval_sharding_proto",
    "get_hlo_sharding",
    "hlo_sharding_text",
    "maybe_current_mesh",
    "mesh",
    "parse_op_sharding",
    "parse_op_sharding_parsed",
    "prepare_axis_resources",
    "sdy_mesh_text",
    "sdy_sharding_text",
    "sharding_spec_from_parsed",
]
