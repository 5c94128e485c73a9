"""``partitioner.pipeline(layer, axis=...)``: the checks, the plan, and the program.

The program is NOTE [pipeline] (``__init__.py``); the schedule's arithmetic is
NOTE [pipeline schedule]; the microbatch choice NOTE [pipeline microbatches].
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from jax.tree_util import keystr, tree_flatten_with_path

from ..inspect.pipelines import PipelineSummary, stage_devices
from ..primitives.constraint import with_sharding_constraint
from ..sharding.mesh_env import maybe_current_mesh
from . import microbatches as choice
from .schedule import SCHEDULES, Schedule

_API = "partitioner.pipeline"
_OPEN = PartitionSpec.UNCONSTRAINED


def pipeline(
    layer: Callable[[Any, Any], Any],
    *,
    axis: str,
    microbatches: int | None = None,
    schedule: str = "gpipe",
) -> Pipelined:
    """A function ``run(stacked_params, x)`` whose value is the plain scan's,
    ``lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)[0]``, run as a
    pipeline over the mesh axis ``axis`` inside the enclosing program (NOTE [pipeline]).

    Args:
        layer: ``layer(params, h) -> h``, one layer: the same structure, shapes and
            dtypes out as in. It acts on each example of the batch on its own (a
            layer mixing examples, as batch norm does, would see microbatches).
        axis: the mesh axis whose devices are the stages.
        microbatches: how many pieces the batch (``x``'s leading dimension) is cut
            into; None: chosen by partitioner (NOTE [pipeline microbatches]).
        schedule: ``"gpipe"`` (each stage holds ``L / S`` contiguous layers) or
            ``"circular"`` (layer ``i`` on stage ``i mod S``, ``L / S`` visits: a
            smaller bubble).

    Raises:
        TypeError: ``layer`` not callable, ``axis`` not a string, ``microbatches``
            not an int.
        ValueError: ``microbatches`` below 1, an unknown ``schedule``. At the call:
            see :meth:`Pipelined.plan`.
    """
    if not callable(layer):
        raise TypeError(f"{_API}: layer must be callable, got {type(layer).__name__}")
    if not isinstance(axis, str):
        raise TypeError(f"{_API}: axis must be a mesh axis name (a str), got {axis!r}")
    if microbatches is not None:
        if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)):
            raise TypeError(
                f"{_API}: microbatches must be an int or None, got {type(microbatches).__name__}"
            )
        if microbatches < 1:
            raise ValueError(f"{_API}: microbatches must be >= 1, got {microbatches}")
    if schedule not in SCHEDULES:
        raise ValueError(f"{_API}: schedule must be one of {SCHEDULES}, got {schedule!r}")
    return Pipelined(layer, axis, None if microbatches is None else int(microbatches), schedule)


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """What a pipelined call does (``Pipelined.plan``), for the report and the docs.

    Attributes:
        schedule: the shape (layers, stages, microbatches) and its arithmetic.
        axis: the mesh axis of the stages.
        stage_devices: per stage, the ids of the devices that run it.
        chosen: whether partitioner chose the microbatch count.
        estimates: the model's figures per microbatch count, where it chose.
        permute_bytes: bytes moved between neighbouring stages per step (one
            microbatch's activations, whole: the other mesh axes may split them).
    """

    schedule: Schedule
    axis: str
    stage_devices: tuple[tuple[int, ...], ...]
    chosen: bool
    estimates: tuple[choice.MicrobatchOption, ...]
    permute_bytes: int

    def summary(self) -> PipelineSummary:
        """The record the program carries and the report reads back (NOTE [pipeline in
        the report])."""
        schedule = self.schedule
        return PipelineSummary(
            axis=self.axis,
            schedule=schedule.kind,
            layers=schedule.layers,
            stages=schedule.stages,
            microbatches=schedule.microbatches,
            steps=schedule.steps,
            bubble_fraction=schedule.bubble_fraction,
            chosen=self.chosen,
            stage_layers=tuple(
                _ranges(schedule.layers_of(stage)) for stage in range(schedule.stages)
            ),
        )

    def __str__(self) -> str:
        traffic = f"collective-permute {self.permute_bytes:,} bytes per step (expected)"
        return "\n".join(self.summary().lines(self.stage_devices, traffic))

    def chart(self) -> str:
        """The schedule as text: a row per stage, a column per step, each cell the
        microbatch the stage works on (with its visit for circular: ``3b`` is
        microbatch 3 on its second visit) or ``.`` for the bubble."""
        schedule = self.schedule
        width = len(str(schedule.microbatches - 1)) + (1 if schedule.repeats > 1 else 0)
        rows = []
        for stage in range(schedule.stages):
            cells = []
            for step in range(schedule.steps):
                micro, visit, busy = (
                    int(np.asarray(per_stage)[stage]) for per_stage in schedule.at(np.int32(step))
                )
                cell = str(micro) + (chr(ord("a") + visit) if schedule.repeats > 1 else "")
                cells.append((cell if busy else ".").rjust(width))
            rows.append(f"stage {stage} | " + " ".join(cells))
        return "\n".join(rows)


class Pipelined:
    """The function :func:`pipeline` returns."""

    def __init__(
        self, layer: Callable[[Any, Any], Any], axis: str, microbatches: int | None, schedule: str
    ) -> None:
        self.layer, self.axis = layer, axis
        self.microbatches, self.schedule = microbatches, schedule
        functools.update_wrapper(self, layer)  # type: ignore[arg-type]

    def __call__(self, stacked_params: Any, x: Any) -> Any:
        plan = self.plan(stacked_params, x)
        with jax.named_scope(plan.summary().marker()):  # NOTE [pipeline in the report]
            return _program(self.layer, plan.schedule, self.axis, stacked_params, x)

    def plan(self, stacked_params: Any, x: Any) -> PipelinePlan:
        """The stages, microbatches and schedule a call with these arguments runs
        (arrays or ``jax.ShapeDtypeStruct``s), under the mesh in context.

        Raises:
            RuntimeError: no mesh in context.
            ValueError: ``axis`` not in the mesh; parameters without a common
                leading (layer) dimension; layers not divisible by the stages; a
                batch not divisible by ``microbatches``; a layer whose output
                differs from its input in structure, shape or dtype.
        """
        mesh = maybe_current_mesh()
        if mesh is None:
            raise RuntimeError(
                f"{_API}: no mesh in context; call the pipelined function under "
                "`partitioner.mesh(...)` or `jax.set_mesh(...)` (inside a pjit or jit)"
            )
        if self.axis not in mesh.axis_names:
            raise ValueError(
                f"{_API}: axis {self.axis!r} is not an axis of the mesh in context "
                f"{dict(mesh.shape)}"
            )
        stages = int(mesh.shape[self.axis])
        layers = _layers(stacked_params, self.axis, stages)
        batch = _batch(x)
        _check_layer(self.layer, stacked_params, x)
        estimates: tuple[choice.MicrobatchOption, ...] = ()
        count = self.microbatches
        if count is None:
            count, estimates = self._choose(stacked_params, x, layers, stages, batch)
        elif batch % count:
            raise ValueError(
                f"{_API}: the batch (x's leading dimension, {batch}) is not divisible by "
                f"microbatches={count}; use a divisor of {batch}, or microbatches=None"
            )
        return PipelinePlan(
            Schedule(self.schedule, layers, stages, count),
            self.axis,
            stage_devices(mesh, self.axis),
            self.microbatches is None,
            estimates,
            _bytes(x) // count,
        )

    def _choose(
        self, params: Any, x: Any, layers: int, stages: int, batch: int
    ) -> tuple[int, tuple[choice.MicrobatchOption, ...]]:
        one = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), params)
        h_aval = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype), x)
        key = (self.layer, self.schedule, layers, stages, str(jax.tree.structure((one, h_aval))),
               tuple((leaf.shape, str(leaf.dtype))
                     for leaf in jax.tree.leaves((one, h_aval))))  # fmt: skip
        return choice.chosen_for(
            key,
            lambda: choice.choose(
                self.schedule,
                layers,
                stages,
                batch,
                choice.layer_flops(self.layer, one, h_aval),
                float(_bytes(x)),
            ),  # fmt: skip
        )


# --- the checks ---


def _layers(params: Any, axis: str, stages: int) -> int:
    leaves = tree_flatten_with_path(params)[0]
    if not leaves:
        raise ValueError(f"{_API}: stacked_params has no arrays (a layer needs parameters)")
    sizes = {}
    for path, leaf in leaves:
        if np.ndim(leaf) < 1:
            raise ValueError(
                f"{_API}: stacked_params{keystr(path)} is a scalar; every parameter needs a "
                "leading (layer) dimension"
            )
        sizes[f"stacked_params{keystr(path)}"] = np.shape(leaf)[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"{_API}: the parameters' leading (layer) dimensions differ: "
            + ", ".join(f"{name} has {size}" for name, size in sizes.items())
        )
    layers = next(iter(sizes.values()))
    if layers % stages:
        raise ValueError(
            f"{_API}: {layers} layers are not divisible by the {stages} devices of mesh axis "
            f"{axis!r}; use a number of layers that is a multiple of {stages}"
        )
    return int(layers)


def _batch(x: Any) -> int:
    leaves = tree_flatten_with_path(x)[0]
    if not leaves:
        raise ValueError(f"{_API}: x has no arrays")
    sizes = {
        f"x{keystr(path)}": (np.shape(leaf)[0] if np.ndim(leaf) else None) for path, leaf in leaves
    }
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise ValueError(
            f"{_API}: every leaf of x needs the same leading (batch) dimension: "
            + ", ".join(
                f"{name} has shape {np.shape(leaf)}"
                for (name, leaf) in zip(sizes, (leaf for _, leaf in leaves))
            )
        )
    (size,) = set(sizes.values())
    return int(size or 0)


def _check_layer(layer: Callable[..., Any], params: Any, x: Any) -> None:
    one = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], leaf.dtype), params)
    h_aval = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype), x)
    out = jax.eval_shape(layer, one, h_aval)
    if str(jax.tree.structure(out)) != str(jax.tree.structure(h_aval)):
        raise ValueError(
            f"{_API}: the layer returns {jax.tree.structure(out)}, not the structure of its "
            f"input h ({jax.tree.structure(h_aval)}): a stack of layers needs them equal"
        )
    for (path, out_leaf), in_leaf in zip(
        tree_flatten_with_path(out)[0], jax.tree.leaves(h_aval), strict=True
    ):
        if (out_leaf.shape, out_leaf.dtype) != (in_leaf.shape, in_leaf.dtype):
            raise ValueError(
                f"{_API}: the layer's output{keystr(path)} is {out_leaf.dtype}{list(out_leaf.shape)} but its "
                f"input is {in_leaf.dtype}{list(in_leaf.shape)}: a stack of layers needs them equal"
            )


def _bytes(x: Any) -> int:
    return sum(
        int(np.prod(np.shape(leaf))) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(x)
    )


def _ranges(layers: Sequence[int]) -> str:
    if len(layers) > 1 and all(after - before == 1 for before, after in zip(layers, layers[1:])):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers))


# --- the program (NOTE [pipeline]) ---


def _program(layer: Callable[..., Any], schedule: Schedule, axis: str, params: Any, x: Any) -> Any:
    stages, microbatches = schedule.stages, schedule.microbatches
    last_visit = schedule.repeats - 1

    def pinned(array: Any, spec: Callable[[int], PartitionSpec]) -> Any:
        return with_sharding_constraint(array, spec(np.ndim(array)))

    def staged(ndim: int) -> PartitionSpec:
        return PartitionSpec(axis, *[_OPEN] * (ndim - 1))

    # [layers, ...] -> [repeats, stages, per_visit, ...], the stages over the axis.
    stage_params = jax.tree.map(
        lambda leaf: pinned(
            leaf.reshape(schedule.repeats, stages, schedule.per_visit, *leaf.shape[1:]),
            lambda ndim: PartitionSpec(None, axis, *[_OPEN] * (ndim - 2)),
        ),
        params,
    )
    # [batch, ...] -> [microbatches, batch / microbatches, ...]: microbatch k takes every
    # m-th example, so each device's block of a batch split over other axes stays local.
    inputs = jax.tree.map(
        lambda leaf: jnp.swapaxes(leaf.reshape(-1, microbatches, *leaf.shape[1:]), 0, 1), x
    )

    def visit(visit_params: Any, h: Any) -> Any:  # one stage's layers of one visit
        if schedule.per_visit == 1:  # circular: one layer, no loop of one step to compile
            return layer(jax.tree.map(lambda leaf: leaf[0], visit_params), h)
        return jax.lax.scan(lambda carry, one: (layer(one, carry), None), h, visit_params)[0]

    def per_stage(
        stage: Any, own_params: Any, h: Any, out: Any, micro: Any, repeat: Any, busy: Any
    ) -> Any:
        micro_at = jnp.clip(micro, 0, microbatches - 1)
        repeat_at = jnp.clip(repeat, 0, last_visit)
        fresh = (stage == 0) & (repeat == 0)
        h = jax.tree.map(lambda held, given: jnp.where(fresh, given[micro_at], held), h, inputs)
        new = visit(jax.tree.map(lambda leaf: leaf[repeat_at], own_params), h)
        done = busy & (stage == stages - 1) & (repeat == last_visit)
        out = jax.tree.map(
            lambda buffer, value: buffer.at[micro_at].set(jnp.where(done, value, buffer[micro_at])),
            out,
            new,
        )
        return new, out

    stage_map = jax.vmap(per_stage, in_axes=(0, 1, 0, 0, 0, 0, 0), spmd_axis_name=axis)

    def step(carry: Any, t: Any) -> Any:
        state, out = carry
        micro, repeat, busy = schedule.at(t)
        shifted = jax.tree.map(lambda leaf: jnp.roll(leaf, 1, axis=0), state)  # next stage
        new, out = stage_map(jnp.arange(stages), stage_params, shifted, out, micro, repeat, busy)
        return (jax.tree.map(lambda leaf: pinned(leaf, staged), new),
                jax.tree.map(lambda leaf: pinned(leaf, staged), out)), None  # fmt: skip

    # Bubble slots compute on whatever the stage holds; start them on a real microbatch,
    # not zeros, so that a layer undefined at zero (a norm without an epsilon) cannot put
    # a NaN into the gradients through a slot whose result is never read.
    state0 = jax.tree.map(
        lambda leaf: pinned(jnp.broadcast_to(leaf[0], (stages, *leaf.shape[1:])), staged), inputs
    )
    out0 = jax.tree.map(
        lambda leaf: pinned(jnp.zeros((stages, *leaf.shape), leaf.dtype), staged), inputs
    )
    (_, out), _ = jax.lax.scan(step, (state0, out0), jnp.arange(schedule.steps))
    return jax.tree.map(
        lambda buffer, leaf: jnp.swapaxes(buffer[stages - 1], 0, 1).reshape(leaf.shape), out, x
    )
