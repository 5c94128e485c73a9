"""partitioner: run ordinary JAX functions partitioned over a device mesh.

The public surface, and only it. The pipeline lives in the private package
``partitioner._src`` (see docs/architecture.md); ``partitioner.testing`` (imported
on its own) helps users property-test their sharding code, and
``partitioner._testing`` exposes the few internals partitioner's own tests look at.

``import partitioner`` loads what ``pjit``, ``jit`` and the specs need; the other
systems (``pmap``, host callbacks, multi-process jobs, ``colocated_python``, reports)
and the AOT stages (``.lower()``, ``Lowered``, ``Compiled``) load on first use, so a
short job, a test process or a CLI does not pay for them.
"""

from typing import TYPE_CHECKING

from . import options
from ._src import lazy
from ._src.events import add_listener, recording
from ._src.jit import JitWrapped, jit
from ._src.options import partitioner as partitioner  # deprecated (warns)
from ._src.options import set_partitioner as set_partitioner  # deprecated (warns)
from ._src.options import set_spmd_partitioner, spmd_partitioner
from ._src.pjit import PjitWrapped, pjit
from ._src.primitives.constraint import with_sharding_constraint
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
from ._src.wrapped import clear_caches

# Loaded on first use (``partitioner.pmap``, ``import partitioner.host_callback``):
# the systems a pjit/jit user never touches, and the AOT stages' types, which a call
# never reaches (``.lower()`` loads them; see ``_src/lazy.py``). Type checkers and the
# API reference read the imports below.
if TYPE_CHECKING:
    from . import distributed, host_callback, inspect, sharding_spec
    from ._src.auto.search.confirm import NoLayoutFits
    from ._src.colocated.api import colocated_cpu_devices, colocated_python
    from ._src.colocated.objects import colocated_python_class
    from ._src.pipeline.run import AutoPipelined, Pipelined, PipelinePlan, pipeline
    from ._src.pipeline.staged import StagedParams
    from ._src.pmap import PmapWrapped, pmap
    from ._src.residuals import Residual, residuals
    from ._src.sharding.sharding_spec import sharding_spec_of
    from ._src.stages import Compiled, Lowered, Traced
else:
    __getattr__, __dir__ = lazy.attach(
        __name__,
        {
            "colocated_cpu_devices": "partitioner._src.colocated.api",
            "colocated_python": "partitioner._src.colocated.api",
            "colocated_python_class": "partitioner._src.colocated.objects",
            "NoLayoutFits": "partitioner._src.auto.search.confirm",
            "pipeline": "partitioner._src.pipeline.run",
            "Pipelined": "partitioner._src.pipeline.run",
            "AutoPipelined": "partitioner._src.pipeline.run",
            "PipelinePlan": "partitioner._src.pipeline.run",
            "StagedParams": "partitioner._src.pipeline.staged",
            "PmapWrapped": "partitioner._src.pmap",
            "pmap": "partitioner._src.pmap",
            "Residual": "partitioner._src.residuals",
            "residuals": "partitioner._src.residuals",
            "sharding_spec_of": "partitioner._src.sharding.sharding_spec",
            "Compiled": "partitioner._src.stages",
            "Lowered": "partitioner._src.stages",
            "Traced": "partitioner._src.stages",
        },
        submodules=("distributed", "host_callback", "inspect", "sharding_spec"),
    )

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
    "NoLayoutFits",
    "PjitWrapped",
    "PmapWrapped",
    "AutoPipelined",
    "Pipelined",
    "PipelinePlan",
    "SpecSync",
    "StagedParams",
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
    "pipeline",
    "pjit",
    "pmap",
    "prepare_axis_resources",
    "recording",
    "residuals",
    "set_spmd_partitioner",
    "sharding_spec",
    "sharding_spec_of",
    "spmd_partitioner",
    "with_sharding_constraint",
]
