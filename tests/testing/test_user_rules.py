"""A property written as a user would, over a logical-axis rule.

A model library maps the logical names of a value's dimensions to mesh axes (as
flax's ``logical_to_mesh_axes`` and T5X's rules do) and checks its rule with
``partitioner.testing``: the strategies draw the meshes and shapes, the round-trip
checks say the spec is valid and means one layout in every form, and the property
states the rule's promise. The same property passes on the correct rule and finds a
planted bug (on 3-D meshes the rule ignores the last mesh axis) within hypothesis'
default example budget, from several seeds, and shrinks it to a small case. flax's
own ``logical_to_mesh_axes`` is checked the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from partitioner.testing import assert_round_trips
from partitioner.testing.strategies import meshes, shapes

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

#: hypothesis' own default number of examples (the suite's profile runs more).
DEFAULT_BUDGET = settings.get_profile("default").max_examples

#: Logical axis name -> the mesh axes that may split it, in order of preference.
RULES = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "mlp": ("model",),
    "heads": ("model",),
    "vocab": ("model", "fsdp"),
}
LOGICAL_NAMES = [None, *RULES]
MESH_AXES = ("data", "fsdp", "model")


def logical_to_mesh(names: Sequence[str | None], mesh: Mesh) -> Any:
    """The spec of a value whose dimensions are named ``names``: the correct rule."""
    return _rule(names, tuple(mesh.axis_names))


def logical_to_mesh_keeping_the_last_axis(names: Sequence[str | None], mesh: Mesh) -> Any:
    """The planted bug: on a 3-D mesh the last axis is kept back (for pipelining)."""
    axes = tuple(mesh.axis_names)
    return _rule(names, axes[:2] if len(axes) == 3 else axes)


def _rule(names: Sequence[str | None], mesh_axes: tuple[str, ...]) -> Any:
    taken: set[str] = set()
    entries = []
    for name in names:
        axes = tuple(a for a in RULES.get(name, ()) if a in mesh_axes and a not in taken)
        taken.update(axes)
        entries.append(axes or None)
    return P(*entries)


def _axes(entry: Any) -> tuple[str, ...]:
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def rule_property(rule: Callable[..., Any], calls: list[bool]) -> Callable[[], None]:
    """The user's property over ``rule``; ``calls`` records each example's outcome."""

    @settings(max_examples=DEFAULT_BUDGET, database=None, deadline=None, derandomize=False)
    @given(st.data())
    def rule_uses_the_mesh_as_told(data: st.DataObject) -> None:
        mesh = data.draw(meshes(axis_names=MESH_AXES), label="mesh")
        names = data.draw(st.lists(st.sampled_from(LOGICAL_NAMES), max_size=3), label="names")
        spec = rule(names, mesh)
        shape = data.draw(shapes(mesh, spec, ndim=len(names)), label="shape")
        calls.append(False)
        assert_round_trips(spec, mesh, shape)
        for name, entry in zip(names, spec, strict=False):
            assert set(_axes(entry)) <= set(RULES.get(name, ())), (name, entry)
        used = {a for entry in spec for a in _axes(entry)}
        wanted = {a for name in names for a in RULES.get(name, ()) if a in mesh.axis_names}
        assert wanted <= used, f"{spec} leaves {sorted(wanted - used)} unused"
        calls[-1] = True

    return rule_uses_the_mesh_as_told


def test_the_property_passes_on_the_correct_rule() -> None:
    calls: list[bool] = []
    rule_property(logical_to_mesh, calls)()
    assert len(calls) >= DEFAULT_BUDGET and all(calls)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_the_property_finds_the_planted_bug_within_the_default_budget(which: int) -> None:
    calls: list[bool] = []
    prop = seed(which)(rule_property(logical_to_mesh_keeping_the_last_axis, calls))
    with pytest.raises(AssertionError, match="unused") as info:
        prop()
    first = calls.index(False) + 1
    assert first <= DEFAULT_BUDGET, f"found after {first} examples"
    # Shrunk: three axes (the bug needs them) of size 1, one dimension, the smallest shape.
    report = "\n".join(info.value.__notes__)
    assert "axis_sizes=(1, 1, 1)" in report and "Draw 3 (shape): (1,)" in report, report
    assert "axis_types=(Auto, Auto, Auto)" in report, report


def test_flax_logical_to_mesh_axes_round_trips() -> None:
    """flax's own rule function, with rules written for each drawn mesh."""
    calls: list[bool] = []

    @settings(max_examples=DEFAULT_BUDGET, database=None, deadline=None)
    @given(st.data())
    def flax_rules_give_valid_specs(data: st.DataObject) -> None:
        mesh = data.draw(meshes(axis_names=MESH_AXES), label="mesh")
        names = data.draw(
            st.lists(st.sampled_from([n for n in LOGICAL_NAMES if n]), max_size=3, unique=True)
        )
        rules = [
            (name, tuple(a for a in axes if a in mesh.axis_names) or None)
            for name, axes in RULES.items()
        ]
        spec = nn.logical_to_mesh_axes(names, rules)  # flax skips a rule whose axes are taken
        assert_round_trips(spec, mesh, data.draw(shapes(mesh, spec, ndim=len(names))))
        calls.append(True)

    flax_rules_give_valid_specs()
    assert len(calls) >= DEFAULT_BUDGET
