"""The ``pmap`` region primitive: a per-device body run once on every device of an axis.

NOTE [pmap region]: ``pmap`` is a front door onto ``pjit_p``: its call is a pjit
over a one-axis mesh whose body holds a single ``pmap_region_p`` equation. The
region's params carry the *per-device* body: a jaxpr on **blocks** (each mapped
input's mapped dimension has size 1 there, as every device holds one slice)
that squeezes that dimension, runs the user's function with collectives bound
to the axis name, and expands each mapped output back. Outside, the region's
inputs and outputs are global arrays: a mapped input's dimension ``d`` is the
axis size; an unmapped (``None``) input is the same on every device; an
unmapped output is taken as the devices' common value (not checked, as in
jax.pmap). The lowering (``lower/manual.py``) makes the body a manual-SPMD
computation over the axis; the rules (below) transform the body
under the axis environment.

Transformation rules of the pmap region: jvp, vmap, partial eval, transpose, DCE.

Each rule transforms the per-device body with jax's own machinery, *under the
region's axis environment* (so the body's collectives trace and transform with
jax's rules for them), and binds a new region with the mapped dimensions each
new input and output gets (NOTE [pmap region] in ``primitives/pmap_region.py``):
- jvp: tangents are mapped like their primals.
- vmap: the batch dimension goes first, outside and in the block, so every
  mapped dimension moves one to the right.
- partial eval (``linearize``, ``grad``): the known region also returns the
  residuals, one per device: each leaves the region mapped at a new leading
  dimension and enters the unknown region the same way.
- transpose: as ``jax.pmap`` (a ``shard_map`` without replication checks) does
  it: the cotangent of an unmapped output reaches every device divided by the
  axis size, and the cotangent of an unmapped input is summed over the axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .. import jax_private as jp
from ..sharding.parsed import ParsedPartitionSpec
from ..trace.memo import ByIdentity, cache_per_jaxpr
from ..trace.params import PrimitiveParams
from .pjit_call import PjitParams
from .rule_helpers import batch_dims_first, cotangents_for, keep_where, stage_unknown

pmap_region_p = jp.Primitive("pmap_region")
pmap_region_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class RegionParams(PrimitiveParams):
    """The parameters of one ``pmap_region_p`` equation (all hashable).

    Attributes:
        body: ClosedJaxpr on blocks (NOTE [pmap region]).
        axis_name: the mapped axis (pmap's: the mesh's only axis).
        mesh: the mesh of the devices, in mapping order: pmap's one-axis mesh, or a
            pipeline's whole mesh (``in_region``), the region manual over one of its
            axes and the others XLA's.
        in_dims / out_dims: per input / output, the mapped dimension or None.
        name: the user's function name.

    Invariant: one mapped dimension (or None) per body input and per body output.
    """

    primitive: ClassVar[jp.Primitive] = pmap_region_p
    tuple_fields: ClassVar[tuple[str, ...]] = ("in_dims", "out_dims")

    body: jp.ClosedJaxpr
    axis_name: str
    mesh: Mesh
    in_dims: tuple[int | None, ...]
    out_dims: tuple[int | None, ...]
    name: str

    def check(self) -> None:
        if len(self.in_dims) != len(self.body.in_avals) or len(self.out_dims) != len(
            self.body.out_avals
        ):
            raise ValueError(
                f"internal error: pmap {self.name} region has {len(self.body.in_avals)} inputs and "
                f"{len(self.body.out_avals)} outputs but {len(self.in_dims)} and "
                f"{len(self.out_dims)} mapped dimensions; please report"
            )

    @property
    def size(self) -> int:
        return int(self.mesh.shape[self.axis_name])

    def axis_env(self) -> Any:
        """The axis environment the body's collectives are traced and lowered in."""
        return jp.extend_axis_env_nd([(self.axis_name, self.size)])


