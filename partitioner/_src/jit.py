"""``partitioner.jit``: ``jax.jit``'s signature and semantics on partitioner's pipeline.

Why a front door of its own: most JAX code calls ``jax.jit``, and libraries wrap
it (FSDP helpers build ``NamedSharding`` trees and pass ``None`` where they have no
opinion). ``jax.jit`` reads ``None`` as *unspecified* where pjit under a mesh reads
it as *replicated*, checks its argnums when the function is wrapped, and names
itself and its own parameters in messages: all of that is data in its options
record (``planner/jit_info.py``); the planner and the dispatcher are pjit's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from .planner.jit_info import Door, JitOptions, NoneRule, SpecNames, jit_info, options_of, takes
from .planner.jit_plan import JitPlanner
from .wrapped import Wrapped


class JitWrapped(Wrapped):
    """What :func:`partitioner.jit` returns (NOTE [pjit callable]: the same mechanics)."""

    kind = "jit"


_DOOR = Door(api="jit", none_rule=NoneRule.UNSPECIFIED, use_resource_env=False)
_NAMES = SpecNames("in_shardings", "out_shardings")


@takes(JitOptions)
def jit(fun: Callable[..., Any] | None = None, /, **options: Unpack[JitOptions]) -> Any:
    """Compile ``fun`` as ``jax.jit`` does, partitioned by partitioner's pipeline.

    Same signature and semantics as ``jax.jit``: ``in_shardings``/``out_shardings``
    are optional pytree prefixes of the positional arguments / outputs with
    ``Sharding`` leaves (NamedSharding, or PartitionSpecs under ``jax.set_mesh``);
    ``None`` (or an omitted tree) is *unspecified*: an input as it is laid out, an
    output as XLA's propagation lays it out. With no mesh in context the call runs
    on its committed arguments' devices (else ``device`` or the default device).
    A committed argument laid out otherwise than its given sharding is an error,
    never a hidden transfer. A ``partitioner.AUTO`` leaf is chosen by partitioner,
    within ``auto_memory_limit`` bytes per device if given (see :func:`pjit`).
    Without ``fun``, returns a decorator. Its keyword options (``inspect.signature``
    and ``help()`` list them with their defaults) are ``jax.jit``'s: ``in_shardings``,
    ``out_shardings``, ``static_argnums``, ``static_argnames``, ``donate_argnums``,
    ``donate_argnames``, ``keep_unused``, ``device``, ``backend``, ``inline``,
    ``compiler_options``; and ``auto_memory_limit`` (described under :func:`pjit`).

    Returns:
        JitWrapped: call it; ``.lower(...)``; ``.clear_cache()``; plus what
        partitioner adds: reports, both partitioners.

    Raises:
        TypeError: ``fun`` is not callable, a bad argnums/flag type.
        ValueError: argnums or argnames ``fun`` cannot take (as jax.jit, at wrap time).
    """
    record = options_of(jit, options)  # NOTE [one options record]

    def wrap(f: Callable[..., Any]) -> JitWrapped:
        in_specs, out_specs = record["in_shardings"], record["out_shardings"]
        info = jit_info(f, _DOOR, _NAMES, in_specs, out_specs, record)
        return JitWrapped.make(JitPlanner(info))

    return wrap if fun is None else wrap(fun)
