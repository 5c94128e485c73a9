"""Small helpers shared by the rule modules."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import jax_private as jp

T = TypeVar("T")
R = TypeVar("R")


def keep_where(xs: Sequence[T], keep: Sequence[bool]) -> tuple[T, ...]:
    """The entries of ``xs`` whose flag in ``keep`` is true."""
    return tuple(x for x, k in zip(xs, keep, strict=True) if k)


def cache_per_jaxpr(fn: Callable[..., R]) -> Callable[..., R]:
    """Memoise ``fn(jaxpr, *hashable_args)``, dropping entries with the jaxpr.

    NOTE [derived jaxpr cache]: rules build derived jaxprs (transposed, DCE'd).
    Returning the *same* object for the same inputs lets repeated calls hit the
    executable cache instead of recompiling. Results holding tracers are
    never cached (they belong to one trace).
    """
    cache: weakref.WeakKeyDictionary[Any, dict[Any, R]] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(jaxpr: Any, *args: Any) -> R:
        with lock:
            hit = cache.get(jaxpr, {}).get(args)
        if hit is not None:
            return hit
        result = fn(jaxpr, *args)
        consts = getattr(result[0] if isinstance(result, tuple) else result, "consts", ())
        if not any(isinstance(c, jp.Tracer) for c in consts):
            with lock:
                cache.setdefault(jaxpr, {})[args] = result
        return result

    return wrapper


def cotangents_for(
    primals_in: Sequence[Any], undef: Sequence[bool], nz_out: Sequence[bool], outs: Sequence[Any]
) -> list[Any]:
    """A transpose rule's result: None for known inputs, the computed cotangent or a
    symbolic zero (``nz_out`` says which) for each linear one, in input order."""
    outs_iter, nz_iter = iter(outs), iter(nz_out)
    result: list[Any] = []
    for x, u in zip(primals_in, undef, strict=True):
        if not u:
            result.append(None)
        elif next(nz_iter):
            result.append(next(outs_iter))
        else:
            result.append(jp.Zero(x.aval.to_ct_aval()))
    return result


def stage_unknown(
    trace: Any,
    primitive: Any,
    params: dict[str, Any],
    out_avals: Sequence[Any],
    effects: Any,
    residuals: Sequence[Any],
    in_tracers: Sequence[Any],
) -> list[Any]:
    """Stage the unknown half of a partial eval as one ``primitive`` equation of ``trace``.

    Its inputs are the residuals, then the unknown inputs; returns its output tracers.
    """
    res_tracers = [trace.new_instantiated_const(r) for r in residuals]
    tracers_in = [*res_tracers, *(t for t in in_tracers if not t.pval.is_known())]
    tracers_out = [jp.JaxprTracer(trace, jp.PartialVal.unknown(a), None) for a in out_avals]
    eqn = jp.new_eqn_recipe(
        trace, tracers_in, tracers_out, primitive, params, effects, jp.current_source_info()
    )
    for t in tracers_out:
        t.recipe = eqn
    return tracers_out


def batch_dims_first(
    vals: Sequence[Any], dims: Sequence[int | None]
) -> tuple[list[Any], list[bool]]:
    """A batching rule's inputs with their batch dimension moved to 0, and which are batched."""
    moved = [
        x if d is None or d == 0 else jp.moveaxis(x, d, 0) for x, d in zip(vals, dims, strict=True)
    ]
    return moved, [d is not None for d in dims]
