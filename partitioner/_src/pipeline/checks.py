"""The checks of a pipelined call's arguments, each with a message that says the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

API = "partitioner.pipeline"


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