def block_aval(aval: Any, dim: int | None) -> Any:
    """One device's block of a global value mapped at ``dim`` (size 1 there)."""
    if dim is None:
        return aval
    return aval.update(shape=(*aval.shape[:dim], 1, *aval.shape[dim + 1 :]))


def global_aval(aval: Any, dim: int | None, size: int) -> Any:
    """The global value whose blocks (mapped at ``dim`` over ``size`` devices) are ``aval``."""
    if dim is None:
        return aval
    return aval.update(shape=(*aval.shape[:dim], size, *aval.shape[dim + 1 :]))


def mapped_spec(axis_name: str, dim: int | None) -> ParsedPartitionSpec:
    """The global layout of a value mapped at ``dim`` over ``axis_name`` (replicated for None)."""
    entries = () if dim is None else (*([None] * dim), axis_name)
    return ParsedPartitionSpec.coerce(PartitionSpec(*entries), "pmap")


def region_pjit(
    region: RegionParams,
    consts: Sequence[Any],
    in_avals: Sequence[Any],
    donated: Sequence[bool],
) -> PjitParams:
    """A pjit over the region's mesh whose body is the region (NOTE [pmap region]).

    The region's first ``len(consts)`` inputs are ``consts``, closed into the body;
    the pjit takes the rest (``in_avals``), each laid out as the region maps it.
    Built once per region body and signature (NOTE [derived jaxpr cache]), so every
    plan of the same call reaches the executable cache with the same program.
    """
    rest = (region.axis_name, region.mesh, region.in_dims, region.out_dims, region.name)
    return _region_pjit(region.body, rest, ByIdentity(consts), tuple(in_avals), tuple(donated))


@cache_per_jaxpr
def _region_pjit(
    body: Any,
    rest: tuple[Any, ...],
    consts: ByIdentity,
    in_avals: tuple[Any, ...],
    donated: tuple[bool, ...],
) -> PjitParams:
    region = RegionParams(body, *rest)

    def call(*xs: Any) -> Any:
        return region.bind(*consts.values, *xs)

    debug_info = jp.debug_info("pmap", call, in_avals, {})
    jaxpr, _, closed = jp.trace_to_jaxpr_dynamic(
        jp.wrap_init(call, debug_info=debug_info), list(in_avals)
    )
    jaxpr = jaxpr.replace(debug_info=_named_as_body(jaxpr.debug_info, body, len(in_avals)))
    return PjitParams(
        jaxpr=jp.ClosedJaxpr(jaxpr, closed),
        in_axis_resources=tuple(
            mapped_spec(region.axis_name, d) for d in region.in_dims[len(consts.values) :]
        ),
        out_axis_resources=tuple(mapped_spec(region.axis_name, d) for d in region.out_dims),
        mesh=region.mesh,
        donated_invars=donated,
        name=region.name,
        api="pmap",
    )


def _named_as_body(debug: Any, body: Any, n_in: int) -> Any:
    """``debug`` with the argument and result names of the region's body (the user's names).

    The pjit around a region takes the body's last ``n_in`` inputs, so its module
    names them as the user's function does (``jax.arg_info``, ``jax.result_info``).
    """
    named = body.jaxpr.debug_info
    if named is None or debug is None:
        return debug
    names = tuple(named.arg_names or ())
    names = ((None,) * n_in + names)[-n_in:] if n_in else ()
    return debug._replace(arg_names=names, result_paths=named.result_paths)


