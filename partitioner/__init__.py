"""partitioner: run ordinary JAX functions partitioned over a device mesh.

The public surface, and only it. See docs/architecture.md for the pipeline.
"""

from . import lower as _lower  # noqa: F401  (registers our MLIR lowering rules)
from . import options
from . import rules as _rules  # noqa: F401  (registers our transformation rules)
from .api import pjit
from .dispatch import clear_caches
from .dispatch.fastpath import PjitWrapped
from .events import add_listener, recording
from .inspect import Residual, residuals
from .options import partitioner, set_partitioner
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
from .stages import Compiled, Lowered
from .trace.constraint import with_sharding_constraint

__all__ = [
    "REPLICATED",
    "Residual",
    "UNCONSTRAINED",
    "Compiled",
    "Lowered",
    "ParsedPartitionSpec",
    "PartitionSpec",
    "PjitWrapped",
    "SpecSync",
    "add_listener",
    "clear_caches",
    "get_aval_sharding_proto",
    "mesh",
    "options",
    "parse_op_sharding",
    "partitioner",
    "pjit",
    "prepare_axis_resources",
    "recording",
    "residuals",
    "set_partitioner",
    "with_sharding_constraint",
]
