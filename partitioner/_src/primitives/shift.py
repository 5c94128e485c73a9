"""``shift``: roll a value by some positions along one dimension, transposed as the roll back.

Why a primitive of our own: a pipeline moves its activations on by one stage at every
step, ``jnp.roll`` along the stage dimension, which XLA's partitioner turns into one
collective-permute between neighbouring devices. jax derives the transpose of
``jnp.roll`` (a concatenation of two slices) as a pad of each piece of the cotangent,
which XLA partitions as two permutes: the backward pass would move twice the bytes of
the forward. A shift is linear and its transpose is the shift back, one permute; its
JVP is itself on the tangent, so forward mode, ``vmap`` and ``jax.checkpoint``
compose as for any jax operation. It lowers as ``jnp.roll`` does.

Every rule of ``shift_p`` is here; ``registry.py`` wires them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from .. import jax_private as jp

shift_p = jp.Primitive("shift")


def shift(x: Any, *, by: int, axis: int) -> Any:
    """``x`` rolled by ``by`` positions along ``axis`` (``jnp.roll``'s value)."""
    return shift_p.bind(x, by=int(by), axis=int(axis))


def impl(x: Any, *, by: int, axis: int) -> Any:
    return jnp.roll(x, by, axis=axis)


def abstract_eval(x: Any, *, by: int, axis: int) -> Any:
    """A shift moves values, never changes a type."""
    del by, axis
    return x


# --- jvp and transpose: linear ---


def jvp(primals: Any, tangents: Any, *, by: int, axis: int) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    out = shift(x, by=by, axis=axis)
    if type(t) is jp.Zero:
        return out, t
    return out, shift(t, by=by, axis=axis)


def transpose(ct: Any, x: Any, *, by: int, axis: int) -> list[Any]:
    if type(ct) is jp.Zero:
        return [jp.Zero(x.aval.to_ct_aval()) if jp.is_undefined_primal(x) else None]
    return [shift(ct, by=-by, axis=axis)]


# --- batching ---


def batcher(axis_data: Any, vals_in: Any, dims_in: Any, *, by: int, axis: int) -> tuple[Any, Any]:
    """The batch dimension, inserted at ``d``, moves the shifted one along if before it."""
    del axis_data
    (x,), (d,) = vals_in, dims_in
    if d is None:  # not mapped
        return shift(x, by=by, axis=axis), d
    return shift(x, by=by, axis=axis + (d <= axis)), d


# --- lowering ---


def lowering(ctx: Any, x: Any, *, by: int, axis: int) -> Any:
    return jp.lower_fun(functools.partial(impl, by=by, axis=axis), multiple_results=False)(ctx, x)
