"""The checks of a pipelined call's arguments, each with a message that says the fix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from .. import jax_private as jp
from .schedule import ScheduleKind

API = "partitioner.pipeline"

MSG_NEEDS_LOSS = """\
{api}: schedule={schedule!r} runs each microbatch's backward in the pipeline, so the \
pipeline must end in the loss: give loss=head, head(head_params, h, targets) -> one \
microbatch's mean loss, and call run(params, x, head_params, targets):

    run = partitioner.pipeline(layer, axis="stage", schedule={schedule!r}, loss=head)
    value, grads = jax.value_and_grad(run)(params, x, head_params, targets)

or use schedule="gpipe" / "circular", whose output jax differentiates."""

MSG_HEAD_NOT_SCALAR = """\
{api}: loss=head must return one microbatch's mean loss, a scalar; \
head(head_params, h, targets) returns {got}. Average it, e.g.

    def head(head_params, h, targets):
        return jnp.mean((h @ head_params["w"] - targets) ** 2)"""


def layer_count(params: Any) -> int:
    """The layers of a stack (every leaf's leading dimension).

    Raises:
        ValueError: no arrays, a scalar leaf, or leading dimensions that differ.
    """
    leaves = tree_flatten_with_path(params)[0]
    if not leaves:
        raise ValueError(f"{API}: stacked_params has no arrays (a layer needs parameters)")
    sizes = {}
    for path, leaf in leaves:
        if np.ndim(leaf) < 1:
            raise ValueError(
                f"{API}: stacked_params{keystr(path)} is a scalar; every parameter needs a "
                "leading (layer) dimension"
            )
        sizes[f"stacked_params{keystr(path)}"] = np.shape(leaf)[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"{API}: the parameters' leading (layer) dimensions differ: "
            + ", ".join(f"{name} has {size}" for name, size in sizes.items())
        )
    return int(next(iter(sizes.values())))


def pipelined(layers: int, stages: int, axis: str) -> int:
    """The layers the stages run: the largest multiple of ``stages`` up to ``layers``
    (the others run after them, outside the stages).

    Raises:
        ValueError: fewer layers than stages.
    """
    if layers < stages:
        raise ValueError(
            f"{API}: {layers} layers cannot fill the {stages} stages of mesh axis {axis!r}; "
            f"give at least {stages} layers, or pipeline over a smaller axis"
        )
    return layers - layers % stages


def batch_size(x: Any) -> int:
    """The batch: every leaf's leading dimension.

    Raises:
        ValueError: no arrays, or leaves without one common leading dimension.
    """
    leaves = tree_flatten_with_path(x)[0]
    if not leaves:
        raise ValueError(f"{API}: x has no arrays")
    sizes = {
        f"x{keystr(path)}": (np.shape(leaf)[0] if np.ndim(leaf) else None) for path, leaf in leaves
    }
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise ValueError(
            f"{API}: every leaf of x needs the same leading (batch) dimension: "
            + ", ".join(
                f"{name} has shape {np.shape(leaf)}"
                for (name, leaf) in zip(sizes, (leaf for _, leaf in leaves), strict=True)
            )
        )
    (size,) = set(sizes.values())
    return int(size or 0)


def microbatch_count(count: int, batch: int) -> None:
    """Raises ValueError unless ``count`` divides ``batch``."""
    if batch % count:
        raise ValueError(
            f"{API}: the batch (x's leading dimension, {batch}) is not divisible by "
            f"microbatches={count}; use a divisor of {batch}, or microbatches=None"
        )


def layer_keeps_its_input(layer: Callable[..., Any], one_layer: Any, h_aval: Any) -> None:
    """Raises ValueError unless ``layer`` returns its input's structure, shapes and dtypes."""
    out = jax.eval_shape(layer, one_layer, h_aval)
    if str(jax.tree.structure(out)) != str(jax.tree.structure(h_aval)):
        raise ValueError(
            f"{API}: the layer returns {jax.tree.structure(out)}, not the structure of its "
            f"input h ({jax.tree.structure(h_aval)}): a stack of layers needs them equal"
        )
    for (path, out_leaf), in_leaf in zip(
        tree_flatten_with_path(out)[0], jax.tree.leaves(h_aval), strict=True
    ):
        if (out_leaf.shape, out_leaf.dtype) != (in_leaf.shape, in_leaf.dtype):
            raise ValueError(
                f"{API}: the layer's output{keystr(path)} is "
                f"{out_leaf.dtype}{list(out_leaf.shape)} but its input is "
                f"{in_leaf.dtype}{list(in_leaf.shape)}: a stack of layers needs them equal"
            )


def needs_loss(kind: ScheduleKind | None, loss: Callable[..., Any] | None) -> None:
    """Raises ValueError for a schedule that runs by actions without a loss head."""
    if kind is not None and kind.by_actions and loss is None:
        raise ValueError(MSG_NEEDS_LOSS.format(api=API, schedule=kind.value))


def call_arguments(loss: Callable[..., Any] | None, head: Sequence[Any]) -> None:
    """Raises TypeError unless a pipeline with ``loss=`` gets ``head_params, targets``
    after ``params, x`` and one without gets neither."""
    if loss is None and head:
        raise TypeError(
            f"{API}: this pipeline has no loss=, so it is called run(params, x) and returns "
            f"the last layer's output; got {2 + len(head)} arguments. Give loss=head to "
            "call it run(params, x, head_params, targets)"
        )
    if loss is not None and len(head) != 2:
        raise TypeError(
            f"{API}: a pipeline with loss= is called run(params, x, head_params, targets) "
            f"and returns the batch's mean loss; got {2 + len(head)} arguments"
        )


def runs(kind: ScheduleKind, count: int, stages: int) -> bool:
    """Whether ``kind`` runs ``count`` microbatches on ``stages`` stages (see
    :func:`enough_microbatches`)."""
    if not kind.by_actions:
        return True
    if kind is ScheduleKind.INTERLEAVED:
        return count % stages == 0 and stages % 2 == 0
    return count >= stages


def enough_microbatches(kind: ScheduleKind, count: int, stages: int, axis: str) -> None:
    """Raises ValueError unless ``kind`` runs ``count`` microbatches on ``stages``
    stages: 1F1B and zero bubble need at least one per stage (else they are gpipe with
    extra steps); interleaved 1F1B whole groups of ``stages`` microbatches (its order
    goes through every visit a group at a time) and an even stage count (its rounds
    pair the stages round a ring)."""
    if runs(kind, count, stages):
        return
    if kind is ScheduleKind.INTERLEAVED and stages % 2:
        raise ValueError(
            f"{API}: schedule='interleaved-1f1b' pairs neighbouring stages round a ring, "
            f"which needs an even stage count; mesh axis {axis!r} has {stages}. Pipeline "
            "over an axis of even size, or use schedule='1f1b' or 'circular'"
        )
    need = "a multiple of" if kind is ScheduleKind.INTERLEAVED else "at least"
    raise ValueError(
        f"{API}: schedule={kind.value!r} needs {need} one microbatch per stage: "
        f"{stages} stages over {axis!r}, microbatches={count}. Give microbatches={stages} "
        f"or more{' (a multiple of it)' if need != 'at least' else ''}, or "
        "microbatches=None to let partitioner choose"
    )


def targets_batch(targets: Any, batch: int, count: int | None) -> None:
    """Raises ValueError unless every leaf of ``targets`` has ``x``'s batch as its
    leading dimension (which the microbatches then divide)."""
    for path, leaf in tree_flatten_with_path(targets)[0]:
        size = np.shape(leaf)[0] if np.ndim(leaf) else None
        if size != batch:
            raise ValueError(
                f"{API}: targets{keystr(path)} has shape {np.shape(leaf)}: its leading "
                f"(batch) dimension must be x's, {batch}"
                + (f", which microbatches={count} divides" if count else "")
                + "; give one target row per example"
            )


def head_gives_a_scalar(
    head: Callable[..., Any], head_params: Any, h_aval: Any, targets: Any, count: int
) -> None:
    """Raises ValueError unless ``head`` returns a scalar on one microbatch."""

    def piece(leaf: Any) -> Any:
        shape = np.shape(leaf)
        return jax.ShapeDtypeStruct((shape[0] // count, *shape[1:]), leaf.dtype)

    out = jax.eval_shape(
        head, head_params, jax.tree.map(piece, h_aval), jax.tree.map(piece, targets)
    )
    leaves = jax.tree.leaves(out)
    if (
        len(leaves) != 1
        or leaves[0].shape != ()
        or not jax.tree_util.treedef_is_leaf(jax.tree.structure(out))
    ):
        got = jax.tree.map(lambda a: f"{a.dtype}{list(a.shape)}", out)
        raise ValueError(MSG_HEAD_NOT_SCALAR.format(api=API, got=got))


def gspmd_runs(kind: ScheduleKind, mesh: Any, axis: str, batch: Sequence[str]) -> None:
    """Raises ValueError for a schedule that runs by actions where GSPMD cannot partition
    its regions (NOTE [pipeline by actions]), Shardy can: axes left to XLA inside the
    stages (a layer's tensor parallelism), whose branches GSPMD does not partition, or
    more than one batch axis (regions nested three deep)."""
    if jp.jax_uses_shardy():
        return
    free = [a for a in mesh.axis_names if a != axis and a not in batch and mesh.shape[a] > 1]
    if free:
        why = (
            f"leaving {free} to XLA's partitioner inside it, which GSPMD cannot do for the "
            "stages' branches"
        )
    elif len(batch) > 1:
        why = "one region nested in another for each, which GSPMD cannot partition"
    else:
        return
    raise ValueError(
        f"{API}: schedule={kind.value!r} runs each stage's own actions in a region "
        f"manual over {axis!r} and the batch axes {tuple(batch)}, {why}. Use the Shardy "
        "partitioner (jax's default; partitioner.spmd_partitioner('shardy')), or "
        "schedule='gpipe' / 'circular'"
    )


def one_dtype(kind: ScheduleKind, x: Any) -> None:
    """Raises TypeError unless ``x``'s leaves share one floating dtype, which a schedule
    that runs by actions needs (the values a stage keeps sit in one pool per dtype, and
    its gradients flow back through ``x``'s leaves)."""
    dtypes = {jax.numpy.dtype(leaf.dtype) for leaf in jax.tree.leaves(x)}
    if len(dtypes) != 1 or not jax.numpy.issubdtype(next(iter(dtypes)), jax.numpy.floating):
        raise TypeError(
            f"{API}: schedule={kind.value!r} needs x's leaves to share one floating dtype; "
            f"they are {sorted(map(str, dtypes))}. Cast them to one (x.astype(jnp.float32)), or use "
            "schedule='gpipe' / 'circular'"
        )
