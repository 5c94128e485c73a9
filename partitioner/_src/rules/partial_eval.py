"""Partial evaluation of a pjit (``linearize``, ``grad``, ``vjp``) and remat.

A pjit with some unknown inputs splits into two ``pjit_p`` calls: the known
half runs now and also returns *residuals*; the unknown half is staged and
consumes them.

NOTE [residual shardings]: residuals are never forced to replicate. Their
spec in both halves is ``None`` ("XLA chooses"): the known half is compiled
with sharding propagation to those outputs, and dispatch reads the chosen
layout back from the executable (``compile.py`` parses its output
OpShardings). The unknown half then takes each residual laid out as it
arrived (``dispatch/execute.py`` resolves ``None`` in-specs from the
arguments). A residual that is just a known input, or a primal output, is
forwarded instead of being returned twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import jax_private as jp
from ..trace.primitive import PjitParams, pjit_p
from ._common import keep_where, stage_unknown


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


# --- partial eval (JaxprTrace) ---


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


def _pjit_partial_eval(trace: Any, *in_tracers: Any, **kwargs: Any) -> list[Any]:
    params = PjitParams.of(kwargs)
    jaxpr, in_specs, out_specs = params.jaxpr, params.in_axis_resources, params.out_axis_resources
    in_pvals = [t.pval for t in in_tracers]
    known_ins = tuple(pv.is_known() for pv in in_pvals)
    unknown_ins = tuple(not k for k in known_ins)
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


jp.custom_partial_eval_rules[pjit_p] = _pjit_partial_eval


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


def _pjit_partial_eval_custom(saveable: Any, unks_in: Any, inst_in: Any, eqn: Any) -> Any:
    return jp.closed_call_partial_eval_custom_rule(
        "jaxpr", _pjit_partial_eval_custom_params, saveable, unks_in, inst_in, eqn
    )


jp.partial_eval_jaxpr_custom_rules[pjit_p] = _pjit_partial_eval_custom