def in_region(
    fn: Callable[..., Sequence[Any]],
    args: Sequence[Any],
    *,
    axis_name: str,
    mesh: Mesh,
    in_dims: Sequence[int | None],
    out_dims: Sequence[int | None],
    name: str,
) -> list[Any]:
    """``fn`` run on every device of ``axis_name`` as a region (NOTE [pmap region]):
    traced on the blocks of ``args`` (mapped at ``in_dims``), its outputs mapped at
    ``out_dims``. Regions nest (a region's ``fn`` may call this for another axis of the
    same mesh); the mesh's other axes stay XLA's to partition.

    Values ``fn`` closes over that belong to an enclosing trace enter as unmapped inputs.
    """
    size = int(mesh.shape[axis_name])
    blocks = [block_aval(jp.typeof(a), d) for a, d in zip(args, in_dims, strict=True)]
    info = jp.debug_info(name, fn, tuple(blocks), {})
    with jp.extend_axis_env_nd([(axis_name, size)]):
        jaxpr, _, consts = jp.trace_to_jaxpr_dynamic(
            jp.wrap_init(lambda *xs: list(fn(*xs)), debug_info=info), blocks
        )
    body = jp.ClosedJaxpr(jp.convert_constvars_jaxpr(jaxpr), ())
    region = RegionParams(
        body,
        axis_name,
        mesh,
        (*(None,) * len(consts), *in_dims),
        tuple(out_dims),
        name,
    )
    return list(region.bind(*consts, *args))


# --- maps nested in a map's body ---


def nested_chain(jaxpr: Any, label: str) -> list[tuple[str, int]]:
    """The axes (name, size) of the pmaps nested in ``jaxpr``'s top level, outermost first.

    NOTE [nested pmap]: a pmap called inside a pmap body binds its region there
    (``CallPlan.nested_bind``), over a placeholder mesh of its own devices; the
    outermost map then runs over the grid of all their devices, outer axis
    first (as jax.pmap nests: inner map ``j`` of outer index ``i`` runs on device
    ``i * size_j + j``), and every nested region gets that grid as its mesh.

    Raises:
        ValueError: nested maps of different axes or sizes side by side, or a
            map nested inside control flow (a scan, cond...) of the body.
    """
    chains = []
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            inner = RegionParams.of(eqn.params)
            chains.append([(inner.axis_name, inner.size), *nested_chain(inner.body, label)])

    if any(c != chains[0] for c in chains[1:]):
        raise ValueError(
            f"{label}: the pmaps nested in it must map the same axes with the same sizes, "
            f"got {chains}"
        )
    if _regions_below(jaxpr.jaxpr):
        raise ValueError(
            f"{label}: a pmap nested inside control flow or a call of its body (scan, "
            "cond, jit...) is not supported; call the inner pmap at the body's top level"
        )
    return chains[0] if chains else []


def _regions_below(jaxpr: Any) -> bool:
    """Whether a pmap region sits in a sub-jaxpr (control flow, a call) of ``jaxpr``."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            continue
        for sub in jp.jaxprs_in_params(eqn.params):
            if any(e.primitive is pmap_region_p for e in sub.eqns) or _regions_below(sub):
                return True
    return False


@cache_per_jaxpr
def placed_on(jaxpr: Any, mesh: Mesh) -> Any:
    """``jaxpr`` with every nested region (at any depth of nesting) over ``mesh``."""
    eqns = []
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            inner = RegionParams.of(eqn.params)
            eqn = eqn.replace(
                params=inner.replace(mesh=mesh, body=placed_on(inner.body, mesh)).as_kwargs()
            )
        eqns.append(eqn)
    return jp.ClosedJaxpr(jaxpr.jaxpr.replace(eqns=eqns), jaxpr.consts)


# --- abstract evaluation ---


def abstract_eval(*avals: Any, **params: Any) -> tuple[list[Any], Any]:
    p = RegionParams.of(params)
    outs = [global_aval(a, d, p.size) for a, d in zip(p.body.out_avals, p.out_dims, strict=True)]
    return outs, p.body.effects


def pp_rule(eqn: Any, context: Any, settings: Any) -> Any:
    params = dict(eqn.params)
    params["mesh"] = dict(params["mesh"].shape)
    return jp.pp_eqn(eqn.replace(params=params), context, settings)


def _trace_block_fn(
    p: RegionParams, fn: Callable[..., Sequence[Any]], block_avals: Sequence[Any], what: str
) -> Any:
    """``fn`` on blocks, traced under the region's axis environment, as a ClosedJaxpr."""
    info = jp.debug_info(what, fn, tuple(block_avals), {})
    with p.axis_env():
        jaxpr, _, consts = jp.trace_to_jaxpr_dynamic(
            jp.wrap_init(lambda *xs: list(fn(*xs)), debug_info=info), list(block_avals)
        )
    return jp.ClosedJaxpr(jaxpr, consts)


