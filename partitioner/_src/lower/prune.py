"""Unused inputs pruned before lowering, as jax.jit's ``keep_unused=False`` does.

Why a pass before lowering: an input the body never reads still costs a
transfer to every device and device memory on every call. jax.jit drops such
inputs from the lowered module and from each call (``pxla._dce_jaxpr``); so do
we, once per program (memoized on the body), so that lowering, compiling and
the executable all see the pruned program, and the executable records which of
the call's inputs it takes (``Executable.kept``). A donated input that is pruned
is not consumed, as under jax.jit.
"""

from __future__ import annotations

from .. import jax_private as jp
from ..primitives.pjit_call import PjitParams
from ..trace.memo import cache_per_jaxpr


def prune_unused_inputs(params: PjitParams) -> tuple[PjitParams, tuple[int, ...] | None]:
    """``params`` with only the inputs its body uses (all, with ``keep_unused``), and their
    positions among the original inputs (None: nothing was pruned)."""
    if params.keep_unused:
        return params, None
    jaxpr, kept = _pruned(params.jaxpr)
    if len(kept) == len(params.jaxpr.in_avals):
        return params, None
    return (
        params.replace(
            jaxpr=jaxpr,
            in_axis_resources=tuple(params.in_axis_resources[i] for i in kept),
            donated_invars=tuple(params.donated_invars[i] for i in kept),
        ),
        kept,
    )


@cache_per_jaxpr
def _pruned(closed: jp.ClosedJaxpr) -> tuple[jp.ClosedJaxpr, tuple[int, ...]]:
    """The body without the inputs no output (nor effect) needs, and the kept positions."""
    jaxpr, used_consts, used_inputs = jp.dce_jaxpr_consts(
        closed.jaxpr, [True] * len(closed.jaxpr.outvars)
    )
    consts = [c for c, used in zip(closed.consts, used_consts, strict=True) if used]
    kept = tuple(i for i, used in enumerate(used_inputs) if used)
    return jp.ClosedJaxpr(jaxpr, consts), kept
