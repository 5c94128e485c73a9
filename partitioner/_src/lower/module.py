"""Lower a pjit body to a StableHLO module annotated with our shardings.

jax's per-primitive lowerings turn the jaxpr into StableHLO (with no shardings
at all); partitioner then annotates ``main``'s arguments and results itself
(``annotate.py``) and decides which donated inputs can alias an output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from ..events import emit
from ..primitives.pjit_call import PjitParams
from ..sharding.mesh_env import typed_context
from ..sharding.parsed import ParsedPartitionSpec
from ..warn import warn
from . import annotate
from .annotate import MainValues
from .layouts import annotate_layouts, has_layouts, same_donated_layout
from .memory import MemoryKinds, annotate_memory_kinds, check_device_put_devices, memory_kinds


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
    committed: bool  # results are committed (PjitParams.committed)
    compiler_options: tuple[tuple[str, Any], ...]  # PjitParams.compiler_options
    shardy: bool
    values: MainValues  # main's arguments and results: avals, specs (None: XLA chooses)
    donation_requested: tuple[bool, ...]
    aliased: tuple[bool, ...]
    ordered_effects: tuple[Any, ...]  # main's leading token arguments and results, in order
    host_callbacks: tuple[Any, ...]
    keepalive: Any
    memory: MemoryKinds | None = None  # None: every value in default memory
    # jax.jit's "Some donated buffers were not usable" for this program, or None; said
    # by whoever lowers or first calls it (warn_unusable_donations), as jax.jit does.
    donation_warning: str | None = None

    @property
    def in_avals(self) -> tuple[Any, ...]:
        return self.values.in_avals

    @property
    def out_avals(self) -> tuple[Any, ...]:
        return self.values.out_avals

    @property
    def in_specs(self) -> tuple[ParsedPartitionSpec | None, ...]:
        return self.values.in_specs

    @property
    def out_specs(self) -> tuple[ParsedPartitionSpec | None, ...]:
        return self.values.out_specs

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
            committed=self.committed,
            compiler_options=self.compiler_options,
        )

    @property
    def module_name(self) -> str:
        """The module's symbol name: ``jit_f`` for ``jit`` (as jax.jit names it), else ``pjit_f``."""
        return module_name(self.api, self.name)

    def as_text(self, debug_info: bool = False) -> str:
        return jp.module_to_string(self.module, enable_debug_info=debug_info)


def module_name(api: str, name: str) -> str:
    """A lowered module's name: ``jit_f`` for a ``jit`` (jax.jit's), ``pjit_f`` for pjit and pmap."""
    return f"{'jit' if api == 'jit' else 'pjit'}_{name}"


def _shape(aval: Any) -> tuple[int, ...]:
    """An aval's shape; an ordering token's is ``()`` (it holds no data)."""
    return tuple(getattr(aval, "shape", ()))


def _sharded_shape(aval: Any, spec: ParsedPartitionSpec | None, mesh: Mesh) -> Any:
    """What decides whether two buffers can alias: per-device shape, dtype, layout
    (None: nothing aliases it, an unspecified layout or an ordering token)."""
    if spec is None or jp.is_token(aval):
        return None
    return (spec.shard_shape(tuple(aval.shape), mesh), aval.dtype, spec.to_partition_spec())


def _elements_per_device(aval: Any, spec: ParsedPartitionSpec | None, mesh: Mesh) -> int:
    """Elements of one device's buffer (the global count where XLA chooses the layout)."""
    if spec is None:
        return int(aval.size)
    return math.prod(spec.shard_shape(_shape(aval), mesh))


def _per_device_aval(aval: Any, spec: ParsedPartitionSpec | None, mesh: Mesh) -> str:
    """The buffer one device holds, as jax.jit's donation warning names it (``float32[4]``)."""
    shape = tuple(aval.shape) if spec is None else spec.shard_shape(tuple(aval.shape), mesh)
    return aval.update(shape=shape).str_short()


