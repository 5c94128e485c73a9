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
from ..primitives.pmap_region import RegionParams, mapped_spec
from ..sharding.parsed import REPLICATED, ParsedPartitionSpec
from . import annotate
from . import tokens as tokens_lib
from .nested import placement


def region_lowering(ctx: Any, *args: Any, **kwargs: Any) -> Sequence[Any]:
    p = RegionParams.of(kwargs)
    # Shardable ordered effects (id_tap) run per device, their tokens threaded
    # through the body (NOTE [taps in manual regions] in host_callback/manual.py).
    ordered = list(jp.ordered_effects.filter_in(p.body.effects))
    if any(not jp.shardable_ordered_effects.contains(e) for e in ordered):
        raise ValueError(
            f"pmap {p.name}: ordered effects (jax.debug.callback(ordered=True)) are not "
            "supported inside pmap; use an unordered callback, or id_tap"
        )
    tokens = jp.TokenSet({e: ctx.tokens_in.get(e) for e in ordered})
    axis_ctx = ctx.module_context.axis_context
    # Axes an enclosing region already made manual (a pmap nested in a pmap).
    outer = (
        frozenset(axis_ctx.manual_axes) if isinstance(axis_ctx, jp.SPMDAxisContext) else frozenset()
    )
    if not outer:
        where = placement(ctx, p.mesh, f"pmap {p.name}")
        if where.positions is not None or where.single_device:
            raise ValueError(
                f"pmap {p.name}: the enclosing computation runs on devices "
                f"{[d.id for d in p.mesh.devices.flat]} in another order (or on one device); "
                "call the pmap-ed function outside it"
            )
    manual = outer | {p.axis_name}
    if manual != set(p.mesh.axis_names):  # NOTE [tokens as data in partial manual regions]
        tokens_lib.check_partial_body(p.body.jaxpr, p.name, manual, p.mesh.axis_names)
    in_specs = [mapped_spec(p.axis_name, d) for d in p.in_dims]
    out_specs = [mapped_spec(p.axis_name, d) for d in p.out_dims]
    sub_ctx = ctx.module_context.replace(axis_context=jp.SPMDAxisContext(p.mesh, manual))
    if jp.jax_uses_shardy():
        return _shardy(ctx, sub_ctx, p, args, in_specs, out_specs, tokens)
    region = _Gspmd(ctx, p.mesh, outer, manual)
    blocks = [
        region.to_block(x, aval, block, spec)
        for x, aval, block, spec in zip(args, ctx.avals_in, p.body.in_avals, in_specs, strict=True)
    ]
    with p.axis_env():
        outs, tokens_out = jp.call_lowering(
            f"pmap_{p.name}",
            p.body,
            None,
            sub_ctx,
            p.body.in_avals,
            p.body.out_avals,
            tokens,
            *blocks,
            dim_var_values=ctx.dim_var_values,
            const_lowering=ctx.const_lowering,
        )
    if len(tokens):
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(tokens_out))
    return [
        region.from_block(y, block, aval, spec)
        for y, block, aval, spec in zip(
            outs, p.body.out_avals, ctx.avals_out, out_specs, strict=True
        )
    ]


class _Gspmd:
    """GSPMD's way into and out of a region manual over ``manual`` (``outer`` already were)."""

    def __init__(self, ctx: Any, mesh: Mesh, outer: frozenset[str], manual: frozenset[str]):
        self.ctx, self.mesh, self.outer, self.manual = ctx, mesh, outer, manual
        # With axes left free (an outer pmap of a nested one), XLA may shard over them.
        self.partial = len(manual) < len(mesh.axis_names)

    def _sharding(self, aval: Any, spec: ParsedPartitionSpec) -> Any:
        if not self.outer:
            return annotate.op_sharding(aval, spec, self.mesh)
        return jp.manual_scoped_op_sharding(
            self.mesh, spec.to_partition_spec(), self.outer, len(aval.shape)
        )

    def _unspecified(self, aval: Any) -> set[int]:
        return set(range(len(aval.shape))) if self.partial else set()

    def to_block(self, x: Any, aval: Any, block: Any, spec: ParsedPartitionSpec) -> Any:
        aval, block = jp.physical_aval(aval), jp.physical_aval(block)
        free = self._unspecified(aval)
        sharded = jp.wrap_with_sharding_op(
            self.ctx, x, aval, self._sharding(aval, spec), unspecified_dims=free
        )
        manual_proto = jp.manual_proto(aval, self.manual, self.mesh)
        return jp.wrap_with_full_to_shard_op(self.ctx, sharded, block, manual_proto, free)

    def from_block(self, y: Any, block: Any, aval: Any, spec: ParsedPartitionSpec) -> Any:
        aval, block = jp.physical_aval(aval), jp.physical_aval(block)
        free = self._unspecified(block)
        manual_y = jp.wrap_with_sharding_op(
            self.ctx,
            y,
            block,
            jp.manual_proto(block, self.manual, self.mesh),
            unspecified_dims=free,
        )
        return jp.wrap_with_shard_to_full_op(
            self.ctx, manual_y, aval, self._sharding(aval, spec), free
        )


