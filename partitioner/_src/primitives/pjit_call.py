"""The ``pjit`` primitive and its typed parameters.

Why our own primitive (not ``jax.jit``'s): its params carry *our* parsed specs
and mesh, so every transformation rule, the lowering and the dispatch path read
the partitioning from one place and jax's caches (keyed on hashable params) work.

Why a dataclass beside it: jax hands rules the params as a flat keyword dict
(and must see the ``jaxpr`` there, to find sub-jaxprs). Rules read them through
:class:`PjitParams`, which names and types every field and checks the invariants
that tie them together, instead of string lookups and asserts in every rule.

Every transformation rule of ``pjit_p``: vmap, jvp, transpose, partial eval, DCE.

One file per primitive (``constraint.py`` and ``pmap_region.py`` beside it), so
what a transformation does to a pjit is read in one place.

- vmap: the batch dimension is moved to 0 and inserted into every spec:
  unpartitioned by default, or over the mesh axes named by
  ``vmap(..., spmd_axis_name=...)``.
- jvp: tangents flow through the same ``pjit_p`` call as the primals: the JVP
  body takes ``(*primals, *nonzero tangents)``, and each tangent is laid out like
  its primal. Symbolic zero tangents never become arrays.
- transpose: the transposed body runs as one ``pjit_p`` call taking the
  non-linear inputs and the non-zero cotangents; each cotangent it returns is
  laid out like the input it belongs to (the input's spec becomes the output
  spec). Zero cotangents stay symbolic in both directions.
- partial eval (``linearize``, ``grad``, ``vjp``) and remat: a pjit with some
  unknown inputs splits into two ``pjit_p`` calls: the known half runs now and
  also returns *residuals*; the unknown half is staged and consumes them.
- DCE: unused outputs are pruned with the inputs only they needed.

NOTE [residual shardings]: residuals are never forced to replicate. Their
spec in both halves is ``None`` ("XLA chooses"): the known half is compiled
with sharding propagation to those outputs, and dispatch reads the chosen
layout back from the executable (``compiler/compile.py`` parses its output
OpShardings). The unknown half then takes each residual laid out as it
arrived (``dispatch/execute.py`` resolves ``None`` in-specs from the
arguments). A residual that is just a known input, or a primal output, is
forwarded instead of being returned twice. Over a mesh with Explicit axes a
residual's type carries its sharding, and the lowering lays it out as typed
(NOTE [unspecified outputs follow the type] in ``lower/module.py``).

NOTE [retracing typed bodies]: every rule that retraces a body (vmap, jvp,
transpose, partial eval) does so under the body's mesh as jax's sharding rules
see it (``typed_context``): over Explicit axes each op checks that its
operands' meshes match the abstract mesh in context, and the rule may run
where no mesh is in context at all (``jax.grad`` outside the ``with`` block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from jax.sharding import Mesh

from .. import jax_private as jp
from ..sharding.mesh_env import typed_context
from ..sharding.parsed import ParsedPartitionSpec
from ..trace.memo import cache_per_jaxpr
from ..trace.params import PrimitiveParams
from .rule_helpers import (
    batch_dims_first,
    batch_spec,
    cotangents_for,
    keep_where,
    not_mapped,
    spmd_axes,
    stage_unknown,
)

pjit_p = jp.Primitive("pjit")
pjit_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class PjitParams(PrimitiveParams):
    """The parameters of one ``pjit_p`` equation (all hashable).

    Attributes:
        jaxpr: the ClosedJaxpr of the body (flat inputs, static arguments removed).
        in_axis_resources / out_axis_resources: one ParsedPartitionSpec per flat
            input / output, or None where XLA chooses the layout (residuals, see
            NOTE [residual shardings] in primitives/pjit_call.py).
        mesh: the ``jax.sharding.Mesh`` the call runs over: with its axis types
            when some axis is Explicit (values are then typed with their
            shardings, NOTE [explicit axes] in ``sharding/mesh_env.py``), else its
            Auto twin.
        donated_invars: one bool per flat input: the caller asks to donate it.
        name: the function's name, for the HLO module and messages.
        api: the front door the user called (``"pjit"``, ``"jit"``, ``"pmap"``), so
            messages from the shared layers name what the user wrote.
        committed: its results are committed to their devices (False only for a
            call nothing committed: uncommitted arguments and no mesh).
        compiler_options: ``jit(..., compiler_options=...)`` as sorted ``(name,
            value)`` pairs (hashable), handed to XLA when the body is compiled.
        keep_unused: the compiled program takes every input; False (jax.jit's
            default) prunes the inputs the body does not use from the module and
            from every call (``lower/prune.py``).

    Invariants (checked at construction): one spec and one donation flag per
    jaxpr input, one spec per jaxpr output.
    """

    primitive: ClassVar[jp.Primitive] = pjit_p
    tuple_fields: ClassVar[tuple[str, ...]] = (
        "in_axis_resources",
        "out_axis_resources",
        "donated_invars",
    )

    jaxpr: jp.ClosedJaxpr
    in_axis_resources: tuple[ParsedPartitionSpec | None, ...]
    out_axis_resources: tuple[ParsedPartitionSpec | None, ...]
    mesh: Mesh
    donated_invars: tuple[bool, ...]
    name: str
    api: str = "pjit"
    committed: bool = True
    compiler_options: tuple[tuple[str, Any], ...] = ()
    keep_unused: bool = True

    def check(self) -> None:
        n_in, n_out = len(self.jaxpr.in_avals), len(self.jaxpr.out_avals)
        if not len(self.in_axis_resources) == len(self.donated_invars) == n_in:
            raise ValueError(
                f"internal error: {self.api} {self.name} has {n_in} inputs but "
                f"{len(self.in_axis_resources)} input specs and {len(self.donated_invars)} "
                "donation flags; please report"
            )
        if len(self.out_axis_resources) != n_out:
            raise ValueError(
                f"internal error: {self.api} {self.name} has {n_out} outputs but "
                f"{len(self.out_axis_resources)} output specs; please report"
            )


# --- abstract evaluation ---


def abstract_eval(*avals: Any, jaxpr: jp.ClosedJaxpr, **_: Any) -> tuple[Any, Any]:
    return jaxpr.out_avals, jaxpr.effects


def pp_rule(eqn: Any, context: Any, settings: Any) -> Any:
    # Show specs as the user would write them, not the parsed tuples; the fields
    # at their defaults are left out.
    p = PjitParams.of(eqn.params)
    params = dict(eqn.params)  # the keyword dict jax's printer reads

    def show(specs: Any) -> tuple[Any, ...]:
        return tuple("UNSPECIFIED" if s is None else s.to_partition_spec() for s in specs)

    params["in_axis_resources"] = show(p.in_axis_resources)
    params["out_axis_resources"] = show(p.out_axis_resources)
    params["mesh"] = dict(p.mesh.shape)
    if not any(p.donated_invars):
        del params["donated_invars"]
    for field in dataclasses.fields(p):  # api, committed, compiler_options, keep_unused
        if field.default is not dataclasses.MISSING and getattr(p, field.name) == field.default:
            del params[field.name]
    new_eqn = eqn.replace(params=params)
    return jp.pp_eqn(new_eqn, context, settings)


# --- batching ---


def batcher(
    axis_data: Any, vals_in: Any, dims_in: Any, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    params = PjitParams.of(kwargs)
    vals_in, in_batched = batch_dims_first(vals_in, dims_in)
    with typed_context(params.mesh):  # NOTE [retracing typed bodies]
        batched_jaxpr, out_batched = jp.batch_jaxpr(params.jaxpr, axis_data, in_batched, False)
    mesh, spmd, size = params.mesh, spmd_axes(axis_data), axis_data.size
    batched = params.replace(
        jaxpr=batched_jaxpr,
        in_axis_resources=tuple(
            batch_spec(s, 0, spmd, mesh, size) if b else s
            for s, b in zip(params.in_axis_resources, in_batched, strict=True)
        ),
        out_axis_resources=tuple(
            batch_spec(s, 0, spmd, mesh, size) if b else s
            for s, b in zip(params.out_axis_resources, out_batched, strict=True)
        ),
    )
    outs = batched.bind(*vals_in)
    return outs, [0 if b else not_mapped for b in out_batched]


# --- jvp ---


def jvp(primals_in: Any, tangents_in: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    params = PjitParams.of(kwargs)
    nz_in = [type(t) is not jp.Zero for t in tangents_in]
    with typed_context(params.mesh):  # NOTE [retracing typed bodies]
        jaxpr_jvp, nz_out = jp.jvp_jaxpr(params.jaxpr, nz_in, instantiate=False)
    in_specs, out_specs = params.in_axis_resources, params.out_axis_resources
    jvp_params = params.replace(
        jaxpr=jaxpr_jvp,
        in_axis_resources=(*in_specs, *keep_where(in_specs, nz_in)),
        out_axis_resources=(*out_specs, *keep_where(out_specs, nz_out)),
        donated_invars=(*params.donated_invars, *(False,) * sum(nz_in)),
        name=f"jvp({params.name})",
    )
    outs = jvp_params.bind(*primals_in, *keep_where(tangents_in, nz_in))
    primals_out, nz_tangents = outs[: len(out_specs)], iter(outs[len(out_specs) :])
    tangents_out = [
        next(nz_tangents) if nz else jp.Zero(aval.to_tangent_aval())
        for nz, aval in zip(nz_out, params.jaxpr.out_avals, strict=True)
    ]
    return primals_out, tangents_out


# --- transpose ---


@cache_per_jaxpr
def _transposed_jaxpr(
    jaxpr: Any, undef: tuple[bool, ...], nz_cts: tuple[bool, ...], in_avals: tuple[Any, ...]
) -> tuple[Any, tuple[bool, ...]]:
    """The transposed body and which linear inputs get non-zero cotangents."""
    n_known = undef.count(False)
    nz_out_box: list[tuple[bool, ...]] = []

    def body(*args: Any) -> list[Any]:
        known, cts = iter(args[:n_known]), iter(args[n_known:])
        primals = [
            jp.UndefinedPrimal(a) if u else next(known)
            for a, u in zip(jaxpr.in_avals, undef, strict=True)
        ]
        cts_full = [
            next(cts) if nz else jp.Zero(a.to_ct_aval())
            for a, nz in zip(jaxpr.out_avals, nz_cts, strict=True)
        ]
        cts_out = jp.backward_pass(jaxpr.jaxpr, False, jaxpr.consts, primals, cts_full)
        linear = [ct for ct, u in zip(cts_out, undef, strict=True) if u]
        nz_out_box.append(tuple(type(ct) is not jp.Zero and ct is not None for ct in linear))
        return [ct for ct in linear if type(ct) is not jp.Zero and ct is not None]

    debug = jaxpr.jaxpr.debug_info.with_unknown_names()
    t_jaxpr, _, consts = jp.trace_to_jaxpr_dynamic(
        jp.wrap_init(body, debug_info=debug), list(in_avals)
    )
    return jp.ClosedJaxpr(t_jaxpr, consts), nz_out_box[-1]


def transpose(cts_in: Any, *primals_in: Any, **kwargs: Any) -> list[Any]:
    params = PjitParams.of(kwargs)
    jaxpr, in_specs, out_specs = params.jaxpr, params.in_axis_resources, params.out_axis_resources
    undef = tuple(jp.is_undefined_primal(x) for x in primals_in)
    nz_cts = tuple(type(ct) is not jp.Zero for ct in cts_in)
    known = [x for x, u in zip(primals_in, undef, strict=True) if not u]
    cts = keep_where(cts_in, nz_cts)
    in_avals = tuple(jp.typeof(x) for x in (*known, *cts))
    with typed_context(params.mesh):  # NOTE [retracing typed bodies]
        t_jaxpr, nz_out = _transposed_jaxpr(jaxpr, undef, nz_cts, in_avals)
    linear_specs = keep_where(in_specs, undef)
    t_in_specs = keep_where(in_specs, [not u for u in undef]) + keep_where(out_specs, nz_cts)
    transposed = params.replace(
        jaxpr=t_jaxpr,
        in_axis_resources=t_in_specs,
        out_axis_resources=keep_where(linear_specs, nz_out),
        donated_invars=(False,) * len(in_avals),
        name=f"transpose({params.name})",
    )
    outs = transposed.bind(*known, *cts) if t_jaxpr.out_avals or t_jaxpr.effects else []
    return cotangents_for(primals_in, undef, nz_out, outs)


# --- partial eval ---


def _unprune(
    fwd: Sequence[int | None], kept: Sequence[Any], src: Sequence[Any] | None = None
) -> list[Any]:
    """Undo a forwarding prune: one entry per ``fwd`` index.

    ``kept`` holds the values that were not pruned (``fwd`` is None), in order;
    a pruned entry becomes ``src[fwd]``, or, without ``src``, the entry at
    index ``fwd`` of the result itself (a forward to a kept value).
    """
    kept_iter = iter(kept)
    full = [next(kept_iter) if f is None else None for f in fwd]
    assert next(kept_iter, full) is full, (fwd, len(kept))
    source = full if src is None else src
    return [x if f is None else source[f] for f, x in zip(fwd, full, strict=True)]


def _prune_forwarded(
    known_jaxpr: Any, known_out_specs: tuple[Any, ...], num_res: int
) -> tuple[Any, tuple[Any, ...], list[int | None], list[int | None]]:
    """Drop the known half's outputs that another value already provides.

    Returns:
        ``(known_jaxpr, known_out_specs, in_fwd, out_fwd)``: the pruned half and
        its specs; ``in_fwd[i]`` is the known input that output ``i`` merely
        forwards (kept only where XLA may choose its layout anyway, so
        forwarding changes nothing), ``out_fwd[i]`` the primal output a
        residual duplicates (it is returned once).
    """
    num_primals = len(known_jaxpr.out_avals) - num_res
    in_fwd = jp.jaxpr_forwarding(known_jaxpr.jaxpr)
    in_fwd = [
        f if s is None else None for f, s in zip(in_fwd[:num_primals], known_out_specs)
    ] + in_fwd[num_primals:]
    keep = [f is None for f in in_fwd]
    known_jaxpr = jp.prune_closed_jaxpr_outputs(known_jaxpr, keep)
    known_out_specs = keep_where(known_out_specs, keep)
    num_primals = sum(keep[:num_primals])

    out_vars = known_jaxpr.jaxpr.outvars[:num_primals]
    index = {id(v): i for i, v in enumerate(out_vars)}
    res_vars = known_jaxpr.jaxpr.outvars[num_primals:]
    out_fwd = [None] * num_primals + [index.get(id(v)) for v in res_vars]
    keep = [f is None for f in out_fwd]
    known_jaxpr = jp.prune_closed_jaxpr_outputs(known_jaxpr, keep)
    return known_jaxpr, keep_where(known_out_specs, keep), in_fwd, out_fwd


def partial_eval(trace: Any, *in_tracers: Any, **kwargs: Any) -> list[Any]:
    params = PjitParams.of(kwargs)
    jaxpr, in_specs, out_specs = params.jaxpr, params.in_axis_resources, params.out_axis_resources
    in_pvals = [t.pval for t in in_tracers]
    known_ins = tuple(pv.is_known() for pv in in_pvals)
    unknown_ins = tuple(not k for k in known_ins)
    with typed_context(params.mesh):  # NOTE [retracing typed bodies]
        known_jaxpr, unknown_jaxpr, unknown_outs, res_avals, in_fwd_res = (
            jp.partial_eval_jaxpr_nounits_fwd(jaxpr, unknown_ins, instantiate=False)
        )
    known_outs = tuple(not u for u in unknown_outs)
    known_jaxpr, known_out_specs, in_fwd, out_fwd = _prune_forwarded(
        known_jaxpr, keep_where(out_specs, known_outs) + (None,) * len(res_avals), len(res_avals)
    )

    # A known input that is also a residual or a forwarded output must outlive
    # the known half, so it is not donated there.
    n_consts = len(jaxpr.consts)
    kept_alive = {f - n_consts for f in in_fwd_res if f is not None and f >= n_consts}
    kept_alive |= {f for f in in_fwd if f is not None}
    known = params.replace(
        jaxpr=known_jaxpr,
        in_axis_resources=keep_where(in_specs, known_ins),
        out_axis_resources=known_out_specs,
        donated_invars=tuple(
            d and i not in kept_alive
            for i, d in enumerate(keep_where(params.donated_invars, known_ins))
        ),
    )
    known_inputs = [pv.get_known() for pv in in_pvals if pv.is_known()]
    # A known half that computes nothing (every output unknown, every residual
    # forwarded) is not run: it would compile and execute an empty program.
    ran = known.bind(*known_inputs) if known_jaxpr.out_avals or known_jaxpr.effects else []
    known_outs_all = _unprune(in_fwd, _unprune(out_fwd, ran), known_inputs)
    n_known_primals = sum(known_outs)
    known_out_vals = known_outs_all[:n_known_primals]
    res_returned = iter(known_outs_all[n_known_primals:])
    sources = [*jaxpr.consts, *known_inputs]
    residuals = [next(res_returned) if f is None else sources[f] for f in in_fwd_res]

    # A residual forwarded from a known input keeps that input's spec.
    known_in_specs = [None] * n_consts + list(keep_where(in_specs, known_ins))
    res_specs = tuple(None if f is None else known_in_specs[f] for f in in_fwd_res)
    unknown = params.replace(
        jaxpr=unknown_jaxpr,
        in_axis_resources=res_specs + keep_where(in_specs, unknown_ins),
        out_axis_resources=keep_where(out_specs, unknown_outs),
        donated_invars=(False,) * len(residuals) + keep_where(params.donated_invars, unknown_ins),
    )
    unknown_tracers_out = stage_unknown(
        trace,
        pjit_p,
        unknown.as_kwargs(),
        unknown.jaxpr.out_avals,
        jp.positional_effects(unknown.jaxpr),
        residuals,
        in_tracers,
    )
    known_iter, unknown_iter = iter(known_out_vals), iter(unknown_tracers_out)
    return [next(unknown_iter) if u else next(known_iter) for u in unknown_outs]


# --- partial_eval_jaxpr_custom (jax.checkpoint / remat policies under grad) ---


def _pjit_partial_eval_custom_params(
    unks_in: Sequence[bool],
    inst_in: Sequence[bool],
    kept_outs_known: Sequence[bool],
    kept_outs_staged: Sequence[bool],
    num_res_out: int,
    num_res_in: int,
    params_known: dict[str, Any],
    params_staged: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    # jax has already put each half's jaxpr in; the specs and flags follow it
    # (so the halves are validated only once complete).
    known_in = [not u for u in unks_in]
    known = PjitParams.of(
        {
            **params_known,
            "in_axis_resources": keep_where(params_known["in_axis_resources"], known_in),
            "out_axis_resources": keep_where(params_known["out_axis_resources"], kept_outs_known)
            + (None,) * num_res_out,
            "donated_invars": keep_where(params_known["donated_invars"], known_in),
        }
    )
    staged = PjitParams.of(
        {
            **params_staged,
            "in_axis_resources": (None,) * num_res_in
            + keep_where(params_staged["in_axis_resources"], inst_in),
            "out_axis_resources": keep_where(params_staged["out_axis_resources"], kept_outs_staged),
            "donated_invars": (False,) * num_res_in
            + keep_where(params_staged["donated_invars"], inst_in),
        }
    )
    return known.as_kwargs(), staged.as_kwargs()


def partial_eval_custom(saveable: Any, unks_in: Any, inst_in: Any, eqn: Any) -> Any:
    return jp.closed_call_partial_eval_custom_rule(
        "jaxpr", _pjit_partial_eval_custom_params, saveable, unks_in, inst_in, eqn
    )


# --- dead-code elimination ---


@cache_per_jaxpr
def _dce_body(jaxpr: Any, used_outputs: tuple[bool, ...]) -> tuple[Any, list[bool]]:
    body, used_inputs = jp.dce_jaxpr(jaxpr.jaxpr, used_outputs)
    return jp.ClosedJaxpr(body, jaxpr.consts), used_inputs


def dce(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    if not any(used_outputs) and not jp.has_effects(eqn):
        return [False] * len(eqn.invars), None
    params = PjitParams.of(eqn.params)
    pruned_jaxpr, used_inputs = _dce_body(params.jaxpr, tuple(used_outputs))
    pruned = params.replace(
        jaxpr=pruned_jaxpr,
        in_axis_resources=keep_where(params.in_axis_resources, used_inputs),
        out_axis_resources=keep_where(params.out_axis_resources, used_outputs),
        donated_invars=keep_where(params.donated_invars, used_inputs),
    )
    new_invars = keep_where(eqn.invars, used_inputs)
    new_eqn = jp.new_jaxpr_eqn(
        list(new_invars),
        list(keep_where(eqn.outvars, used_outputs)),
        pjit_p,
        pruned.as_kwargs(),
        jp.eqn_effects(pruned_jaxpr, new_invars),
        eqn.source_info,
        eqn.ctx,
    )
    return used_inputs, new_eqn