def plan_donation(
    values: MainValues,
    donated: Sequence[bool],
    mesh: Mesh,
    api: str,
    memory: MemoryKinds | None = None,
) -> tuple[tuple[bool, ...], tuple[int | None, ...], tuple[int, ...], str | None]:
    """Pair each donated input with an output it can alias (``api`` names the call).

    An input is aliased to an output with the same per-device buffer: same
    global shape, dtype and spec, in the same memory (``memory``: each value's
    kind; None when all live in the default one) and layout. As in ``jax.jit``, a
    donated input left over is still handed to XLA as a *buffer donor* when an
    output not aliased yet has as many elements per device in the same memory
    (``(16, 1)`` into ``(16,)``): XLA may reuse it, and the input is consumed.
    Donations with neither are dropped with a warning, so those inputs stay
    alive (not deleted).

    Returns:
        ``(usable, aliases, donors, warning)``: which inputs are really donated, for
        each input the index of the output it aliases (or None), the inputs given to
        XLA as buffer donors, and jax.jit's warning naming the others (or None).
    """
    in_kinds = memory.inputs if memory else (None,) * len(values.in_avals)
    out_kinds = memory.outputs if memory else (None,) * len(values.out_avals)
    free: dict[Any, list[int]] = {}
    for j, (aval, spec) in enumerate(zip(values.out_avals, values.out_specs, strict=True)):
        key = _sharded_shape(aval, spec, mesh)
        if key is not None:
            free.setdefault((_shape(aval), key, out_kinds[j]), []).append(j)
    aliases: list[int | None] = []
    unusable: list[int] = []
    for i, (aval, spec, d) in enumerate(
        zip(values.in_avals, values.in_specs, donated, strict=True)
    ):
        key = (_shape(aval), _sharded_shape(aval, spec, mesh), in_kinds[i])
        outs = free.get(key) if d else None
        where = f"{api} input {i}"
        if outs and same_donated_layout(
            values.in_specs[i], values.out_specs[outs[0]], len(aval.shape), where
        ):
            aliases.append(outs.pop(0))
        else:
            aliases.append(None)
    taken = {a for a in aliases if a is not None}
    by_size: dict[tuple[int, Any], list[int]] = {}
    for j, (aval, spec) in enumerate(zip(values.out_avals, values.out_specs, strict=True)):
        if j not in taken:
            by_size.setdefault((_elements_per_device(aval, spec, mesh), out_kinds[j]), []).append(j)
    # As jax.jit: over several devices, where XLA chooses some output's layout, every
    # donated input left over is a buffer donor; XLA aliases it after partitioning.
    xla_decides = mesh.size > 1 and any(spec is None for spec in values.out_specs)
    donors = []
    for i, (aval, spec, d, a) in enumerate(
        zip(values.in_avals, values.in_specs, donated, aliases, strict=True)
    ):
        size = (_elements_per_device(aval, spec, mesh), in_kinds[i])
        if d and a is None:
            if by_size.get(size):
                by_size[size].pop(0)
                donors.append(i)
            elif xla_decides:
                donors.append(i)
            else:
                unusable.append(i)
    warning = None
    if unusable:
        per_device = ", ".join(
            _per_device_aval(values.in_avals[i], values.in_specs[i], mesh) for i in unusable
        )
        inputs = ", ".join(f"input {i} {values.in_avals[i].str_short()}" for i in unusable)
        warning = (
            f"Some donated buffers were not usable: {per_device}.\n"
            "See an explanation at https://docs.jax.dev/en/latest/faq.html#buffer-donation.\n"
            f"({api}: {inputs}: no output has the same shape, dtype and partitioning; "
            "these inputs are not consumed.)"
        )
    usable = tuple(a is not None or i in donors for i, a in enumerate(aliases))
    return usable, tuple(aliases), tuple(donors), warning


def warn_unusable_donations(lowered: LoweredModule) -> None:
    """Say jax.jit's donation warning for ``lowered``'s program, if it has one."""
    if lowered.donation_warning is not None:
        warn(lowered.donation_warning)


def ordered_effects_of(params: PjitParams) -> tuple[Any, ...]:
    """The ordered effects of the body, each a token through ``main``.

    Raises:
        ValueError: an ordered effect XLA cannot shard (``jax.debug.callback(...,
            ordered=True)``) on more than one device, as ``jax.jit`` says it.
    """
    ordered = tuple(jp.ordered_effects.filter_in(params.jaxpr.effects))
    unshardable = [e for e in ordered if not jp.shardable_ordered_effects.contains(e)]
    if unshardable and params.mesh.size > 1:
        raise ValueError(
            f"{params.api} {params.name}: the following ordered effects are not supported for more "
            f"than 1 device: {unshardable}. jax.jit refuses them too; use an unordered "
            "callback (ordered=False), partitioner.host_callback.id_tap (ordered, on any "
            "number of devices), or a mesh of one device."
        )
    return ordered


def value_names(jaxpr: Any, n_in: int, n_out: int) -> tuple[list[str], list[str]]:
    """Names of ``main``'s arguments and results: their pytree paths (``params['w1']``, ``x``).

    jax.jit's names from the trace's debug info; leading inputs with no name
    (values of an enclosing trace) get ``""``. Results are named ``result...``
    as jax.jit names them (``result[0]['y']``).
    """
    debug = jaxpr.jaxpr.debug_info
    names = tuple(debug.arg_names or ()) if debug is not None else ()
    args = [""] * (n_in - len(names)) + [n or "" for n in names] if len(names) <= n_in else []
    paths = tuple(debug.result_paths or ()) if debug is not None else ()
    results = list(paths) if len(paths) == n_out and all(isinstance(p, str) for p in paths) else []
    return args or [""] * n_in, results


