"""partitioner: run ordinary JAX functions partitioned over a device mesh.

The public surface, and only it. The pipeline lives in the private package
``partitioner._src`` (see docs/architecture.md); ``partitioner.testing`` (imported
on its own) helps users property-test their sharding code, and
``partitioner._testing`` exposes the few internals partitioner's own tests look at.
"""

from . import distributed, host_callback, inspect, options, sharding_spec
from ._src.colocated.api import colocated_cpu_devices, colocated_python
from ._src.colocated.objects import colocated_python_class
from ._src.events import add_listener, recording
from ._src.jit import JitWrapped, jit
from ._src.options import partitioner, set_partitioner
from ._src.pjit import PjitWrapped, pjit
from ._src.pmap import PmapWrapped, pmap
from ._src.primitives.constraint import with_sharding_constraint
from ._src.residuals import Residual, residuals
from ._src.sharding import (
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
from ._src.sharding.auto import AUTO
from ._src.sharding.sharding_spec import sharding_spec_of
from ._src.stages import Compiled, Lowered, Traced
from ._src.wrapped import clear_caches

__all__ = [
    "AUTO",
    "REPLICATED",
    "Residual",
    "UNCONSTRAINED",
    "Compiled",
    "Lowered",
    "ParsedPartitionSpec",
    "PartitionSpec",
    "JitWrapped",
    "PjitWrapped",
    "PmapWrapped",
    "SpecSync",
    "Traced",
    "add_listener",
    "clear_caches",
    "colocated_cpu_devices",
    "colocated_python",
    "colocated_python_class",
    "distributed",
    "get_aval_sharding_proto",
    "host_callback",
    "inspect",
    "jit",
    "mesh",
    "options",
    "parse_op_sharding",
    "partitioner",
    "pjit",
    "pmap",
    "prepare_axis_resources",
    "recording",
    "residuals",
    "set_partitioner",
    "sharding_spec",
    "sharding_spec_of",
    "with_sharding_constraint",
]
