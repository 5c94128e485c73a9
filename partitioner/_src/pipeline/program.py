"""The pipeline as one SPMD program: the loop over steps, the stages, the shards.

NOTE [pipeline]: the pipeline is one SPMD program, partitioned by XLA like any
other: no manual region, no second controller. The parameters arrive staged,
``[stages, repeats, per_visit, ...]`` (``staged.py``), laid out with the stage
dimension over the axis, so each device holds its stage's layers; before the loop
each stage's weights are copied once per shard of its batch (NOTE [pipeline
gradients] in ``shards.py``). The activations in flight are one array
``[stages, shards, microbatch / shards, ...]`` laid out the same way; each step every
stage applies its layers to its slot (a ``vmap`` over the stage dimension with
``spmd_axis_name=axis``, and inside it one over the shards with the batch axes), then
the array is rolled by one along the stage dimension, which XLA's partitioner turns
into a collective-permute between neighbours. Stage 0 takes a fresh microbatch where
its schedule says so; the last stage's results are kept in its own slot of the output
buffer (no traffic per step) and leave it once at the end. Bubble slots compute on
values that are never read (real activations: the stages start on the first
microbatch, so a layer undefined at zero puts no NaN into the gradients), so values
and gradients are the plain scan's (``jax.grad``, ``jax.vmap`` and ``jax.checkpoint``
go through ordinary jax operations).

NOTE [pipeline residuals]: what the forward loop saves for the backward pass is per
step, so it grows with the step count; it must be activations only. gpipe's stage
applies the same weights at every step: they are read outside the loop's steps
(loop-invariant, saved once). A circular stage picks the weights of its visit at
every step, and the backward pass of the layer's matmuls needs them, so the pick and
the layer run under ``jax.checkpoint`` with a policy that never saves the picked
weights (recomputed from the stage's copy, which is loop-invariant, and the visit's
index). :class:`Saves` says what else a step keeps: what the backward pass needs
(``ACTIVATIONS``), or each visit's input alone, the rest recomputed (``INPUTS``, as
MaxText and praxis do by default). A user's ``jax.checkpoint`` on the layer keeps its
own policy inside either.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..primitives.constraint import with_sharding_constraint
from ..primitives.shift import shift
from .schedule import Schedule
from .shards import ShardLayer, per_shard

_OPEN = PartitionSpec.UNCONSTRAINED


class Saves(enum.StrEnum):
    """What each step of the forward loop keeps for the backward pass (NOTE [pipeline
    residuals])."""

    ACTIVATIONS = "activations"  # what the backward pass reads, never the weights
    INPUTS = "inputs"  # each visit's input; the rest recomputed in the backward pass


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a pipeline runs: its mesh, the stages' axis, the axes each stage's
    microbatch is split over (its ``shards``, NOTE [pipeline gradients]), and those its
    layer's column-split matmuls are constrained over (``tensor``: an AUTO call's
    weights' axes, NOTE [tensor parallel in the stages])."""

    mesh: Mesh
    axis: str
    batch: tuple[str, ...]
    shards: int
    tensor: tuple[str, ...] = ()

    def pin(self, array: Any, *, stage_dim: bool = True, skip: int = 0) -> Any:
        """``array`` ``[stages?, <skip dims>, shards, ...]`` laid out so: the stages over
        the axis, the shards over the batch axes, the rest left to XLA."""
        lead = [self.axis] if stage_dim else []
        rest = array.ndim - len(lead) - skip - 1
        spec = PartitionSpec(*lead, *[None] * skip, self.batch or None, *[_OPEN] * rest)
        return with_sharding_constraint(array, NamedSharding(self.mesh, spec))

    def pin_stages(self, array: Any) -> Any:
        """``array`` ``[stages, ...]`` laid out with its stages over the axis."""
        spec = PartitionSpec(self.axis, *[_OPEN] * (array.ndim - 1))
        return with_sharding_constraint(array, NamedSharding(self.mesh, spec))


def plain_scan(layer: Callable[[Any, Any], Any], stacked: Any, x: Any) -> Any:
    """What a pipeline computes: ``layer`` applied to ``x`` once per layer of
    ``stacked`` (every leaf ``[layers, ...]``), in order, as a ``lax.scan``."""
    return jax.lax.scan(lambda h, one: (layer(one, h), None), x, stacked)[0]


