"""Run a compiled pjit body: place the arguments, execute, wrap the results.

Arguments already laid out as their spec asks are passed through untouched (no
copy); everything else (numpy arrays, Python scalars, arrays laid out another
way) is placed with ``jax.device_put`` first. The impls of our primitives live
here too (``pjit_p``, the pmap region's, which runs as a pjit, and the sharding
constraint's): running a primitive eagerly is this module's job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.experimental.layout import Format
from jax.sharding import Mesh, NamedSharding
from jax.tree_util import PyTreeDef, tree_unflatten

from .. import jax_private as jp
from .. import lazy, window
from ..compiler.cache import get_executable
from ..compiler.executable import Executable
from ..lower.module import warn_unusable_donations
from ..primitives.constraint import ConstraintParams
from ..primitives.pjit_call import PjitParams
from ..sharding.parsed import REPLICATED, ParsedPartitionSpec
from ..sharding.placement import (
    check_usable,
    is_committed,
    layout_spec,
    placement_from_arguments,
)

# The pmap region loads with pmap (``pmap_registry.py`` installs its impl below).
if TYPE_CHECKING:
    from ..primitives import pmap_region
else:
    pmap_region = lazy.module("partitioner._src.primitives.pmap_region")


def _flat_position(i: int) -> str:
    return f"argument {i} (flat)"


def place_args_reporting(
    args: Sequence[Any],
    shardings: Sequence[NamedSharding | Format],
    where: Callable[[int], str] = _flat_position,
    *,
    strict: bool = False,
) -> tuple[list[Any], bool]:
    """Lay each argument out as its sharding (or Format) asks; pass through those already there.

    ``where(i)`` names argument ``i`` in an error (its path, as the user wrote it).
    With ``strict`` (a user's call of a ``Compiled``), a committed array laid out
    otherwise is an error, as in jax, instead of being moved.

    Returns:
        ``(placed, moved_committed)``: the arguments, and whether a committed
        jax.Array had to be moved to another layout (such calls stay off the C++
        fast path, which would not move it).

    Raises:
        RuntimeError / ValueError: see :func:`check_usable`.
    """
    placed = []
    moved_committed = False
    for i, (x, target) in enumerate(zip(args, shardings, strict=True)):
        # A Format target: the input's spec states a memory layout too.
        sharding: Any = target.sharding if isinstance(target, Format) else target
        layout = target.layout if isinstance(target, Format) else None
        if isinstance(x, jax.Array) and not isinstance(x, jp.Tracer):
            if (
                not x.is_deleted()
                and (x.sharding == sharding or x.sharding.is_equivalent_to(sharding, x.ndim))
                and (layout is None or x.format.layout == layout)  # type: ignore[attr-defined]
            ):
                placed.append(x)
                continue
            check_usable(x, sharding.mesh, where(i))
            if strict and x.committed:
                raise ValueError(
                    "Computation was compiled for input shardings that disagree with the "
                    "shardings of arguments passed to it. Here are the 1 mismatches:\n"
                    f"Argument {where(i).rpartition('argument ')[2]} with shape "
                    f"{x.aval.str_short()}:\n  Passed sharding: {x.sharding}\n"
                    f"  Required sharding: {sharding}\n"
                    f"{where(i)} is committed to {x.sharding}, but the compiled computation "
                    f"takes it laid out as {sharding}. Pass it laid out so "
                    "(jax.device_put(x, compiled.input_shardings[...])), or lower again."
                )
            moved_committed = moved_committed or x.committed
        elif isinstance(x, jax.ShapeDtypeStruct):  # a placeholder: .lower() takes it, a call not
            aval = jax.core.ShapedArray(x.shape, x.dtype)
            raise TypeError(
                f"Argument '{where(i).rpartition('argument ')[2]}' of shape {aval.str_short()} "
                f"of type {type(x)} is not a valid JAX type.\n{where(i)}: a ShapeDtypeStruct "
                "describes an argument for .lower() or .eval_shape(); call with an array."
            )
        elif jp.is_token(x):
            # An ordering token: what it orders is done once it is ready; the program
            # takes an empty buffer in its place, as jax.jit passes it.
            x.block_until_ready()
            x = np.zeros((0,), np.bool_)
        elif getattr(x, "dtype", None) == jax.dtypes.float0:
            # float0 (a tangent of an int) has no buffers: the program takes bools.
            x = np.zeros(np.shape(x), np.bool_)
        placed.append(jax.device_put(x, target))
    return placed, moved_committed


def execute_placed(executable: Executable, placed: Sequence[Any]) -> list[Any]:
    """Run on arguments already laid out as ``executable.in_shardings``."""
    if jp.no_execution():
        raise RuntimeError(
            f"JAX tried to execute function {executable.lowered.module_name}, but the "
            "no_execution config option is set"
        )
    if executable.physical_inputs:
        placed = [jp.physical_array(x) for x in placed]
    if executable.windowed:
        window.make_room()
    if executable.uses_tokens:
        # This process's devices: in a multi-process program the tokens live there only.
        effects, devices = executable.lowered.ordered_effects, executable.loaded.local_devices()
        results = executable.loaded.execute_sharded(
            [*jp.token_inputs(effects, devices), *placed], with_tokens=True
        )
        jp.record_tokens(effects, results, devices)
    else:
        results = executable.loaded.execute_sharded(list(placed))
    outs = results.consume_with_handlers(executable.out_handler.handlers)
    if executable.marker is not None:
        window.launched(outs[executable.marker], executable.small_marker)
    return outs


def run(
    executable: Executable,
    leaves: Sequence[Any],
    out_tree: PyTreeDef,
    where: Callable[[int], str] = _flat_position,
    *,
    strict: bool = False,
) -> tuple[Any, bool]:
    """Place ``leaves`` (those the program takes), execute, and unflatten the outputs.

    ``where(i)`` names leaf ``i`` in an error; ``strict``: see :func:`place_args_reporting`.

    Returns:
        ``(outputs, moved_committed)``: see :func:`place_args_reporting`.
    """
    if executable.kept is not None:  # pruned inputs are neither moved nor passed
        leaves = executable.taken(leaves)
        where = _renumbered(where, executable.kept)
    placed, moved = place_args_reporting(leaves, executable.in_placements(), where, strict=strict)
    return tree_unflatten(out_tree, execute_placed(executable, placed)), moved


def _renumbered(where: Callable[[int], str], kept: Sequence[int]) -> Callable[[int], str]:
    """``where`` for the kept inputs: kept input ``k`` is the call's input ``kept[k]``."""
    return lambda k: where(kept[k])


def spec_of_arg(x: Any, mesh: Mesh) -> ParsedPartitionSpec:
    """The spec ``x`` is already laid out with over ``mesh`` (REPLICATED if none).

    Used for inputs whose spec is None (residuals, NOTE [residual shardings]):
    they are taken as they arrive instead of being moved.
    """
    if isinstance(x, jax.Array) and not isinstance(x, jp.Tracer):
        spec = layout_spec(x, mesh)
        if spec is not None:
            return spec
    return REPLICATED


def pjit_impl(*args: Any, **kwargs: Any) -> list[Any]:
    """Run the body eagerly on concrete arguments (jax calls this outside any trace)."""
    params = _placed_on_arguments(PjitParams.of(kwargs), args)
    if None in params.in_axis_resources:
        params = params.replace(
            in_axis_resources=tuple(
                spec_of_arg(x, params.mesh) if s is None else s
                for s, x in zip(params.in_axis_resources, args, strict=True)
            )
        )
    executable, built = get_executable(params)
    if built:  # as jax.jit's eager call warns when it lowers a program
        warn_unusable_donations(executable.lowered)
    taken = executable.taken(args)
    return execute_placed(executable, place_args_reporting(taken, executable.in_placements())[0])


def _placed_on_arguments(params: PjitParams, args: Sequence[Any]) -> PjitParams:
    """``params`` over the committed arguments' devices, where nothing committed the plan.

    A call planned under a transformation (``vmap`` of a jit with no shardings)
    saw tracers, not the arrays, so it was placed on the default device and left
    uncommitted; the arrays that reach this impl decide, as they do for jax.jit:
    the body runs where they live, each taken as it is laid out.
    """
    if params.committed or not any(is_committed(x) for x in args):
        return params
    labels = [f"{i} (flat)" for i in range(len(args))]
    placement = placement_from_arguments(f"{params.api} {params.name}", args, labels)
    if placement.mesh == params.mesh:
        return params
    return params.replace(
        mesh=placement.mesh,
        committed=True,
        in_axis_resources=tuple(
            None if is_committed(x) else s
            for s, x in zip(params.in_axis_resources, args, strict=True)
        ),
    )


def region_impl(*args: Any, **kwargs: Any) -> list[Any]:
    """A pmap region outside any pjit (a rule bound one eagerly): run it as a pjit over its mesh."""
    region = pmap_region.RegionParams.of(kwargs)
    avals = [jp.shaped_abstractify(x) for x in args]
    params = pmap_region.region_pjit(region, (), avals, (False,) * len(args))
    return pjit_impl(*args, **params.as_kwargs())


def constraint_impl(x: Any, **kwargs: Any) -> Any:
    """A constraint outside any trace: lay the value out (open dims unpartitioned).

    A jax.Array cannot be split unevenly (XLA pads only inside a computation),
    so a dimension its axes do not divide is laid out unpartitioned too: the
    value is the same, and uneven constraints stay allowed (no divisibility check).
    """
    params = ConstraintParams.of(kwargs)
    spec, mesh = params.axis_resources, params.mesh
    shape = jax.numpy.shape(x)
    shards = spec.shards_per_dim(mesh, len(shape))
    entries = [
        axes if axes and shape[d] % shards[d] == 0 else None
        for d, axes in enumerate(spec.partitions)
    ]
    return jax.device_put(x, NamedSharding(mesh, jax.sharding.PartitionSpec(*entries)))
