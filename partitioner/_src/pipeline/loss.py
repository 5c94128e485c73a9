"""A pipeline whose output is the loss: ``run(params, x, head_params, targets)``.

NOTE [pipeline loss]: with ``loss=head``, ``head(head_params, h, targets)`` is one
microbatch's mean loss and the pipeline returns the batch's: the mean over the
microbatches (each microbatch takes every ``M``-th example, as NOTE [pipeline] cuts
the batch), which is the plain scan followed by the head for any head that averages
its examples' losses.

- gpipe and circular run their forward loop (NOTE [pipeline]), then the head on each
  microbatch of its output; jax differentiates the whole (the loop's transpose is
  their backward).
- 1F1B, interleaved 1F1B and zero bubble run by actions (NOTE [pipeline by actions]):
  the loss's cotangent is a scalar, so the program computes every gradient as it goes,
  each microbatch's backward in the round its schedule gives it. The call is a
  ``jax.custom_vjp`` whose forward rule runs that program and keeps the gradients of
  the parameters, the head's parameters, ``x`` and ``targets`` (only those the caller
  differentiates: ``symbolic_zeros``), and whose backward rule scales them by the
  cotangent. Without a gradient asked, the primal is the forward loop of the schedule
  that holds the layers the same way (gpipe's or circular's) and the head. The head
  runs on each shard of a microbatch on its own device, so it too must treat each
  example on its own; the layers the stages do not divide run inside it, after the
  stages (their parameters are the head's, to the program).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import action_program as ap
from . import checks
from .passes import passes
from .program import Placement, Saves, microbatches_of
from .program import run as run_program
from .schedule import Schedule, ScheduleKind
from .shards import per_shard


def head_mean(
    head: Callable[..., Any], head_params: Any, out: Any, targets: Any, count: int
) -> Any:
    """The batch's mean loss: ``head`` on each of the ``count`` microbatches of ``out``
    and ``targets``, averaged (NOTE [pipeline loss])."""

    def micro(leaf: Any) -> Any:  # [batch, ...] -> [count, batch / count, ...], as NOTE [pipeline]
        return jnp.swapaxes(leaf.reshape(-1, count, *leaf.shape[1:]), 0, 1)

    each = jax.vmap(head, in_axes=(None, 0, 0))(
        head_params, jax.tree.map(micro, out), jax.tree.map(micro, targets)
    )
    return jnp.mean(each)


def by_actions(
    layer: Callable[..., Any],
    head: Callable[..., Any],
    schedule: Schedule,
    placement: Placement,
    saves: Saves,
    staged: Any,
    x: Any,
    head_params: Any,
    targets: Any,
) -> Any:
    """The batch's mean loss of a schedule that runs by actions (NOTE [pipeline loss]);
    ``staged``: every leaf ``[stages, visits, layers a visit, ...]``."""
    count = schedule.microbatches
    layout = Schedule(schedule.kind.layout, schedule.layers, schedule.stages, count)

    @jax.custom_vjp
    def call(staged: Any, x: Any, head_params: Any, targets: Any) -> Any:
        out = run_program(layer, layout, placement, saves, staged, x)
        return head_mean(head, head_params, out, targets, count)

    def forward(staged: Any, x: Any, head_params: Any, targets: Any) -> Any:
        wanted = jax.tree.map(lambda leaf: leaf.perturbed, (x, head_params, targets))
        staged, x, head_params, targets = jax.tree.map(
            lambda leaf: leaf.value, (staged, x, head_params, targets)
        )
        wants = ap.Wants(
            head=any(jax.tree.leaves(wanted[1])),
            x=any(jax.tree.leaves(wanted[0])),
            targets=any(jax.tree.leaves(wanted[2])),
        )
        loss, grads = _gradients(
            layer, head, schedule, placement, saves, wants, staged, x, head_params, targets
        )
        return loss, grads

    def backward(grads: Any, ct: Any) -> tuple[Any, ...]:
        if isinstance(ct, SymbolicZero):
            ct = jnp.zeros(ct.shape, ct.dtype)
        return tuple(
            None if g is None else jax.tree.map(lambda leaf: (ct * leaf).astype(leaf.dtype), g)
            for g in grads
        )

    call.defvjp(forward, backward, symbolic_zeros=True)
    return call(staged, x, head_params, targets)


def _gradients(
    layer: Callable[..., Any],
    head: Callable[..., Any],
    schedule: Schedule,
    placement: Placement,
    saves: Saves,
    wants: ap.Wants,
    staged: Any,
    x: Any,
    head_params: Any,
    targets: Any,
) -> tuple[Any, tuple[Any, ...]]:
    """The loss and the gradients of ``staged``, ``x``, ``head_params`` and ``targets``
    (None where not wanted), by the action program (NOTE [pipeline by actions])."""
    count, batch = schedule.microbatches, placement.batch
    checks.gspmd_runs(schedule.kind, placement.mesh, placement.axis, batch)
    sizes = tuple(int(placement.mesh.shape[a]) for a in batch)
    inputs = jax.tree.map(lambda leaf: microbatches_of(leaf, count, placement), x)
    wanted = jax.tree.map(lambda leaf: microbatches_of(leaf, count, placement), targets)
    one_layer = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[3:], leaf.dtype), staged)
    one_shard = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[2:], leaf.dtype), inputs)
    shard_layer = per_shard(layer, batch, one_layer, one_shard)
    per_visit = schedule.per_visit

    def prepare(staged: Any) -> list[Any]:
        """Each layer of a visit's prepared weights apart, ``[stages, visits, ...]``
        each (layer-major): a visit's layers are then read whole, never sliced."""
        prepared = jax.vmap(jax.vmap(jax.vmap(shard_layer.prepare)))(staged)
        return [leaf[:, :, j] for j in range(per_visit) for leaf in prepared]

    own, prepared_pullback = jax.vjp(prepare, staged)
    n_leaves = len(own) // per_visit

    def visit(weights: Any, h: Any) -> Any:
        for j in range(per_visit):
            h = shard_layer.apply(weights[j * n_leaves : (j + 1) * n_leaves], h)
        return h

    own_avals = [jax.ShapeDtypeStruct(leaf.shape[2:], leaf.dtype) for leaf in own]
    pieces = passes(visit, own_avals, one_shard)
    split = schedule.kind is ScheduleKind.ZERO_BUBBLE
    values, shapes = ap.values_of(pieces, saves, jax.tree.leaves(one_shard), split)
    program = ap.ActionProgram(
        passes=pieces,
        rounds=schedule.rounds_of(values),
        values=values,
        shapes=shapes,
        head=head,
        saves=saves,
        mesh=placement.mesh,
        axis=placement.axis,
        batch=batch,
        microbatches=count,
        visits=schedule.repeats,
    )

    def regions(leaf: Any) -> Any:  # [M, shards, shard, ...] -> [M, *sizes, shard, ...]
        return leaf.reshape(count, *sizes, *leaf.shape[2:])

    loss, d_own, d_hp, d_x, d_t = ap.run(
        program,
        wants,
        own,
        [regions(leaf) for leaf in jax.tree.leaves(inputs)],
        jax.tree.leaves(head_params),
        [regions(leaf) for leaf in jax.tree.leaves(wanted)],
        jax.tree.structure(head_params),
        jax.tree.structure(one_shard),
        jax.tree.structure(targets),
    )
    (d_staged,) = prepared_pullback(d_own)
    # the loss in the head's dtype, as the primal (and the plain scan's head) gives it
    shard_targets = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape[2:], leaf.dtype), wanted
    )
    loss = loss.astype(jax.eval_shape(head, head_params, one_shard, shard_targets).dtype)

    def whole(leaves: list[Any], like: Any) -> Any:
        return jax.tree.unflatten(
            jax.tree.structure(like),
            [_batch_of(g, leaf) for g, leaf in zip(leaves, jax.tree.leaves(like), strict=True)],
        )

    return loss, (
        d_staged,
        whole(d_x, x) if wants.x else None,
        jax.tree.unflatten(jax.tree.structure(head_params), d_hp) if wants.head else None,
        whole(d_t, targets) if wants.targets else None,
    )


def _batch_of(grad: Any, like: Any) -> Any:
    """A microbatched gradient ``[M, *sizes, shard, ...]`` as the batch ``[batch, ...]``
    it came from (NOTE [pipeline]: microbatch ``k`` is every ``M``-th example)."""
    count = grad.shape[0]
    joined = grad.reshape(count, -1, *like.shape[1:])
    return jnp.swapaxes(joined, 0, 1).reshape(like.shape).astype(like.dtype)