def _shardy(
    ctx: Any,
    sub_ctx: Any,
    p: RegionParams,
    args: Sequence[Any],
    in_specs: Sequence[ParsedPartitionSpec],
    out_specs: Sequence[ParsedPartitionSpec],
    tokens: Any,
) -> Sequence[Any]:
    effects = list(tokens.effects())
    # NOTE [tokens as data in partial manual regions]
    carried = tokens_lib.carried_inside(sub_ctx.axis_context)
    threaded, leave = tokens_lib.enter(ctx, [tokens.get(e) for e in effects], carried)
    if p.size == 1:
        return _inlined(ctx, sub_ctx, p, args, effects, threaded, leave)
    symbol = annotate.ensure_sdy_mesh(ctx.module_context.module, p.mesh)

    # With axes left free (an outer pmap of a nested one), dims stay open to them.
    partial = len(sub_ctx.axis_context.manual_axes) < len(p.mesh.axis_names)

    def per_value(avals: Sequence[Any], specs: Sequence[ParsedPartitionSpec]) -> Any:
        return jp.TensorShardingPerValueAttr.get(
            # Tokens (first) are replicated over the manual axis.
            [annotate.sdy_sharding_attr(0, REPLICATED, symbol)] * len(effects)
            + [
                annotate.sdy_sharding_attr(
                    len(jp.physical_aval(a).shape), _open(s, a) if partial else s, symbol
                )
                for a, s in zip(avals, specs, strict=True)
            ]
        )

    token_types = [t.type for t in threaded]
    out_types = [jp.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    op = jp.ManualComputationOp(
        [*token_types, *out_types],
        [*threaded, *args],
        per_value(ctx.avals_in, in_specs),
        per_value(ctx.avals_out, out_specs),
        jp.ManualAxesAttr.get([jp.StringAttr.get(p.axis_name)]),
    )
    block_types = [jp.aval_to_ir_type(ctx.module_context, a) for a in p.body.in_avals]
    block = jp.Block.create_at_start(op.body, [*token_types, *block_types])
    token_args, in_args = block.arguments[: len(effects)], block.arguments[len(effects) :]
    with jp.InsertionPoint(block), p.axis_env():
        block_tokens = jp.TokenSet(dict(zip(effects, token_args, strict=True)))
        outs, tokens_out = _body(ctx, sub_ctx, p, block_tokens, in_args)
        flat, _ = jp.ir_tree_registry.flatten([*(tokens_out.get(e) for e in effects), *outs])
        jp.sdy_return(flat)
    results = list(op.results)
    if effects:
        out = dict(zip(effects, leave(results[: len(effects)]), strict=True))
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet(out)))
    return results[len(effects) :]


def _inlined(
    ctx: Any,
    sub_ctx: Any,
    p: RegionParams,
    args: Sequence[Any],
    effects: list[Any],
    threaded: Sequence[Any],
    leave: Any,
) -> list[Any]:
    """A one-device axis under Shardy: the body inlined, no manual computation.

    A block is the whole value. Shardy's export keeps the custom calls of a manual
    computation over a one-device mesh (``xla.sdy.GlobalToLocalShape``), which no
    CPU client runs; jax's shard_map inlines the body here too.
    """
    with p.axis_env():
        threaded_in = jp.TokenSet(dict(zip(effects, threaded, strict=True)))
        outs, tokens_out = _body(ctx, sub_ctx, p, threaded_in, args)
    if effects:
        after = leave([tokens_out.get(e) for e in effects])
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(jp.TokenSet(dict(zip(effects, after)))))
    return list(outs)


def _body(ctx: Any, sub_ctx: Any, p: RegionParams, tokens: Any, args: Sequence[Any]) -> Any:
    """The region's body lowered in place: ``(outputs, tokens out)``."""
    return jp.jaxpr_subcomp(
        sub_ctx,
        p.body.jaxpr,
        ctx.name_stack,
        tokens,
        [jp.ir_constants(c) for c in p.body.consts],
        *args,
        dim_var_values=ctx.dim_var_values,
        const_lowering=ctx.const_lowering,
        outer_traceback=None,
    )


def _open(spec: ParsedPartitionSpec, aval: Any) -> PartitionSpec:
    """``spec`` with its unsplit dims open (``{?}``), for axes a nested region splits."""
    ndim = len(jp.physical_aval(aval).shape)
    parts = list(spec.to_partition_spec()) + [None] * ndim
    return PartitionSpec(*(PartitionSpec.UNCONSTRAINED if e is None else e for e in parts[:ndim]))
