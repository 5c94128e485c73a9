"""MLIR lowering of ``pmap_region_p``: the per-device body as a manual-SPMD computation.

NOTE [pmap region lowering]: every device runs the body on its block, and the
body's collectives (``psum``, ``all_gather``...) lower to XLA collectives over
the region's axis, because the body is lowered under an ``SPMDAxisContext`` whose
manual axis is that axis and under the axis environment that names it.
- GSPMD: each input gets its global sharding (the axis on its mapped dimension,
  else replicated), then ``SPMDFullToShardShape`` to the manual block; the body is
  a called function; each output goes back with ``SPMDShardToFullShape``.
- Shardy: one ``sdy.manual_computation`` over the axis, with the same shardings
  as its in/out shardings and the body inlined in its region.
XLA's partitioner keeps the region as written (nothing in it is re-partitioned).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, PartitionSpec

from .. import jax_private as jp
from ..spec.op_sharding import sdy_sharding_text
from ..spec.parsed import ParsedPartitionSpec
from ..trace.region import RegionParams, pmap_region_p
from . import annotate
from .rules import placement

ir, mlir, pxla, sdy, sharding_impls = jp.ir, jp.mlir, jp.pxla, jp.sdy, jp.sharding_impls


def mapped_spec(axis_name: str, dim: int | None) -> ParsedPartitionSpec:
    """The global layout of a value mapped at ``dim`` (replicated for None)."""
    entries = () if dim is None else (*([None] * dim), axis_name)
    return ParsedPartitionSpec.coerce(PartitionSpec(*entries), "pmap")


def _lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    p = RegionParams.of(kwargs)
    if jp.effects.ordered_effects.filter_in(p.body.effects):
        raise ValueError(
            f"pmap {p.name}: ordered effects (jax.debug.callback(ordered=True), id_tap) are not "
            "supported inside pmap; use an unordered callback"
        )
    where = placement(ctx, p.mesh, f"pmap {p.name}")
    if where.positions is not None or where.single_device:
        raise ValueError(
            f"pmap {p.name}: the enclosing computation runs on devices "
            f"{[d.id for d in p.mesh.devices.flat]} in another order (or on one device); call "
            "the pmap-ed function outside it"
        )
    in_specs = [mapped_spec(p.axis_name, d) for d in p.in_dims]
    out_specs = [mapped_spec(p.axis_name, d) for d in p.out_dims]
    manual = frozenset({p.axis_name})
    sub_ctx = ctx.module_context.replace(
        axis_context=sharding_impls.SPMDAxisContext(p.mesh, manual)
    )
    if jp.jax_uses_shardy():
        return _shardy(ctx, sub_ctx, p, args, in_specs, out_specs)
    blocks = [
        _to_block(ctx, x, aval, block, spec, p.mesh, manual)
        for x, aval, block, spec in zip(args, ctx.avals_in, p.body.in_avals, in_specs, strict=True)
    ]
    with p.axis_env():
        outs, _ = mlir.call_lowering(
            f"pmap_{p.name}",
            p.body,
            None,
            sub_ctx,
            p.body.in_avals,
            p.body.out_avals,
            mlir.TokenSet(),
            *blocks,
            dim_var_values=ctx.dim_var_values,
            const_lowering=ctx.const_lowering,
        )
    return [
        _from_block(ctx, y, block, aval, spec, p.mesh, manual)
        for y, block, aval, spec in zip(
            outs, p.body.out_avals, ctx.avals_out, out_specs, strict=True
        )
    ]


def _to_block(
    ctx: Any, x: Any, aval: Any, block: Any, spec: Any, mesh: Mesh, manual: frozenset[str]
) -> Any:
    aval, block = jp.physical_aval(aval), jp.physical_aval(block)
    sharded = annotate.constrain(ctx, x, aval, spec, mesh, shardy=False)
    return mlir.wrap_with_full_to_shard_op(
        ctx, sharded, block, pxla.manual_proto(aval, manual, mesh), set()
    )


def _from_block(
    ctx: Any, y: Any, block: Any, aval: Any, spec: Any, mesh: Mesh, manual: frozenset[str]
) -> Any:
    aval, block = jp.physical_aval(aval), jp.physical_aval(block)
    manual_y = mlir.wrap_with_sharding_op(
        ctx, y, block, pxla.manual_proto(block, manual, mesh), unspecified_dims=set()
    )
    return mlir.wrap_with_shard_to_full_op(
        ctx, manual_y, aval, annotate.op_sharding(aval, spec, mesh), set()
    )


def _shardy(
    ctx: Any,
    sub_ctx: Any,
    p: RegionParams,
    args: Sequence[Any],
    in_specs: Sequence[ParsedPartitionSpec],
    out_specs: Sequence[ParsedPartitionSpec],
) -> Sequence[Any]:
    symbol = annotate.ensure_sdy_mesh(ctx.module_context.module, p.mesh)

    def per_value(avals: Sequence[Any], specs: Sequence[ParsedPartitionSpec]) -> Any:
        texts = [
            sdy_sharding_text(len(jp.physical_aval(a).shape), s, symbol)[len("#sdy.sharding") :]
            for a, s in zip(avals, specs, strict=True)
        ]
        return ir.Attribute.parse(f"#sdy.sharding_per_value<[{', '.join(texts)}]>")

    out_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    op = sdy.ManualComputationOp(
        out_types,
        list(args),
        per_value(ctx.avals_in, in_specs),
        per_value(ctx.avals_out, out_specs),
        sdy.ManualAxesAttr.get([ir.StringAttr.get(p.axis_name)]),
    )
    block_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in p.body.in_avals]
    block = ir.Block.create_at_start(op.body, block_types)
    with ir.InsertionPoint(block), p.axis_env():
        outs, _ = mlir.jaxpr_subcomp(
            sub_ctx,
            p.body.jaxpr,
            ctx.name_stack,
            mlir.TokenSet(),
            [mlir.ir_constants(c) for c in p.body.consts],
            *block.arguments,
            dim_var_values=ctx.dim_var_values,
            const_lowering=ctx.const_lowering,
            outer_traceback=None,
        )
        flat, _ = mlir.ir_tree_registry.flatten(list(outs))
        sdy.return_(flat)
    return list(op.results)


mlir.register_lowering(pmap_region_p, _lowering, cacheable=False)