def typed_out_specs(
    out_avals: Sequence[Any], out_specs: Sequence[ParsedPartitionSpec | None], mesh: Mesh
) -> tuple[ParsedPartitionSpec | None, ...]:
    """Each ``None`` output spec replaced by its type's sharding where the type has one.

    NOTE [unspecified outputs follow the type]: over a mesh whose axes are all
    Explicit, jax.jit lays an output it was given no sharding for out as its type
    says (``float32[8@x,4]`` -> ``P('x', None)``); so does partitioner, for the
    same outputs (omitted specs, residuals). Over a mesh mixing Auto and
    Explicit axes the spec stays ``None``: the body's ops already pin the
    Explicit dims, and XLA chooses the rest, as jax leaves them unconstrained.
    """
    abstract = mesh.abstract_mesh
    if not abstract.are_all_axes_explicit:
        return tuple(out_specs)
    resolved: list[ParsedPartitionSpec | None] = []
    for aval, spec in zip(out_avals, out_specs, strict=True):
        sharding = getattr(aval, "sharding", None)
        if (
            spec is None
            and sharding is not None
            and sharding.mesh == abstract
            and not sharding.spec.unreduced
            and not sharding.spec.reduced
        ):
            spec = ParsedPartitionSpec.from_user_input(sharding.spec, "output type")
        resolved.append(spec)
    return tuple(resolved)


def lower_pjit_body(params: PjitParams, shardy: bool) -> LoweredModule:
    """Lower ``params.jaxpr`` over its mesh and annotate ``main`` with our shardings.

    A ``None`` spec (inputs or outputs) leaves the value for XLA to shard, but
    see NOTE [unspecified outputs follow the type].
    """
    emit("lower", name=params.name)
    mesh, jaxpr = params.mesh, params.jaxpr
    devices = tuple(mesh.devices.flat)
    out_avals = tuple(jaxpr.out_avals)
    values = MainValues(
        tuple(jaxpr.in_avals),
        params.in_axis_resources,
        out_avals,
        typed_out_specs(out_avals, params.out_axis_resources, mesh),
    )
    check_device_put_devices(jaxpr.jaxpr, [d.id for d in devices], params.api, params.name)
    default_kind = devices[0].default_memory().kind
    kinds = memory_kinds(values, jaxpr, default_kind)
    aliased, aliases, donors, donation_warning = plan_donation(
        values, params.donated_invars, mesh, f"{params.api} {params.name}", kinds
    )
    ordered = ordered_effects_of(params)
    arg_names, result_names = value_names(jaxpr, len(values.in_avals), len(out_avals))
    with (
        jp.shardy_config(shardy),
        typed_context(mesh),
        jp.log_elapsed_time(
            "Finished jaxpr to MLIR module conversion {fun_name} in {elapsed_time:.9f} sec",
            fun_name=module_name(params.api, params.name),
            event=jp.JAXPR_TO_MLIR_MODULE_EVENT,
        ),
    ):
        result = _lower_main(params, ordered, aliases, arg_names, result_names, kinds is None)
        with result.module.context:
            annotate.set_main_shardings(result.module, values, mesh, shardy)
            main = annotate.find_main(result.module)
            annotate.mark_buffer_donors(main, len(values.in_avals), donors)
            annotate.set_arg_names(main, arg_names)
            if kinds is not None:
                annotate_memory_kinds(main, kinds)
            if has_layouts(values):
                annotate_layouts(main, values)
    return LoweredModule(
        module=result.module,
        name=params.name,
        api=params.api,
        mesh=mesh,
        committed=params.committed,
        compiler_options=params.compiler_options,
        shardy=shardy,
        values=values,
        donation_requested=params.donated_invars,
        aliased=aliased,
        ordered_effects=ordered,
        host_callbacks=tuple(result.host_callbacks),
        keepalive=result.keepalive,
        memory=kinds,
        donation_warning=donation_warning,
    )


def _lower_main(
    params: PjitParams,
    ordered: tuple[Any, ...],
    aliases: Sequence[int | None],
    arg_names: list[str],
    result_names: list[str],
    all_default_memory: bool,
) -> Any:
    """jax's per-primitive lowering of the body into a module with no shardings on ``main``."""
    devices = tuple(params.mesh.devices.flat)
    backend = jp.get_device_backend(devices[0])
    n_in = len(params.jaxpr.in_avals)
    return jp.lower_jaxpr_to_module(
        module_name(params.api, params.name),
        params.jaxpr,
        num_const_args=0,
        in_avals=tuple(params.jaxpr.in_avals),
        ordered_effects=list(ordered),
        platforms=[backend.platform],
        backend=backend,
        # The abstract mesh too, as jax.jit's own context has it: a lowering rule that
        # builds shardings from it (custom_partitioning's callbacks get NamedShardings
        # over the call's mesh, not GSPMDShardings) sees what it sees under jax.jit.
        axis_context=jp.ShardingContext(len(devices), devices, params.mesh.abstract_mesh),
        # Aliases are decided by plan_donation; jax's own matching would add
        # buffer donors on top, which XLA rejects.
        donated_args=[False] * n_in,
        input_output_aliases=tuple(aliases),
        num_partitions=len(devices),
        arg_names=arg_names,
        result_names=result_names,
        all_default_mem_kind=all_default_memory,
        lowering_parameters=jp.LoweringParameters(hoist_constants_as_args=False),
    )
