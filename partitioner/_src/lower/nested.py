"""MLIR lowering rules for ``pjit_p`` and ``sharding_constraint_p``.

These run whenever one of our primitives appears inside a module being lowered:
a pjit nested in another pjit, in ``jax.jit``, or in a control-flow body. The
body becomes a private function called from the enclosing module, with sharding
constraints on its inputs and outputs so XLA honours the inner specs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import jax_private as jp
from ..primitives.constraint import ConstraintParams, sharding_constraint_p
from ..primitives.pjit_call import PjitParams, pjit_p
from ..sharding.parsed import ParsedPartitionSpec
from . import annotate


@dataclass(frozen=True)
class Placement:
    """How the mesh's devices sit in the module being lowered (NOTE [device positions]).

    ``positions[i]`` is where mesh device ``i`` sits (None: the identity);
    ``single_device``: the enclosing computation runs on one device, where
    constraints mean nothing and are skipped (the values are still exact).
    """

    positions: tuple[int, ...] | None = None
    single_device: bool = False


def placement(ctx: Any, mesh: Mesh, what: str) -> Placement:
    """Where each mesh device sits in the enclosing module.

    Raises:
        ValueError: the enclosing module runs on other devices than the mesh, or
            is a manual-SPMD body (shard_map / pmap).
    """
    axis_ctx = ctx.module_context.axis_context
    if not isinstance(axis_ctx, jp.ShardingContext):
        raise ValueError(
            f"{what} cannot be lowered inside {type(axis_ctx).__name__} (shard_map / pmap bodies); "
            "call it outside, or use jax.lax collectives there."
        )
    assignment = axis_ctx.device_assignment
    if axis_ctx.num_devices == 1 and mesh.size > 1:
        return Placement(single_device=True)
    if assignment is None:
        if axis_ctx.num_devices != mesh.size:
            raise ValueError(
                f"{what}: the enclosing computation has {axis_ctx.num_devices} devices, the mesh {mesh.size}"
            )
        return Placement()
    index = {d: i for i, d in enumerate(assignment)}
    positions = [index.get(d) for d in mesh.devices.flat]
    if len(assignment) != mesh.size or any(p is None for p in positions):
        raise ValueError(
            f"{what}: the enclosing computation runs on devices {[d.id for d in assignment]}, but the "
            f"mesh {dict(mesh.shape)} has devices {[d.id for d in mesh.devices.flat]}. Pass inputs "
            "laid out over the mesh (e.g. outputs of a pjit) or call the pjit-ed function outside "
            "the enclosing jit."
        )
    if positions == list(range(len(positions))):
        return Placement()
    return Placement(positions=tuple(p for p in positions if p is not None))


def _constrain_all(
    ctx: Any,
    values: Sequence[Any],
    avals: Sequence[Any],
    specs: Sequence[ParsedPartitionSpec | None],
    mesh: Mesh,
    where: Placement,
) -> list[Any]:
    if where.single_device:
        return list(values)
    shardy = jp.jax_uses_shardy()
    positions = where.positions
    return [
        v if spec is None else annotate.constrain(ctx, v, aval, spec, mesh, shardy, positions)
        for v, aval, spec in zip(values, avals, specs, strict=True)
    ]


# --- pjit ---


def pjit_lowering(ctx: Any, *args: Any, **kwargs: Any) -> list[Any]:
    params = PjitParams.of(kwargs)
    mesh = params.mesh
    # A call nothing placed (on the default device: tracers, uncommitted values)
    # runs wherever the enclosing computation does; it constrains nothing.
    where = (
        placement(ctx, mesh, f"{params.api} {params.name}")
        if params.committed
        else Placement(single_device=True)
    )
    ins = _constrain_all(ctx, args, ctx.avals_in, params.in_axis_resources, mesh, where)
    effects = list(jp.ordered_effects.filter_in(params.jaxpr.effects))
    tokens_in = ctx.tokens_in.subset(effects)
    outs, tokens = jp.call_lowering(
        f"pjit_{params.name}",
        params.jaxpr,
        None,
        ctx.module_context,
        ctx.avals_in,
        ctx.avals_out,
        tokens_in,
        *ins,
        dim_var_values=ctx.dim_var_values,
        const_lowering=ctx.const_lowering,
    )
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(tokens))
    return _constrain_all(ctx, outs, ctx.avals_out, params.out_axis_resources, mesh, where)


# --- sharding constraint ---


def constraint_lowering(
    ctx: Any, x: Any, *, axis_resources: ParsedPartitionSpec, mesh: Mesh
) -> list[Any]:
    axis_ctx = ctx.module_context.axis_context
    if isinstance(axis_ctx, jp.SPMDAxisContext) and axis_ctx.mesh.shape == mesh.shape:
        return [_in_manual_region(ctx, x, axis_resources, mesh, frozenset(axis_ctx.manual_axes))]
    where = placement(ctx, mesh, "with_sharding_constraint")
    return _constrain_all(ctx, [x], ctx.avals_in, [axis_resources], mesh, where)


def _in_manual_region(
    ctx: Any, x: Any, spec: ParsedPartitionSpec, mesh: Mesh, manual: frozenset[str]
) -> Any:
    """A constraint in a region manual over ``manual`` (a pipeline's stages and shards,
    NOTE [pipeline by actions]): there each device holds its block, so the manual axes
    are dropped from the spec; what is left constrains the axes XLA still partitions
    (nothing, when every axis is manual)."""
    if manual >= set(mesh.axis_names):
        return x
    kept = [
        tuple(a for a in (dim if isinstance(dim, tuple) else (dim,)) if a not in manual)
        if dim is not None and dim is not PartitionSpec.UNCONSTRAINED
        else dim
        for dim in spec.to_partition_spec()
    ]
    free = PartitionSpec(*(d if not isinstance(d, tuple) or d else None for d in kept))
    (aval,) = ctx.avals_in
    aval = jp.physical_aval(aval)
    unconstrained = {i for i, d in enumerate(free) if d is PartitionSpec.UNCONSTRAINED}
    if jp.jax_uses_shardy():
        parsed = ParsedPartitionSpec.from_user_input(
            free, "with_sharding_constraint", allow_unconstrained=True
        )
        return annotate.constrain(ctx, x, aval, parsed, mesh, True)
    proto = jp.manual_scoped_op_sharding(mesh, free, manual, len(aval.shape))
    return jp.wrap_with_sharding_op(ctx, x, aval, proto, unspecified_dims=unconstrained or None)


# --- the devices of an enclosing jax.jit ---


def intermediate_shardings(jaxpr: Any) -> Iterator[tuple[NamedSharding, Any, str]]:
    """One sharding over the mesh of each of our equations in ``jaxpr`` (this level only).

    NOTE [device assignment under jax.jit] in ``jax_private/patches.py``: the enclosing
    computation then runs on the mesh's devices, as it does around jax's own
    ``jit(..., in_shardings=...)``, and two different device sets are an error.
    """
    for eqn in jaxpr.eqns:
        if eqn.primitive is pjit_p:
            params = PjitParams.of(eqn.params)
            if not params.committed:
                continue  # placed on the default device because nothing placed it: no sharding
            yield _replicated(params.mesh), eqn.source_info, eqn.primitive.name
        elif eqn.primitive is sharding_constraint_p:
            mesh = ConstraintParams.of(eqn.params).mesh
            yield _replicated(mesh), eqn.source_info, eqn.primitive.name


@functools.lru_cache(maxsize=64)
def _replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