def run(
    layer: Callable[..., Any],
    schedule: Schedule,
    placement: Placement,
    saves: Saves,
    staged: Any,
    x: Any,
) -> Any:
    """The value of the plain scan of ``layer`` over the staged layers, on ``x``
    (NOTE [pipeline])."""
    stages, count = schedule.stages, schedule.microbatches
    inputs = jax.tree.map(lambda leaf: microbatches_of(leaf, count, placement), x)
    layers = jax.tree.map(lambda leaf: _layers(leaf, schedule, placement), staged)
    one_layer = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[2:], leaf.dtype), layers)
    one_shard = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[2:], leaf.dtype), inputs)
    tensor = (placement.mesh, placement.tensor) if placement.tensor else None
    shard_layer = per_shard(layer, placement.batch, one_layer, one_shard, tensor)
    prepared = jax.vmap(jax.vmap(shard_layer.prepare))(layers)
    copies = [_copies(leaf, placement) for leaf in prepared]
    visit = _visit(shard_layer, schedule, placement, saves, copies)

    def per_stage(
        stage: Any, own: Any, h: Any, out: Any, micro: Any, repeat: Any, busy: Any
    ) -> Any:
        micro_at = jnp.clip(micro, 0, count - 1)
        fresh = (stage == 0) & (repeat == 0)
        # A scalar predicate (lax.select_n), not a mask of the activations' shape: what
        # the backward pass keeps of the choice is one bool per step.
        h = jax.tree.map(
            lambda held, given: jax.lax.select_n(fresh, held, given[micro_at]), h, inputs
        )
        new = visit(own, jnp.clip(repeat, 0, schedule.repeats - 1), h)
        done = busy & (stage == stages - 1) & (repeat == schedule.repeats - 1)
        out = jax.tree.map(
            lambda buffer, value: buffer.at[micro_at].set(
                jax.lax.select_n(done, buffer[micro_at], value)
            ),
            out,
            new,
        )
        return new, out

    stage_map = jax.vmap(per_stage, spmd_axis_name=placement.axis)

    def in_flight(leaf: Any) -> Any:  # [stages, shards, microbatch / shards, ...]
        return placement.pin(leaf)

    def outputs(leaf: Any) -> Any:  # [stages, microbatches, shards, ...]
        return placement.pin(leaf, skip=1)

    def step(carry: Any, t: Any) -> Any:
        state, out = carry
        micro, repeat, busy = schedule.at(t)
        # to the next stage: one permute, and one back in the backward pass (``shift``)
        shifted = jax.tree.map(lambda leaf: shift(leaf, by=1, axis=0), state)
        new, out = stage_map(jnp.arange(stages), copies, shifted, out, micro, repeat, busy)
        return (jax.tree.map(in_flight, new), jax.tree.map(outputs, out)), None

    # Bubble slots compute on whatever the stage holds; start them on a real microbatch,
    # not zeros, so that a layer undefined at zero (a norm without an epsilon) cannot put
    # a NaN into the gradients through a slot whose result is never read.
    state0 = jax.tree.map(
        lambda leaf: in_flight(jnp.broadcast_to(leaf[0], (stages, *leaf.shape[1:]))), inputs
    )
    # The output buffer starts as copies of the microbatches (overwritten before it is
    # read): any dtype, a typed PRNG key's too, where zeros would need a numeric one.
    out0 = jax.tree.map(lambda leaf: outputs(jnp.broadcast_to(leaf, (stages, *leaf.shape))), inputs)
    (_, out), _ = jax.lax.scan(step, (state0, out0), jnp.arange(schedule.steps))
    return jax.tree.map(lambda buffer, leaf: _whole(_last_stages(buffer), leaf), out, x)


def _layers(leaf: Any, schedule: Schedule, placement: Placement) -> Any:
    """A staged leaf ``[stages, repeats, per_visit, ...]`` as each stage's layers, the
    one index that varies: ``[stages, per_visit, ...]`` for gpipe (one visit),
    ``[stages, repeats, ...]`` for circular (one layer a visit)."""
    leaf = placement.pin_stages(leaf)
    return leaf[:, 0] if schedule.repeats == 1 else leaf[:, :, 0]


def _copies(leaf: Any, placement: Placement) -> Any:
    """A prepared leaf ``[stages, layers, ...]`` as each shard's copy of it:
    ``[stages, shards, layers, ...]`` (NOTE [pipeline gradients] in ``shards.py``)."""
    stages, shards = leaf.shape[0], placement.shards
    copies = jnp.broadcast_to(leaf[:, None], (stages, shards, *leaf.shape[1:]))
    return placement.pin(copies)