# --- jvp ---


def jvp(primals: Any, tangents: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    p = RegionParams.of(kwargs)
    nz_in = [type(t) is not jp.Zero for t in tangents]
    with p.axis_env():
        body, nz_out = jp.jvp_jaxpr(p.body, nz_in, instantiate=False)
    jvp = p.replace(
        body=body,
        in_dims=(*p.in_dims, *keep_where(p.in_dims, nz_in)),
        out_dims=(*p.out_dims, *keep_where(p.out_dims, nz_out)),
        name=f"jvp({p.name})",
    )
    outs = jvp.bind(*primals, *keep_where(tangents, nz_in))
    n = len(p.out_dims)
    nz_iter = iter(outs[n:])
    out_avals = [
        global_aval(a, d, p.size) for a, d in zip(p.body.out_avals, p.out_dims, strict=True)
    ]
    tangents_out = [
        next(nz_iter) if nz else jp.Zero(a.to_tangent_aval())
        for nz, a in zip(nz_out, out_avals, strict=True)
    ]
    return list(outs[:n]), tangents_out


# --- vmap ---


def batcher(
    axis_data: Any, vals_in: Any, dims_in: Any, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    p = RegionParams.of(kwargs)
    vals, in_batched = batch_dims_first(vals_in, dims_in)
    with p.axis_env():
        body, out_batched = jp.batch_jaxpr(p.body, axis_data, in_batched, False)

    def shifted(dims: Sequence[int | None], batched: Sequence[bool]) -> tuple[int | None, ...]:
        return tuple(None if d is None else d + int(b) for d, b in zip(dims, batched, strict=True))

    batched = p.replace(
        body=body,
        in_dims=shifted(p.in_dims, in_batched),
        out_dims=shifted(p.out_dims, out_batched),
    )
    return list(batched.bind(*vals)), [0 if b else None for b in out_batched]


# --- partial eval ---


def partial_eval(trace: Any, *in_tracers: Any, **kwargs: Any) -> list[Any]:
    p = RegionParams.of(kwargs)
    known_ins = [t.pval.is_known() for t in in_tracers]
    unknown_ins = [not k for k in known_ins]
    with p.axis_env():
        known_body, unknown_body, unknown_outs, res_avals = jp.partial_eval_jaxpr_nounits(
            p.body, unknown_ins, instantiate=False
        )
    known_outs = [not u for u in unknown_outs]
    n_known_out, n_res = sum(known_outs), len(res_avals)

    def known_fn(*blocks: Any) -> list[Any]:
        outs = jp.eval_jaxpr(known_body.jaxpr, known_body.consts, *blocks)
        return [*outs[:n_known_out], *(jax.lax.expand_dims(r, (0,)) for r in outs[n_known_out:])]

    def unknown_fn(*blocks: Any) -> Sequence[Any]:
        res = [jax.lax.squeeze(r, (0,)) for r in blocks[:n_res]]
        return jp.eval_jaxpr(unknown_body.jaxpr, unknown_body.consts, *res, *blocks[n_res:])

    known_in_blocks = keep_where(p.body.in_avals, known_ins)
    known = p.replace(
        body=_trace_block_fn(p, known_fn, known_in_blocks, f"known({p.name})"),
        in_dims=keep_where(p.in_dims, known_ins),
        out_dims=(*keep_where(p.out_dims, known_outs), *(0,) * n_res),
    )
    known_vals = known.bind(*(t.pval.get_known() for t in in_tracers if t.pval.is_known()))
    res_blocks: list[Any] = [a.update(shape=(1, *a.shape)) for a in res_avals]  # type: ignore[attr-defined]
    unknown = p.replace(
        body=_trace_block_fn(
            p, unknown_fn, [*res_blocks, *keep_where(p.body.in_avals, unknown_ins)], p.name
        ),
        in_dims=(*(0,) * n_res, *keep_where(p.in_dims, unknown_ins)),
        out_dims=keep_where(p.out_dims, unknown_outs),
    )
    unknown_in_avals = [
        *(jp.typeof(r) for r in known_vals[n_known_out:]),
        *(t.aval for t in in_tracers if not t.pval.is_known()),
    ]
    out_avals, _ = pmap_region_p.abstract_eval(*unknown_in_avals, **unknown.as_kwargs())
    tracers_out = stage_unknown(
        trace,
        pmap_region_p,
        unknown.as_kwargs(),
        out_avals,
        jp.positional_effects(unknown.body),
        known_vals[n_known_out:],
        in_tracers,
    )
    known_iter, unknown_iter = iter(known_vals[:n_known_out]), iter(tracers_out)
    return [next(unknown_iter) if u else next(known_iter) for u in unknown_outs]


# --- transpose ---


def transpose(cts_in: Any, *primals_in: Any, **kwargs: Any) -> list[Any]:
    p = RegionParams.of(kwargs)
    undef = [jp.is_undefined_primal(x) for x in primals_in]
    nz_cts = [type(ct) is not jp.Zero for ct in cts_in]
    known = [x for x, u in zip(primals_in, undef, strict=True) if not u]
    cts = keep_where(cts_in, nz_cts)
    body, n = p.body, p.size
    nz_out_box: list[tuple[bool, ...]] = []

    def transposed(*blocks: Any) -> list[Any]:
        known_blocks, ct_blocks = iter(blocks[: len(known)]), iter(blocks[len(known) :])
        primals = [
            jp.UndefinedPrimal(a) if u else next(known_blocks)
            for a, u in zip(body.in_avals, undef, strict=True)
        ]
        cts_full = []
        for a, d, nz in zip(body.out_avals, p.out_dims, nz_cts, strict=True):
            if not nz:
                cts_full.append(jp.Zero(a.to_ct_aval()))
                continue
            ct = next(ct_blocks)
            if d is None and n > 1 and ct.dtype != jax.dtypes.float0:
                ct = ct / np.array(n, ct.dtype)  # every device receives a share
            cts_full.append(ct)
        cts_out = jp.backward_pass(body.jaxpr, False, body.consts, primals, cts_full)
        linear = []
        for ct, u, d in zip(cts_out, undef, p.in_dims, strict=True):
            if not u:
                continue
            if type(ct) is not jp.Zero and ct is not None and d is None:
                ct = jax.lax.psum(ct, p.axis_name)  # a broadcast input: summed over devices
            linear.append(ct)
        nz_out_box.append(tuple(type(ct) is not jp.Zero and ct is not None for ct in linear))
        return [ct for ct in linear if type(ct) is not jp.Zero and ct is not None]

    block_in = [
        *(
            block_aval(jp.typeof(x), d)
            for x, d in zip(known, keep_where(p.in_dims, [not u for u in undef]), strict=True)
        ),
        *(
            block_aval(jp.typeof(ct), d)
            for ct, d in zip(cts, keep_where(p.out_dims, nz_cts), strict=True)
        ),
    ]
    t_body = _trace_block_fn(p, transposed, block_in, f"transpose({p.name})")
    nz_out = nz_out_box[-1]
    linear_dims = keep_where(p.in_dims, undef)
    t = p.replace(
        body=t_body,
        in_dims=(*keep_where(p.in_dims, [not u for u in undef]), *keep_where(p.out_dims, nz_cts)),
        out_dims=keep_where(linear_dims, nz_out),
        name=f"transpose({p.name})",
    )
    outs = t.bind(*known, *cts) if t_body.out_avals else []
    return cotangents_for(primals_in, undef, nz_out, outs)


def _region_eqn(invars: Sequence[Any], outvars: Sequence[Any], p: RegionParams, like: Any) -> Any:
    """A ``pmap_region_p`` equation with ``like``'s source info and context."""
    return jp.new_jaxpr_eqn(
        list(invars),
        list(outvars),
        pmap_region_p,
        p.as_kwargs(),
        jp.eqn_effects(p.body, invars),
        like.source_info,
        like.ctx,
    )


# --- dce ---


def dce(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    if not any(used_outputs) and not jp.has_effects(eqn):
        return [False] * len(eqn.invars), None
    p = RegionParams.of(eqn.params)
    with p.axis_env():
        body, used_inputs = jp.dce_jaxpr(p.body.jaxpr, used_outputs)
    pruned = p.replace(
        body=jp.ClosedJaxpr(body, p.body.consts),
        in_dims=keep_where(p.in_dims, used_inputs),
        out_dims=keep_where(p.out_dims, used_outputs),
    )
    new_eqn = _region_eqn(
        keep_where(eqn.invars, used_inputs), keep_where(eqn.outvars, used_outputs), pruned, eqn
    )
    return used_inputs, new_eqn


# --- partial_eval_jaxpr_custom (jax.checkpoint and remat policies) ---


def partial_eval_custom(
    saveable: Any, unks_in: Sequence[bool], inst_in: Sequence[bool], eqn: Any
) -> tuple[Any, Any, list[bool], list[bool], list[Any]]:
    """Split the region into a known and a staged one (residuals mapped at a new dim 0)."""
    p = RegionParams.of(eqn.params)
    n_consts = len(p.body.consts)
    open_body = jp.convert_constvars_jaxpr(p.body.jaxpr)
    with p.axis_env():
        known_j, staged_j, unks_out, inst_out, num_res = jp.partial_eval_jaxpr_custom(
            open_body,
            [False] * n_consts + list(unks_in),
            [False] * n_consts + list(inst_in),
            False,
            False,
            saveable,
        )
    known_ins = [not u for u in unks_in]
    known_outs = [not u for u in unks_out]
    n_known_out = sum(known_outs)

    def known_fn(*blocks: Any) -> list[Any]:
        outs = jp.eval_jaxpr(known_j, (), *p.body.consts, *blocks)
        return [*outs[:n_known_out], *(jax.lax.expand_dims(r, (0,)) for r in outs[n_known_out:])]

    def staged_fn(*blocks: Any) -> Sequence[Any]:
        res = [jax.lax.squeeze(r, (0,)) for r in blocks[:num_res]]
        return jp.eval_jaxpr(staged_j, (), *res, *blocks[num_res:])

    res_avals: list[Any] = [v.aval for v in staged_j.invars[:num_res]]
    known = p.replace(
        body=_trace_block_fn(p, known_fn, keep_where(p.body.in_avals, known_ins), p.name),
        in_dims=keep_where(p.in_dims, known_ins),
        out_dims=(*keep_where(p.out_dims, known_outs), *(0,) * num_res),
    )
    staged = p.replace(
        body=_trace_block_fn(
            p,
            staged_fn,
            [
                *(a.update(shape=(1, *a.shape)) for a in res_avals),
                *keep_where(p.body.in_avals, inst_in),
            ],
            p.name,
        ),
        in_dims=(*(0,) * num_res, *keep_where(p.in_dims, inst_in)),
        out_dims=keep_where(p.out_dims, inst_out),
    )
    res_vars = [jp.Var(a.update(shape=(p.size, *a.shape))) for a in res_avals]
    eqn_known = _region_eqn(
        keep_where(eqn.invars, known_ins),
        [*keep_where(eqn.outvars, known_outs), *res_vars],
        known,
        eqn,
    )
    eqn_staged = _region_eqn(
        [*res_vars, *keep_where(eqn.invars, inst_in)],
        keep_where(eqn.outvars, inst_out),
        staged,
        eqn,
    )
    return eqn_known, eqn_staged, list(unks_out), list(inst_out), res_vars
