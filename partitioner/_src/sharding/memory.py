"""Memory kinds of a call's inputs: what each argument's spec states, checked against it.

Why here, before tracing: the memory space is part of an argument's type
(``float32<host>[8]``), so the body must be traced with the space the input
will really live in. A spec that states a kind (a NamedSharding leaf) wins and
an array living elsewhere is an error, as in ``jax.jit`` (it never moves an
argument between memories behind the caller's back); a spec that states none
(a PartitionSpec or ``None`` leaf) takes the argument's own space, or the
default one for numpy arrays and scalars.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import jax_private as jp
from .parsed import ParsedPartitionSpec

MSG_MEMORY_KIND_MISMATCH = """\
Memory kinds passed to jax.jit does not match memory kind on the respective arg. Got jit \
memory kind: {wanted}, arg memory kind: {got} for arg type: {aval}
{where}: its spec asks for memory kind {wanted!r}, but the argument lives in {got!r} \
(its sharding: {sharding}). {api} does not move arguments between memories implicitly, as \
jax.jit does not. Move it first (jax.device_put(x, sharding.with_memory_kind({wanted!r}))) \
or state the kind it has."""


def _array_kind(x: Any) -> str | None:
    """The memory kind a concrete jax.Array lives in (None for anything else)."""
    if isinstance(x, jax.Array) and not isinstance(x, jp.Tracer):
        return x.sharding.memory_kind or _default_kind(x.sharding)
    stated = getattr(x, "sharding", None)  # a ShapeDtypeStruct with a sharding
    if isinstance(stated, jax.sharding.Sharding) and stated.memory_kind is not None:
        return stated.memory_kind
    return None


def _default_kind(sharding: Any) -> str | None:
    device = next(iter(sharding.device_set), None)
    return None if device is None else device.default_memory().kind


def resolve_input_memory(
    api: str,
    specs: Sequence[ParsedPartitionSpec],
    leaves: Sequence[Any],
    avals: Sequence[Any],
    where: Callable[[int], str],
    default_kind: str,
) -> tuple[tuple[ParsedPartitionSpec, ...], tuple[Any, ...]]:
    """Each input's memory kind, stated on its spec and its aval.

    Returns:
        ``(specs, avals)``: a spec gets the argument's kind where it stated
        none, and states the default kind (``default_kind``, the mesh devices')
        as None, so every spelling of "device memory" shares one executable; an
        aval gets the memory space of its spec's kind.

    Raises:
        ValueError: an array lives in another memory than its spec states.
    """
    out_specs, out_avals = [], []
    for i, (spec, leaf, aval) in enumerate(zip(specs, leaves, avals, strict=True)):
        got = _array_kind(leaf)
        if spec.memory_kind is None:
            if got is not None:
                spec = spec.with_memory_kind(got)
        elif got is not None and got != spec.memory_kind:
            raise ValueError(
                MSG_MEMORY_KIND_MISMATCH.format(
                    aval=jp.shaped_abstractify(leaf),
                    where=where(i),
                    wanted=spec.memory_kind,
                    got=got,
                    sharding=getattr(leaf, "sharding", None),
                    api=api.split(" ")[0],
                )
            )
        kind = spec.memory_kind or default_kind
        if kind == default_kind and spec.memory_kind is not None:
            spec = spec.with_memory_kind(None)
        if hasattr(aval, "memory_space"):
            aval = aval.update(memory_space=jp.mem_kind_to_space(kind))
        out_specs.append(spec)
        out_avals.append(aval)
    return tuple(out_specs), tuple(out_avals)