def microbatches_of(leaf: Any, count: int, placement: Placement) -> Any:
    """``[batch, ...]`` as ``[microbatches, shards, microbatch / shards, ...]``:
    microbatch k takes every ``count``-th example, so each device's block of a batch
    split over the batch axes stays on it."""
    micro = jnp.swapaxes(leaf.reshape(-1, count, *leaf.shape[1:]), 0, 1)
    split = micro.reshape(count, placement.shards, -1, *micro.shape[2:])
    return placement.pin(split, stage_dim=False, skip=1)


def _last_stages(buffer: Any) -> Any:
    """The last stage's slot of ``buffer`` ``[stages, ...]``, on every device. For numbers, a
    sum over the stages of the buffer with every other slot zeroed, which XLA partitions
    as one all-reduce over the stage axis (and its transpose as none: each stage takes its
    own slot of the cotangent), where picking the slot moves it twice, and once more back;
    other values (typed PRNG keys, booleans), which do not sum, are picked."""
    if not jnp.issubdtype(buffer.dtype, jnp.number):
        return buffer[buffer.shape[0] - 1]
    last = (jnp.arange(buffer.shape[0]) == buffer.shape[0] - 1).reshape(
        -1, *[1] * (buffer.ndim - 1)
    )
    return jnp.sum(jnp.where(last, buffer, jnp.zeros_like(buffer)), axis=0)


def _whole(buffer: Any, leaf: Any) -> Any:
    """The last stage's outputs ``[microbatches, shards, microbatch / shards, ...]`` as
    the batch ``[batch, ...]`` they came from."""
    joined = buffer.reshape(buffer.shape[0], -1, *buffer.shape[3:])
    return jnp.swapaxes(joined, 0, 1).reshape(leaf.shape)


def _visit(
    shard_layer: ShardLayer,
    schedule: Schedule,
    placement: Placement,
    saves: Saves,
    copies: list[Any],
) -> Callable[[Any, Any, Any], Any]:
    """``visit(own, repeat, h)``: one stage's visit, on each of its shards with the
    shard's copy of the prepared weights (``own``: ``[shards, layers, ...]`` each;
    ``h``: ``[shards, ...]``)."""
    if schedule.repeats == 1:  # gpipe: the stage's layers, in a loop over them

        def layers_of(own: list[Any], repeat: Any, h: Any) -> Any:
            del repeat
            if schedule.per_visit == 1:
                return shard_layer.apply([leaf[0] for leaf in own], h)
            return jax.lax.scan(lambda carry, one: (shard_layer.apply(one, carry), None), h, own)[0]

    else:  # circular: the layer of this visit

        def layers_of(own: list[Any], repeat: Any, h: Any) -> Any:
            return shard_layer.apply([leaf[repeat] for leaf in own], h)

    picked = {tuple(leaf.shape[2:]) for leaf in copies}
    policy = _policy(saves, picked if schedule.repeats > 1 else set())
    if policy is not None:
        layers_of = jax.checkpoint(layers_of, policy=policy)
    return jax.vmap(layers_of, in_axes=(0, None, 0), spmd_axis_name=placement.batch or None)


def _policy(saves: Saves, stacks: set[tuple[int, ...]]) -> Callable[..., Any] | None:
    """The ``jax.checkpoint`` policy of a visit (NOTE [pipeline residuals]): ``None``
    where it saves what the backward pass reads and no weights are picked per step."""
    if saves is Saves.INPUTS:
        return jax.checkpoint_policies.nothing_saveable
    if not stacks:
        return None

    picked = {(1, *stack[1:]) for stack in stacks}

    def not_the_weights(prim: Any, *avals: Any, **params: Any) -> bool:
        """Saveable unless it picks a visit's weights out of a stage's copy: a gather or
        dynamic slice of an operand that ends with one of the copies' shapes, or the
        squeeze of what it picked."""
        shape = tuple(getattr(avals[0], "shape", ())) if avals else ()
        if prim.name in ("gather", "dynamic_slice"):
            return not any(shape[len(shape) - len(s) :] == s for s in stacks)
        if prim.name in ("squeeze", "reshape"):
            return not any(shape[len(shape) - len(s) :] == s for s in picked)
        return True

    return not_the_weights
