"""The pmap planner's pure pieces: options (``pmap_info.py``), axes per leaf and the
axis size (``pmap_plan.py``), and the devices a map takes (``pmap_devices.py``).

Each is checked against jax (``jax.pmap``'s option checks, ``api_util.flatten_axes``),
the plugin's ``mesh`` fixture or a value worked out by hand.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax._src import api_util

from partitioner._src.planner.pmap_devices import axis_mesh, grid_mesh
from partitioner._src.planner.pmap_info import PmapInfo, pmap_info
from partitioner._src.planner.pmap_plan import (
    _axes_per_leaf,
    _axis_size,
    _dynamic_in_axes,
    _normalized,
)


def _f(*args: Any) -> Any:
    return args


def _info(**options: Any) -> PmapInfo:
    given = {
        "axis_name": "i",
        "in_axes": 0,
        "out_axes": 0,
        "static_broadcasted_argnums": (),
        "devices": None,
        "backend": None,
        "axis_size": None,
        "donate_argnums": (),
        **options,
    }
    return pmap_info(_f, **given)


X, Y, Z = np.zeros(2), np.zeros(3), np.zeros(4)


@pytest.mark.parametrize(
    "axes", [False, 1.0, "a", (0, 1.0), {"a": True}, 0, (0, None), [1, {"b": 0}]]
)
@pytest.mark.parametrize("which", ["in_axes", "out_axes"])
def test_axes_of_other_types_than_int_or_none_are_refused_as_by_jax_pmap(
    axes: Any, which: str
) -> None:
    try:
        jax.pmap(_f, **{which: axes})
    except TypeError:
        with pytest.raises(TypeError, match=f"^pmap _f: {which} must be an int, None, or a"):
            _info(**{which: axes})
    else:
        _info(**{which: axes})


CASES = {
    "one for all": (0, (X, {"b": Y, "a": Z})),
    "none broadcast": ((0, None), (X, (Y, Z))),
    "per key": ((1, {"a": 0, "b": None}), (X, {"a": Y, "b": Z})),
    "a list": ([0, 1], [X, Y]),
    "too many": ((0, 0, 0), (X, Y)),
    "another key": ((0, {"c": 0}), (X, {"a": Y})),
}


@pytest.mark.parametrize("axes, tree", CASES.values(), ids=CASES)
def test_axes_per_leaf_are_jaxs_flatten_axes(axes: Any, tree: Any) -> None:
    treedef = jax.tree.structure(tree)
    try:
        theirs = api_util.flatten_axes("in_axes", treedef, axes)
    except ValueError:
        with pytest.raises(ValueError, match="^pmap f: in_axes .* is not a pytree prefix"):
            _axes_per_leaf(axes, tree, "in_axes", "pmap f")
    else:
        assert _axes_per_leaf(axes, tree, "in_axes", "pmap f") == theirs


def test_negative_axes_count_from_the_end_and_out_of_range_ones_are_refused() -> None:
    assert [_normalized(d, 3, "x", "in_axes", "pmap f") for d in (0, 2, -1, -3, None)] == [
        0,
        2,
        2,
        0,
        None,
    ]
    for d in (3, -4):
        with pytest.raises(ValueError, match=f"^pmap f: in_axes {d} for x of rank 3 is out"):
            _normalized(d, 3, "x", "in_axes", "pmap f")
    # An output's rank is the body's (without the mapped axis it gains).
    with pytest.raises(ValueError, match="^pmap f: out_axes 3 for output 0 of rank 2 is out"):
        _normalized(3, 3, "output 0", "out_axes", "pmap f")


def test_static_entries_of_a_tuple_per_argument_are_dropped() -> None:
    info = _info(in_axes=(0, None, 1), static_broadcasted_argnums=(1,))
    assert _dynamic_in_axes(info, 3) == (0, 1)
    assert _dynamic_in_axes(info, 2) == (0, None, 1)  # not one per argument: kept whole


def test_the_axis_size_is_every_mapped_arguments() -> None:
    avals = [jax.ShapeDtypeStruct(s, np.float32) for s in [(4, 2), (3, 4), (5,)]]
    paths = [(jax.tree_util.SequenceKey(i),) for i in range(3)]
    assert _axis_size(_info(), avals, [0, 1, None], paths) == 4
    assert _axis_size(_info(axis_size=4), avals, [0, 1, None], paths) == 4
    assert _axis_size(_info(axis_size=6), avals, [None] * 3, paths) == 6
    with pytest.raises(ValueError, match=r"sizes differ: args\[0\] has 4 at dimension 0, "):
        _axis_size(_info(), avals, [0, 0, None], paths)
    with pytest.raises(ValueError, match="in_axes all None"):
        _axis_size(_info(), avals, [None] * 3, paths)
    with pytest.raises(ValueError, match="axis_size=2 but the mapped arguments have size 4"):
        _axis_size(_info(axis_size=2), avals, [0, 1, None], paths)


def test_a_map_takes_the_first_devices_or_those_it_is_given(mesh: Any) -> None:
    assert axis_mesh(_info(), 4) == mesh((4,), ("i",))
    backwards = jax.devices()[::-1]
    given = _info(devices=backwards)
    assert axis_mesh(given, 8) == mesh((8,), ("i",), devices=backwards)
    with pytest.raises(ValueError, match="larger than the 8 available cpu devices"):
        axis_mesh(_info(), 9)


def test_nested_maps_take_a_grid_of_devices(mesh: Any) -> None:
    assert grid_mesh(_info(), 2, [("j", 2), ("k", 2)]) == mesh((2, 2, 2), ("i", "j", "k"))
    with pytest.raises(ValueError, match=r"nested maps reuse an axis name: \('i', 'j', 'i'\)"):
        grid_mesh(_info(), 2, [("j", 2), ("i", 2)])
    with pytest.raises(ValueError, match=r"over \{'i': 4, 'j': 4\} need 16 devices"):
        grid_mesh(_info(), 4, [("j", 4)])
