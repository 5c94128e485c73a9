"""Why a call missed the cache, under ``jax_explain_cache_misses=True``, as jax.jit says it.

A miss costs a trace, a lowering and a compile (or a persistent-cache load), so
a loop that misses at every step is the first thing to find when a program is
slow. jax.jit logs a "TRACING CACHE MISS" warning naming the function, the
call site and, against the closest signature seen before, what changed; the
dispatcher's signature (``fastpath.py``) holds the same parts, so pjit and pmap
explain their misses the same way: the jax configuration, the mesh in context,
a static argument's value, the argument structure, or an argument's shape,
dtype, weak type, sharding or committedness, named by its path (``params['w1']``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import jax_private as jp
from ..trace.arguments import FlatArguments

logger = logging.getLogger(__name__)

# The dispatcher's signature: (tree, leaf signatures, statics, mesh, jax configuration,
# jax's compile settings).
Signature = tuple[Any, tuple[Any, ...], tuple[Any, ...], Any, Any, tuple[Any, ...]]

_LEAF_PARTS = ("type", "shape", "dtype", "weak_type", "sharding", "committed")


def enabled() -> bool:
    return bool(jp.explain_cache_misses.value)


class ArgNames:
    """Names arguments as jax.jit does: by parameter name and pytree path (``params['w1']``)."""

    def __init__(self, positional: Sequence[str]) -> None:
        self._params = list(positional)

    def positional(self, pos: int) -> str:
        return self._params[pos] if pos < len(self._params) else f"args[{pos}]"

    def static(self, where: int | str) -> str:
        """A static argument, by position or keyword."""
        return self.positional(where) if isinstance(where, int) else where


def _describe(sig: Any) -> str:
    """A leaf signature (``fastpath._leaf_signature``) in words."""
    if not isinstance(sig, tuple):
        return f"a Python {getattr(sig, '__name__', sig)}"
    kind, shape, dtype = sig[0].__name__, tuple(sig[1]), getattr(sig[2], "name", sig[2])
    text = f"a {kind} {dtype}{list(shape)}"
    if len(sig) == len(_LEAF_PARTS):
        text += f" (weak_type={sig[3]}, sharding {sig[4]}, committed={sig[5]})"
    return text


def _diff_leaf(name: str, new: Any, old: Any) -> str | None:
    if new == old:
        return None
    if not (isinstance(new, tuple) and isinstance(old, tuple) and len(new) == len(old)):
        return f"  * at {name}, now {_describe(new)} and before {_describe(old)}"
    parts = [
        f"{part} now {n} and before {o}"
        for part, n, o in zip(_LEAF_PARTS, new, old, strict=False)
        if n != o
    ]
    return f"  * at {name}, " + "; ".join(parts)


def _diff(
    new: Signature, old: Signature, flat: FlatArguments, names: ArgNames
) -> tuple[int, int, str]:
    """(depth, number of differences, explanation) of ``new`` against ``old``.

    The depth is how far down the signature the first difference lies (the
    configuration first, argument types last): the closest previous key is the
    deepest, then the one with the fewest differences.
    """
    tree, leaves, statics, mesh, context, settings = new
    o_tree, o_leaves, o_statics, o_mesh, o_context, o_settings = old
    if context != o_context or settings != o_settings:
        named = zip(
            (*jp.trace_context_names(), *jp.COMPILE_SETTING_NAMES),
            (*context, *settings),
            (*o_context, *o_settings),
            strict=False,
        )
        diffs = [f"  * {n} differs: now {a} and before {b}" for n, a, b in named if a != b]
        return 0, len(diffs), "the jax configuration differs:\n" + "\n".join(diffs)
    if mesh != o_mesh:
        return 1, 1, f"the mesh in context differs: now {mesh} and before {o_mesh}"
    if statics != o_statics:  # (position or keyword, HashableStatic) pairs
        diffs = [
            f"  * at static argument {names.static(w)}, now {v.value!r} and before {ov.value!r}"
            for (w, v), (_, ov) in zip(statics, o_statics, strict=False)
            if v != ov
        ]
        if len(statics) != len(o_statics):
            now = [(w, v.value) for w, v in statics]
            before = [(w, v.value) for w, v in o_statics]
            diffs.append(f"  * static arguments now {now!r} and before {before!r}")
        return 2, len(diffs), "different static arguments:\n" + "\n".join(diffs)
    if tree != o_tree:
        return 3, 1, f"different argument structure: now {tree} and before {o_tree}"
    diffs = [
        d
        for i, (n, o) in enumerate(zip(leaves, o_leaves, strict=True))
        if (d := _diff_leaf(flat.label(i), n, o)) is not None
    ]
    return 4, len(diffs), "different argument types:\n" + "\n".join(diffs)


def explain_miss(
    name: str,
    fun: Callable[..., Any],
    new: Signature,
    seen: Iterable[Signature],
    flat: FlatArguments,
    names: ArgNames,
) -> None:
    """Log (WARNING) why ``new`` missed, against the closest of the signatures ``seen``."""
    lines = [f"TRACING CACHE MISS at {jp.user_call_site()}:"]
    where = ""
    try:
        where = f" defined at {inspect.getsourcefile(fun)}:{inspect.getsourcelines(fun)[1]}"
    except (TypeError, OSError):
        pass
    seen = [s for s in seen if s is not None]
    if not seen:
        lines.append(f"  never seen function:\n    {name}{where}")
    else:
        lines.append(f"  for {name}{where}")
        diffs = (_diff(new, s, flat, names) for s in seen)
        closest = min(diffs, key=lambda d: (-d[0], d[1]))
        lines.append("  all previously seen cache keys differ. For the closest previous key:")
        lines.append("  " + closest[2])
    logger.warning("\n".join(lines))
