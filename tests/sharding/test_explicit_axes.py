"""Explicit axes: the pieces behind sharding in types (NOTE [explicit axes]).

The side-by-side conformance cases live in ``tests/conformance/test_sharding_in_types.py``;
these tests pin the rules they rest on: which meshes are typed, how an unspecified
output is laid out, and that Auto meshes keep the untyped 2022 model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import partitioner
from partitioner._testing import (
    as_call_mesh,
    has_explicit_axes,
    result_mesh,
    run_with_unspecified_outputs,
    typed_context,
)
from partitioner.testing.plugin import MeshFactory

E, A = AxisType.Explicit, AxisType.Auto


@pytest.fixture
def mesh_2x2(mesh: MeshFactory) -> Callable[[tuple[AxisType, ...]], Mesh]:
    """The first 4 devices as a 2x2 ``("x", "y")`` mesh with the axis types given."""
    return lambda types: mesh((2, 2), ("x", "y"), axis_types=types)


def _bind_unspecified(f: Any, args: tuple[Any, ...]) -> list[Any]:
    return jax.block_until_ready(run_with_unspecified_outputs(f, *args))


@pytest.mark.parametrize(
    "types, typed",
    [((E, E), True), ((E, A), True), ((A, E), True), ((A, A), False)],
    ids=["explicit", "explicit_auto", "auto_explicit", "auto"],
)
def test_which_meshes_are_typed(types, typed, mesh_2x2) -> None:
    mesh = mesh_2x2(types)
    assert has_explicit_axes(mesh) is typed
    call = as_call_mesh(mesh)
    assert (call is mesh) if typed else call.axis_types == (A, A)


def test_typed_context_sets_both_meshes_only_for_explicit_axes(mesh_2x2) -> None:
    explicit, auto = mesh_2x2((E, E)), mesh_2x2((A, A))
    with typed_context(explicit):
        assert jax.sharding.get_abstract_mesh() == explicit.abstract_mesh
    assert jax.sharding.get_abstract_mesh().empty
    with typed_context(auto):
        assert jax.sharding.get_abstract_mesh().empty


def test_result_mesh_takes_the_types_axis_types(mesh_2x2) -> None:
    mesh = mesh_2x2((E, E))
    auto_typed = jax.core.ShapedArray(
        (8, 2), np.float32, sharding=NamedSharding(mesh_2x2((A, A)).abstract_mesh, P())
    )
    assert result_mesh(mesh, auto_typed).axis_types == (A, A)
    typed = jax.core.ShapedArray(
        (8, 2), np.float32, sharding=NamedSharding(mesh.abstract_mesh, P("x"))
    )
    assert result_mesh(mesh, typed) is mesh
    assert result_mesh(mesh_2x2((A, A)), auto_typed).axis_types == (A, A)


def test_unspecified_output_follows_its_type(partitioner_mode, mesh_2x2) -> None:
    """NOTE [unspecified outputs follow the type]: jax.jit's layout of an unspecified output."""
    mesh = mesh_2x2((E, E))
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(16.0).reshape(8, 2), P("x", None))
        b = jax.device_put(np.arange(16.0).reshape(2, 8), P(None, "y"))
        f = partitioner.pjit(lambda x, y: (x @ y, (x @ y).sum(0)), (P("x"), P(None, "y")), P())
        out, total = _bind_unspecified(f, (a, b))
        want, want_total = jax.jit(lambda x, y: (x @ y, (x @ y).sum(0)))(a, b)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want))
    np.testing.assert_allclose(np.asarray(total), np.asarray(want_total))
    assert out.sharding == want.sharding == NamedSharding(mesh, P("x", "y"))
    assert total.sharding == want_total.sharding == NamedSharding(mesh, P("y"))


def test_unspecified_output_on_a_mixed_mesh_pins_the_explicit_dims(mesh_2x2) -> None:
    mesh = mesh_2x2((E, A))
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("x", None)))
        f = partitioner.pjit(lambda x: x * 2, P("x"), P())
        (out,) = _bind_unspecified(f, (a,))
        want = jax.jit(lambda x: x * 2)(a)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want))
    assert out.sharding.is_equivalent_to(want.sharding, 2)


def test_auto_mesh_keeps_the_untyped_model(mesh_2x2) -> None:
    """Over Auto axes nothing changes: no axis in a type (a committed argument names the
    mesh, as jax.jit's), the mesh's Auto twin, XLA's layouts."""
    mesh = mesh_2x2((A, A))
    seen: list[Any] = []

    def body(x):
        seen.append(jax.typeof(x))
        return x * 2

    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("x", None)))
        out = partitioner.pjit(body, P("x"), P("x"))(a)
    assert seen[0].sharding.mesh == mesh.abstract_mesh and seen[0].sharding.spec == P(None, None)
    assert out.sharding.mesh.axis_types == (A, A)
    assert out.sharding == NamedSharding(mesh, P("x"))


def test_explicit_call_keeps_the_mesh_types_on_results(mesh_2x2) -> None:
    mesh = mesh_2x2((E, E))
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(16.0).reshape(8, 2), P("x", None))
        out = partitioner.pjit(lambda x: x * 2, P("x"), P("x"))(a)
    assert out.sharding.mesh.axis_types == (E, E)
    assert str(jax.typeof(out)) == "float32[8@x,2]"
