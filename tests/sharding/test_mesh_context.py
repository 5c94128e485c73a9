"""The mesh context: thread-local, nestable, restored on exceptions, shared with jax's Mesh."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as JaxP

import partitioner
from partitioner._testing import as_auto_mesh, current_mesh, maybe_current_mesh
from partitioner.testing.plugin import MeshFactory

AUTO2 = (AxisType.Auto, AxisType.Auto)


def devices(*shape: int) -> np.ndarray:
    return np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)


def test_no_mesh() -> None:
    assert maybe_current_mesh() is None
    with pytest.raises(RuntimeError, match="mesh") as info:
        current_mesh("pjit")
    assert info.value.args[0].startswith("pjit requires a non-empty mesh in context")


def test_mesh_yields_an_auto_jax_mesh() -> None:
    with partitioner.mesh(devices(2, 4), ("x", "y")) as m:
        assert isinstance(m, Mesh)
        assert m.axis_names == ("x", "y") and m.axis_types == AUTO2
        assert current_mesh("test") is m
    assert maybe_current_mesh() is None


def test_accepts_a_list_of_names_and_a_list_of_devices() -> None:
    with partitioner.mesh(list(jax.devices()), ["d"]) as m:
        assert m.axis_names == ("d",) and m.devices.shape == (8,)
    with partitioner.mesh(devices(8), "d") as m:  # a single name, as jax's Mesh allows
        assert m.axis_names == ("d",)


def test_nesting_innermost_wins_and_is_restored() -> None:
    with partitioner.mesh(devices(8), ("a",)) as outer:
        with partitioner.mesh(devices(2, 4), ("x", "y")) as inner:
            assert current_mesh("t") is inner
            with partitioner.mesh(devices(2), ("z",)) as innermost:
                assert current_mesh("t") is innermost
            assert current_mesh("t") is inner
        assert current_mesh("t") is outer
    assert maybe_current_mesh() is None


def test_restored_after_an_exception() -> None:
    with partitioner.mesh(devices(8), ("a",)) as outer:
        with pytest.raises(ZeroDivisionError):
            with partitioner.mesh(devices(2, 4), ("x", "y")):
                raise ZeroDivisionError
        assert current_mesh("t") is outer
    with pytest.raises(KeyError):
        with partitioner.mesh(devices(8), ("a",)):
            raise KeyError("boom")
    assert maybe_current_mesh() is None


def test_thread_local() -> None:
    seen: dict[str, object] = {}
    entered, release = threading.Event(), threading.Event()

    def other_thread() -> None:
        seen["before"] = maybe_current_mesh()
        with partitioner.mesh(devices(2), ("t",)) as m:
            seen["own"] = current_mesh("t") is m
            entered.set()
            release.wait(10)
        seen["after"] = maybe_current_mesh()

    with partitioner.mesh(devices(2, 4), ("x", "y")) as mine:
        thread = threading.Thread(target=other_thread)
        thread.start()
        assert entered.wait(10)
        # the other thread's mesh is active over there, not here
        assert current_mesh("t") is mine
        release.set()
        thread.join(10)
    assert seen == {"before": None, "own": True, "after": None}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_jax_mesh_inside_partitioner_mesh_and_back(mesh: MeshFactory) -> None:
    jm = mesh((4, 2), ("p", "q"))
    with partitioner.mesh(devices(8), ("a",)) as ours:
        with jm:
            assert current_mesh("t") is jm
            with partitioner.mesh(devices(2, 4), ("x", "y")) as inner:
                assert current_mesh("t") is inner
            assert current_mesh("t") is jm
        assert current_mesh("t") is ours
    with jm:
        with partitioner.mesh(devices(8), ("a",)) as ours:
            assert current_mesh("t") is ours
        assert current_mesh("t") is jm
    assert maybe_current_mesh() is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_jax_mesh_as_a_decorator(mesh: MeshFactory) -> None:
    jm = mesh((2, 4), ("x", "y"))

    @jm
    def body() -> Mesh:
        return current_mesh("t")

    assert body() is jm
    assert maybe_current_mesh() is None


def test_partitioner_mesh_as_a_decorator() -> None:
    @partitioner.mesh(devices(2, 4), ("x", "y"))
    def body() -> Mesh:
        return current_mesh("t")

    first, second = body(), body()  # reusable: a fresh context per call
    assert first.axis_names == ("x", "y") and first is second
    assert maybe_current_mesh() is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_explicit_mesh_is_kept_and_auto_twins_are_interned() -> None:
    """A mesh with Explicit axes is used as is (sharding in types); the Auto twin is interned."""
    explicit = jax.make_mesh((4, 2), ("a", "b"))
    assert set(explicit.axis_types) == {AxisType.Explicit}  # jax 0.10.2's default
    with explicit:
        m = current_mesh("t")
    assert m is explicit
    twin = as_auto_mesh(explicit)
    assert twin.axis_types == AUTO2
    assert twin.axis_names == explicit.axis_names
    assert (twin.devices == explicit.devices).all()
    # interned: an equal mesh built again gives the same Auto twin (no retrace)
    assert as_auto_mesh(jax.make_mesh((4, 2), ("a", "b"))) is twin
    auto = Mesh(devices(8), ("d",))
    assert as_auto_mesh(auto) is auto


def test_set_mesh_is_used_when_no_context_mesh(mesh: MeshFactory) -> None:
    explicit = mesh((2, 4), ("a", "b"), axis_types=AxisType.Explicit)
    with jax.set_mesh(explicit):
        assert current_mesh("t") is explicit
        with partitioner.mesh(devices(8), ("z",)) as ours:
            assert current_mesh("t") is ours
    assert maybe_current_mesh() is None


def test_partitioner_mesh_takes_axis_types() -> None:
    with partitioner.mesh(devices(2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2) as m:
        assert current_mesh("t") is m and m.axis_types == (AxisType.Explicit,) * 2
    with pytest.raises(ValueError, match="one jax.sharding.AxisType per axis"):
        with partitioner.mesh(devices(2, 4), ("x", "y"), axis_types=(AxisType.Explicit,)):
            pass


def test_jax_sees_the_partitioner_mesh() -> None:
    """jax.jit resolves a bare spec against our mesh: both share one resource stack."""
    with partitioner.mesh(devices(2, 4), ("x", "y")) as m:
        out = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, JaxP("x")))(np.ones(8))
    assert out.sharding.mesh.axis_names == m.axis_names
    assert out.sharding.spec == JaxP("x")


@pytest.mark.parametrize(
    "devs, names, exc, match",
    [
        (devices(2, 4), ("x",), ValueError, "2 dimensions"),
        (devices(8), ("x", "y"), ValueError, "1 dimensions"),
        (devices(2, 4), ("x", "x"), ValueError, "repeat"),
        (np.array([], dtype=object), ("x",), ValueError, "empty"),
        (devices(8), 3, TypeError, "tuple or list"),
    ],
)
def test_bad_mesh_inputs(devs, names, exc, match) -> None:
    with pytest.raises(exc, match=match) as info:
        with partitioner.mesh(devs, names):
            pass
    assert "mesh(devices, axis_names)" in str(info.value)
    assert maybe_current_mesh() is None
