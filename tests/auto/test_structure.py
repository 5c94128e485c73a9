"""Ties between AUTO leaves (NOTE [auto repeats], ``auto/search/structure.py``): pure functions
of key paths and traced programs, tested on their own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey, tree_flatten_with_path

from partitioner._src.auto.cost.equations import Structures
from partitioner._src.auto.search.structure import family, layer_keys, tie


def test_a_family_is_the_path_with_the_layer_left_out() -> None:
    assert family((SequenceKey(0), SequenceKey(3), DictKey("wq"))) == "[0][#]['wq']"
    assert family((SequenceKey(0), DictKey("Block_12"), DictKey("kernel"))) == (
        "[0]['Block_#']['kernel']"
    )
    # a role is not a layer: w1 and w2, ln1 and ln2 keep their names
    assert family((SequenceKey(0), DictKey("w1"))) != family((SequenceKey(0), DictKey("w2")))
    # the argument's position is kept: two positional arguments never tie
    assert family((SequenceKey(0), DictKey("w"))) != family((SequenceKey(1), DictKey("w")))
    assert family((SequenceKey(0), GetAttrKey("layers_4"))) == "[0].layers_#"


def test_a_path_offers_each_key_that_may_name_a_layer() -> None:
    assert layer_keys((SequenceKey(0), SequenceKey(3), DictKey("wq"))) == [(1, "[0][#]", "[0][3]")]
    flax = (SequenceKey(0), DictKey("params"), DictKey("Block_2"), DictKey("Dense_0"))
    assert layer_keys(flax) == [
        (2, "[0]['params']['Block_#']", "[0]['params']['Block_2']"),
        (3, "[0]['params']['Block_2']['Dense_#']", "[0]['params']['Block_2']['Dense_0']"),
    ]
    assert layer_keys((SequenceKey(1), GetAttrKey("layers_4"))) == [
        (1, "[1].layers_#", "[1].layers_4")
    ]
    assert layer_keys((SequenceKey(0), DictKey("ln1"), DictKey("scale"))) == []


def _groups(f, *args) -> list[list[str]]:
    closed = jax.make_jaxpr(f)(*args)
    paths = [p for p, _ in tree_flatten_with_path(args)[0]]
    families = [family(p) for p in paths]
    names = [jax.tree_util.keystr(p) for p in paths]
    found = tie(closed, list(range(len(paths))), families, Structures())
    return [[names[i] for i in group] for group in found]


def test_the_middle_layers_of_a_deep_stack_share_one_variable() -> None:
    layers = [np.ones((16, 16), np.float32) * (i + 1) for i in range(8)]

    def stack(layers, x):
        for w in layers:
            x = jnp.tanh(x @ w)
        return x.sum()

    groups = _groups(stack, layers, np.ones((4, 16), np.float32))
    by_layer = {name: k for k, group in enumerate(groups) for name in group}
    middle = {by_layer[f"[0][{i}]"] for i in range(2, 6)}
    assert len(middle) == 1  # the layers away from the ends play the same part
    assert by_layer["[1]"] not in middle  # the batch is its own variable
    assert len(groups) < 8  # a deep stack costs fewer variables than its depth


def test_two_weights_of_one_shape_in_different_roles_stay_apart() -> None:
    """A 2-layer MLP written as a list of two same-shape weights: the first is
    column-split, the second row-split at their best, so they must not be tied."""

    def mlp(ws, x):
        return (jnp.tanh(x @ ws[0]) @ ws[1]).sum()

    w = np.ones((16, 16), np.float32)
    groups = _groups(mlp, [w, w], np.ones((4, 16), np.float32))
    assert ["[0][0]"] in groups and ["[0][1]"] in groups
