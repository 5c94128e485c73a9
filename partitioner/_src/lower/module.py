"""Lower a pjit body to a StableHLO module annotated with our shardings.

jax's per-primitive lowerings turn the jaxpr into StableHLO (with no shardings
at all); partitioner then annotates ``main``'s arguments and results itself
(``annotate.py``) and decides which donated inputs can alias an output.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from ..events import emit
from ..spec.parsed import ParsedPartitionSpec
from . import annotate
from . import rules as _rules  # noqa: F401  (registers the MLIR lowering rules)

mlir, sharding_impls, xla_bridge = jp.mlir, jp.sharding_impls, jp.xla_bridge


@dataclass(frozen=True)
class LoweredModule:
    """A lowered, annotated module plus what compilation and execution need."""

    module: Any  # ir.Module
    name: str
    mesh: Mesh
    shardy: bool
    in_avals: tuple[Any, ...]
    out_avals: tuple[Any, ...]
    in_specs: tuple[ParsedPartitionSpec | None, ...]
    out_specs: tuple[ParsedPartitionSpec | None, ...]
    donate_requested: tuple[bool, ...]
    donated: tuple[bool, ...]  # inputs whose buffers are really reused
    host_callbacks: tuple[Any, ...]
    keepalive: Any

    def as_text(self) -> str:
        return str(self.module)


def _sharded_shape(
    aval: Any, spec: ParsedPartitionSpec | None, mesh: Mesh
) -> tuple[Any, ...] | None:
    if spec is None:
        return None
    sizes = dict(mesh.shape)
    per_dim = [1] * len(aval.shape)
    for d, axes in enumerate(spec.partitions):
        for a in axes:
            per_dim[d] *= sizes[a]
    return (
        tuple(s // k for s, k in zip(aval.shape, per_dim)),
        aval.dtype,
        spec.to_partition_spec(),
    )


def plan_donation(
    in_avals: Sequence[Any],
    in_specs: Sequence[ParsedPartitionSpec | None],
    donated: Sequence[bool],
    out_avals: Sequence[Any],
    out_specs: Sequence[ParsedPartitionSpec | None],
    mesh: Mesh,
    name: str,
) -> tuple[tuple[bool, ...], tuple[int | None, ...]]:
    """Pair each donated input with an output it can alias.

    An input can be reused only by an output with the same per-device buffer:
    same global shape, dtype and spec. Donations with no such output are
    dropped with a warning, so those inputs stay alive (not deleted).

    Returns:
        ``(usable, aliases)``: which inputs are really donated, and for each
        input the index of the output it aliases (or None).
    """
    free: dict[Any, list[int]] = {}
    for j, (aval, spec) in enumerate(zip(out_avals, out_specs, strict=True)):
        key = _sharded_shape(aval, spec, mesh)
        if key is not None:
            free.setdefault((tuple(aval.shape), key), []).append(j)
    aliases: list[int | None] = []
    unusable = []
    for i, (aval, spec, d) in enumerate(zip(in_avals, in_specs, donated, strict=True)):
        outs = free.get((tuple(aval.shape), _sharded_shape(aval, spec, mesh))) if d else None
        if outs:
            aliases.append(outs.pop(0))
        else:
            aliases.append(None)
            if d:
                unusable.append(f"input {i} {aval.str_short()}")
    if unusable:
        warnings.warn(
            f"pjit {name}: some donated buffers were not usable (no output with the same shape, "
            f"dtype and partitioning): {', '.join(unusable)}. These inputs are not consumed.",
            stacklevel=4,
        )
    return tuple(a is not None for a in aliases), tuple(aliases)


def lower_pjit_body(
    jaxpr: Any,
    in_specs: Sequence[ParsedPartitionSpec | None],
    out_specs: Sequence[ParsedPartitionSpec | None],
    mesh: Mesh,
    donated: Sequence[bool],
    name: str,
    shardy: bool,
) -> LoweredModule:
    """Lower ``jaxpr`` over ``mesh`` and annotate ``main`` with our shardings.

    A ``None`` spec (inputs or outputs) leaves the value for XLA to shard.
    """
    emit("lower", name=name)
    devices = tuple(mesh.devices.flat)
    backend = xla_bridge.get_device_backend(devices[0])
    in_avals = tuple(jaxpr.in_avals)
    out_avals = tuple(jaxpr.out_avals)
    usable, aliases = plan_donation(in_avals, in_specs, donated, out_avals, out_specs, mesh, name)
    with jp.shardy_config(shardy):
        result = mlir.lower_jaxpr_to_module(
            f"pjit_{name}",
            jaxpr,
            num_const_args=0,
            in_avals=in_avals,
            ordered_effects=[],
            platforms=[backend.platform],
            backend=backend,
            axis_context=sharding_impls.ShardingContext(len(devices), devices),
            # Aliases are decided above (plan_donation); jax's own matching
            # would add buffer donors on top, which XLA rejects.
            donated_args=[False] * len(in_avals),
            input_output_aliases=aliases,
            num_partitions=len(devices),
            lowering_parameters=mlir.LoweringParameters(hoist_constants_as_args=False),
        )
        with result.module.context:
            annotate.set_main_shardings(
                result.module, in_avals, in_specs, out_avals, out_specs, mesh, shardy
            )
    return LoweredModule(
        module=result.module,
        name=name,
        mesh=mesh,
        shardy=shardy,
        in_avals=in_avals,
        out_avals=out_avals,
        in_specs=tuple(in_specs),
        out_specs=tuple(out_specs),
        donate_requested=tuple(donated),
        donated=usable,
        host_callbacks=tuple(result.host_callbacks),
        keepalive=result.keepalive,
    )
