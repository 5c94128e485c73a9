"""Lower a pjit body to a StableHLO module annotated with our shardings.

jax's per-primitive lowerings turn the jaxpr into StableHLO (with no shardings
at all); partitioner then annotates ``main``'s arguments and results itself
(``annotate.py``) and decides which donated inputs can alias an output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from ..events import emit
from ..spec.parsed import ParsedPartitionSpec
from ..trace.primitive import PjitParams
from ..warn import warn
from . import annotate
from . import rules as _rules  # noqa: F401  (registers the MLIR lowering rules)
from .layouts import annotate_layouts, has_layouts, same_donated_layout
from .memory import MemoryKinds, annotate_memory_kinds, check_device_put_devices, memory_kinds

mlir, sharding_impls, xla_bridge = jp.mlir, jp.sharding_impls, jp.xla_bridge


@dataclass(frozen=True)
class LoweredModule:
    """A lowered, annotated module plus what compilation and execution need.

    It keeps the params it was lowered for except the jaxpr: executables built
    from it are cached *weakly* on the jaxpr (NOTE [executable cache]), so
    nothing they hold may point back at it. ``aliased`` says which inputs'
    buffers outputs really reuse, a subset of ``donation_requested``
    (``plan_donation``).
    """

    module: Any  # ir.Module
    name: str
    api: str  # the front door the program was first lowered for ("pjit", "pmap")
    mesh: Mesh
    shardy: bool
    in_avals: tuple[Any, ...]
    out_avals: tuple[Any, ...]
    in_specs: tuple[ParsedPartitionSpec | None, ...]  # None: XLA chooses
    out_specs: tuple[ParsedPartitionSpec | None, ...]
    donation_requested: tuple[bool, ...]
    aliased: tuple[bool, ...]
    ordered_effects: tuple[Any, ...]  # main's leading token arguments and results, in order
    host_callbacks: tuple[Any, ...]
    keepalive: Any
    memory: MemoryKinds | None = None  # None: every value in default memory

    def in_memory_kind(self, i: int) -> str | None:
        """Input ``i``'s memory kind (None: the devices' default)."""
        return None if self.memory is None else self.memory.inputs[i]

    def out_memory_kind(self, i: int) -> str | None:
        """Output ``i``'s memory kind (None: the devices' default)."""
        return None if self.memory is None else self.memory.outputs[i]

    def params(self, jaxpr: Any) -> PjitParams:
        """The params this module was lowered for, given the body it came from."""
        return PjitParams(
            jaxpr=jaxpr,
            in_axis_resources=self.in_specs,
            out_axis_resources=self.out_specs,
            mesh=self.mesh,
            donated_invars=self.donation_requested,
            name=self.name,
            api=self.api,
        )

    def as_text(self) -> str:
        return str(self.module)


def _sharded_shape(aval: Any, spec: ParsedPartitionSpec | None, mesh: Mesh) -> Any:
    """What decides whether two buffers can alias: per-device shape, dtype, layout."""
    if spec is None:
        return None
    return (spec.shard_shape(tuple(aval.shape), mesh), aval.dtype, spec.to_partition_spec())


def plan_donation(
    in_avals: Sequence[Any],
    in_specs: Sequence[ParsedPartitionSpec | None],
    donated: Sequence[bool],
    out_avals: Sequence[Any],
    out_specs: Sequence[ParsedPartitionSpec | None],
    mesh: Mesh,
    api: str,
    memory: MemoryKinds | None = None,
) -> tuple[tuple[bool, ...], tuple[int | None, ...]]:
    """Pair each donated input with an output it can alias (``api`` names the call).

    An input can be reused only by an output with the same per-device buffer:
    same global shape, dtype and spec, in the same memory (``memory``: each
    value's kind; None when all live in the default one). Donations with no such output are
    dropped with a warning, so those inputs stay alive (not deleted).

    Returns:
        ``(usable, aliases)``: which inputs are really donated, and for each
        input the index of the output it aliases (or None).
    """
    in_kinds = memory.inputs if memory else (None,) * len(in_avals)
    out_kinds = memory.outputs if memory else (None,) * len(out_avals)
    free: dict[Any, list[int]] = {}
    for j, (aval, spec) in enumerate(zip(out_avals, out_specs, strict=True)):
        key = _sharded_shape(aval, spec, mesh)
        if key is not None:
            free.setdefault((tuple(aval.shape), key, out_kinds[j]), []).append(j)
    aliases: list[int | None] = []
    unusable = []
    for i, (aval, spec, d) in enumerate(zip(in_avals, in_specs, donated, strict=True)):
        key = (tuple(aval.shape), _sharded_shape(aval, spec, mesh), in_kinds[i])
        outs = free.get(key) if d else None
        where = f"{api} input {i}"
        if outs and same_donated_layout(in_specs[i], out_specs[outs[0]], len(aval.shape), where):
            aliases.append(outs.pop(0))
        else:
            aliases.append(None)
            if d:
                unusable.append(f"input {i} {aval.str_short()}")
    if unusable:
        warn(
            f"{api}: some donated buffers were not usable (no output with the same shape, "
            f"dtype and partitioning): {', '.join(unusable)}. These inputs are not consumed."
        )
    return tuple(a is not None for a in aliases), tuple(aliases)


def ordered_effects_of(params: PjitParams) -> tuple[Any, ...]:
    """The ordered effects of the body, each a token through ``main``.

    Raises:
        ValueError: an ordered effect XLA cannot shard (``jax.debug.callback(...,
            ordered=True)``) on more than one device, as ``jax.jit`` says it.
    """
    ordered = tuple(jp.effects.ordered_effects.filter_in(params.jaxpr.effects))
    unshardable = [e for e in ordered if not jp.effects.shardable_ordered_effects.contains(e)]
    if unshardable and params.mesh.size > 1:
        raise ValueError(
            f"{params.api} {params.name}: the following ordered effects are not supported for more "
            f"than 1 device: {unshardable}. jax.jit refuses them too; use an unordered "
            "callback (ordered=False), partitioner.host_callback.id_tap (ordered, on any "
            "number of devices), or a mesh of one device."
        )
    return ordered


def lower_pjit_body(params: PjitParams, shardy: bool) -> LoweredModule:
    """Lower ``params.jaxpr`` over its mesh and annotate ``main`` with our shardings.

    A ``None`` spec (inputs or outputs) leaves the value for XLA to shard.
    """
    emit("lower", name=params.name)
    mesh, jaxpr = params.mesh, params.jaxpr
    devices = tuple(mesh.devices.flat)
    backend = xla_bridge.get_device_backend(devices[0])
    in_avals, out_avals = tuple(jaxpr.in_avals), tuple(jaxpr.out_avals)
    in_specs, out_specs = params.in_axis_resources, params.out_axis_resources
    check_device_put_devices(jaxpr.jaxpr, [d.id for d in devices], params.api, params.name)
    default_kind = devices[0].default_memory().kind
    kinds = memory_kinds(in_avals, in_specs, out_avals, out_specs, jaxpr, default_kind)
    aliased, aliases = plan_donation(
        in_avals,
        in_specs,
        params.donated_invars,
        out_avals,
        out_specs,
        mesh,
        f"{params.api} {params.name}",
        kinds,
    )
    ordered = ordered_effects_of(params)
    with jp.shardy_config(shardy):
        result = mlir.lower_jaxpr_to_module(
            f"pjit_{params.name}",
            jaxpr,
            num_const_args=0,
            in_avals=in_avals,
            ordered_effects=list(ordered),
            platforms=[backend.platform],
            backend=backend,
            axis_context=sharding_impls.ShardingContext(len(devices), devices),
            # Aliases are decided above (plan_donation); jax's own matching
            # would add buffer donors on top, which XLA rejects.
            donated_args=[False] * len(in_avals),
            input_output_aliases=aliases,
            num_partitions=len(devices),
            all_default_mem_kind=kinds is None,
            lowering_parameters=mlir.LoweringParameters(hoist_constants_as_args=False),
        )
        with result.module.context:
            annotate.set_main_shardings(
                result.module, in_avals, in_specs, out_avals, out_specs, mesh, shardy
            )
            main = annotate.find_main(result.module)
            if kinds is not None:
                annotate_memory_kinds(main, kinds)
            if has_layouts(in_specs, out_specs):
                annotate_layouts(main, in_avals, in_specs, out_avals, out_specs)
    return LoweredModule(
        module=result.module,
        name=params.name,
        api=params.api,
        mesh=mesh,
        shardy=shardy,
        in_avals=in_avals,
        out_avals=out_avals,
        in_specs=in_specs,
        out_specs=out_specs,
        donation_requested=params.donated_invars,
        aliased=aliased,
        ordered_effects=ordered,
        host_callbacks=tuple(result.host_callbacks),
        keepalive=result.keepalive,
        memory=kinds,
    )
