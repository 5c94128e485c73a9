"""``pjit``: the front door of the 2022 API (and today's spelling of its specs).

It parses its options into a :class:`JitInfo` (``planner/jit_info.py``: pjit's
names for the spec trees, and its rule that ``None`` under a mesh means
replicated) and wraps the function (``wrapped.py``); calls are planned by the
free functions of ``planner/jit_plan.py``, shared with ``partitioner.jit``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Unpack

from .planner.jit_info import Door, NoneRule, SharedOptions, SpecNames, jit_info, options_of, takes
from .planner.jit_plan import JitPlanner
from .sharding.tree import UNSPECIFIED
from .wrapped import Wrapped


class PjitWrapped(Wrapped):
    """What :func:`partitioner.pjit` returns: call it, ``.lower(...)`` it (NOTE [pjit callable])."""

    kind = "pjit"


_DOOR = Door(api="pjit", none_rule=NoneRule.REPLICATED_UNDER_LEGACY_MESH, use_resource_env=True)


def _one_of(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of a spec argument given under its name or its jax.jit-style alias.

    Raises:
        TypeError: both spellings were given.
    """
    if value is not UNSPECIFIED and alias_value is not UNSPECIFIED:
        raise TypeError(
            f"pjit: {name} and {alias} are two names for the same argument; pass only one."
        )
    return value if value is not UNSPECIFIED else alias_value


@takes(SharedOptions)
def pjit(
    fun: Callable[..., Any],
    in_axis_resources: Any = UNSPECIFIED,
    out_axis_resources: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    **options: Unpack[SharedOptions],
) -> PjitWrapped:
    """Partition ``fun`` over the mesh in context at each call.

    Args:
        fun: the function; arguments and results are pytrees of arrays.
        in_axis_resources: a pytree prefix of the tuple of *dynamic* positional
            arguments (static ones removed): a single spec/None for all, or one
            entry per argument (a top-level list counts as that tuple).
            Keyword-only arguments are replicated. Leaves are PartitionSpecs,
            ``None`` (replicated), NamedShardings (their spec; their mesh must be
            the mesh in context, and is used when there is none) or
            ``partitioner.AUTO`` (partitioner chooses the layout over the mesh in
            context when the call is lowered; ``Lowered.report()`` shows why). Omitted: every
            argument as it is laid out (a committed array keeps its layout, an
            uncommitted one is replicated). With no mesh in context and no
            PartitionSpec given, the call runs on its committed arguments'
            devices (else the default device) and ``None`` means unspecified, as
            in jax.
        out_axis_resources: a pytree prefix of the output, with the same leaves.
            Omitted: as XLA's sharding propagation lays each output out.
        static_argnums: positional arguments traced as Python constants.
        donate_argnums: positional arguments whose buffers the output may reuse.
        static_argnames: the same as ``static_argnums``, by parameter name.
        donate_argnames: the same as ``donate_argnums``, by parameter name.
        in_shardings: today's ``jax.jit`` spelling of ``in_axis_resources`` (pass one).
        out_shardings: today's ``jax.jit`` spelling of ``out_axis_resources`` (pass one).
        keep_unused: as in ``jax.jit`` (see :func:`partitioner.jit`).
        device: as in ``jax.jit``.
        backend: as in ``jax.jit``.
        inline: as in ``jax.jit``.
        compiler_options: as in ``jax.jit``: XLA options by name for every compile.
        auto_memory_limit: bytes per device the program must fit (arguments +
            outputs + temporaries - aliased, as XLA's memory analysis counts them)
            when partitioner chooses AUTO layouts; ``None``: no limit.

    Returns:
        PjitWrapped: call it to run, ``.lower(...)`` for the AOT stages,
        ``.clear_cache()`` to drop its fast-path entries.
    """
    record = options_of(  # NOTE [one options record]
        pjit, options, static_argnums=static_argnums, donate_argnums=donate_argnums
    )
    in_shardings, out_shardings = record["in_shardings"], record["out_shardings"]
    in_name = (
        "in_shardings"
        if in_axis_resources is UNSPECIFIED and in_shardings is not UNSPECIFIED
        else "in_axis_resources"
    )
    out_name = (
        "out_shardings"
        if out_axis_resources is UNSPECIFIED and out_shardings is not UNSPECIFIED
        else "out_axis_resources"
    )
    in_specs = _one_of("in_axis_resources", in_axis_resources, "in_shardings", in_shardings)
    out_specs = _one_of("out_axis_resources", out_axis_resources, "out_shardings", out_shardings)
    info = jit_info(fun, _DOOR, SpecNames(in_name, out_name), in_specs, out_specs, record)
    return PjitWrapped.make(JitPlanner(info))
