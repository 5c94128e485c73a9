"""``assert_sharding_invariant``: does a function give the same answer however its inputs
are laid out?

NOTE [sharding invariance]: a custom partitioning rule that is right only while an
axis is whole, shard_map code missing a collective, numerics that depend on the
layout: each is wrong only on some meshes and layouts, and a test on one layout
passes. The check draws meshes and a layout for every argument leaf (hypothesis,
``strategies.meshes`` and ``strategies.argument_shardings``: every axis in one
dimension, long tuples, size-1 axes...), runs ``f`` through ``partitioner.jit`` on the
arguments laid out so, and compares every output with ``f`` under ``jax.jit`` on one
device. A difference is shrunk by hypothesis to the smallest mesh and layouts that
still change the result, and raised as an ``AssertionError`` naming them and showing
both values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError as e:
    raise ImportError(
        "partitioner.testing.assert_sharding_invariant needs hypothesis, which is not "
        'installed: pip install "partitioner[hypothesis]" (or pip install hypothesis)'
    ) from e

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh
from jax.tree_util import keystr, tree_flatten_with_path

from _partitioner_pytest.axis_types import AxisTypes, normalize_axis_types

from .._src.jit import jit
from . import strategies

#: Tolerances (rtol, atol) by dtype kind and width: what one device and a partitioned
#: program may differ by when XLA sums in another order.
TOLERANCES: dict[str, tuple[float, float]] = {
    "bfloat16": (2e-2, 2e-2),
    "float16": (2e-3, 2e-3),
    "float32": (2e-5, 2e-6),
    "float64": (1e-12, 1e-14),
}


def assert_sharding_invariant(
    f: Callable[..., Any],
    *args: Any,
    argnums: Sequence[int] | None = None,
    meshes: st.SearchStrategy[Mesh] | None = None,
    axis_types: AxisTypes = AxisType.Auto,
    out_shardings: bool = False,
    max_examples: int = 20,
    deadline: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    **kwargs: Any,
) -> None:
    """Check that ``f(*args, **kwargs)`` is the same whatever the arguments' layouts.

    Args:
        f: the function (not already jitted: it is traced by both sides).
        *args: its positional arguments.
        argnums: the positional arguments to lay out (default: all); the others are
            passed as they are (placed replicated).
        meshes: the meshes to draw (default: ``strategies.meshes`` over all devices,
            axes of the types ``axis_types`` says). A function whose constraints name
            mesh axes needs meshes with those names: pass ``strategies.meshes(
            axis_names=...)``.
        axis_types: the drawn meshes' axis types, as ``strategies.meshes`` takes them:
            ``AxisType.Auto`` (the default) or ``AxisType.Explicit`` for every axis, or
            a sequence each axis draws from; names (``"auto"``, ``"explicit"``) too.
        out_shardings: also draw a layout for every output and ask for it.
        max_examples: hypothesis' number of examples (each compiles a program).
        deadline: hypothesis' time limit per example (None: none).
        rtol: relative tolerance for floating outputs (default: by dtype,
            ``TOLERANCES``); integer and boolean outputs compare exactly, NaN equals NaN.
        atol: absolute tolerance, likewise.
        **kwargs: its keyword arguments, passed as they are to both sides.

    Raises:
        AssertionError: an output differs from ``jax.jit``'s on one device; names the
            (shrunk) mesh, every argument's layout, the output's path and both values.
        TypeError, ValueError: a bad argument (``f`` not callable, ``axis_types``
            unknown or Manual, ``argnums`` out of range), or arguments no mesh over the
            devices can split (every dimension prime to the device count, or no arrays).
    """
    laid = _checked_arguments(f, args, argnums)
    types = _checked_axis_types(axis_types)
    mesh_strategy = meshes if meshes is not None else strategies.meshes(axis_types=types)
    reference = _on_one_device(f, args, kwargs)

    @settings(
        max_examples=max_examples,
        deadline=deadline,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        layout = _draw_layout(data, mesh_strategy, args, laid)
        expected = reference(layout.mesh)
        if out_shardings:
            outs = strategies.argument_shardings(layout.mesh, expected)
            layout = dataclasses.replace(layout, outs=data.draw(outs, label="out_shardings"))
        _compare(layout.run(f, args, kwargs), expected, rtol, atol, layout)

    check()


# --- the arguments ---


def _checked_arguments(
    f: Callable[..., Any], args: tuple[Any, ...], argnums: Sequence[int] | None
) -> tuple[int, ...]:
    """The positions of the arguments to lay out, sorted; refuses, before hypothesis
    starts, what would make every example fail or test nothing."""
    if not callable(f):
        raise TypeError(f"assert_sharding_invariant: f must be callable, got {type(f).__name__}")
    laid = tuple(range(len(args))) if argnums is None else tuple(argnums)
    if any(not isinstance(i, int) or not -len(args) <= i < len(args) for i in laid):
        raise ValueError(
            f"assert_sharding_invariant: argnums {tuple(argnums or ())} out of range for "
            f"{len(args)} positional arguments"
        )
    laid = tuple(sorted({i % len(args) for i in laid})) if args else ()
    _check_divisible(tuple(args[i] for i in laid), jax.device_count())
    return laid


def _checked_axis_types(axis_types: AxisTypes) -> AxisType | tuple[AxisType, ...]:
    """``axis_types`` read as the whole kit reads it, without Manual: ``jit`` lays its
    arguments out over Auto and Explicit axes; Manual ones belong inside ``shard_map``."""
    where = "assert_sharding_invariant"
    types = normalize_axis_types(axis_types, where)
    if AxisType.Manual in ((types,) if isinstance(types, AxisType) else types):
        raise ValueError(
            f"{where}: axis_types must be AxisType.Auto or AxisType.Explicit (jit lays "
            f"arguments out over those; Manual axes are shard_map's), got {axis_types!r}"
        )
    return types


def _check_divisible(laid: tuple[Any, ...], n_devices: int) -> None:
    """A ValueError where no mesh over these devices can split any argument laid out:
    every layout would be the replicated one, and the check would test nothing."""
    shapes = {
        f"args{keystr(p)}": tuple(np.shape(x))
        for p, x in tree_flatten_with_path(laid)[0]
        if hasattr(x, "shape") and hasattr(x, "dtype")
    }
    if not any(math.gcd(n, n_devices) > 1 for shape in shapes.values() for n in shape):
        raise ValueError(
            "assert_sharding_invariant: no mesh over the "
            f"{n_devices} devices can split any argument laid out (shapes "
            f"{shapes or 'none'}): every layout would be replicated. Give arguments with a "
            f"dimension sharing a factor with {n_devices}, or run on more devices "
            "(pytest --virtual-devices 8)."
        )


# --- the two sides ---


def _on_one_device(
    f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[Mesh], Any]:
    """``mesh -> jax.jit``'s value on one device, under a mesh of the same axis names,
    each of size 1 (so constraints naming the axes mean what they say: nothing is split).

    Computed once per set of axis names: every example over those names compares with
    the same value, and the reference is not recompiled per example.
    """
    one = jax.devices()[0]
    on_one = jax.device_put(args, one)
    values: dict[tuple[Any, ...], Any] = {}

    def reference(mesh: Mesh) -> Any:
        names = tuple(mesh.axis_names)
        if names not in values:
            single = Mesh(np.array([one]).reshape((1,) * len(names)), names,
                          axis_types=mesh.axis_types)  # fmt: skip
            with jax.set_mesh(single):
                values[names] = jax.jit(f)(*on_one, **kwargs)
        return values[names]

    return reference


@dataclasses.dataclass(frozen=True)
class _Layout:
    """One drawn example: a mesh and the layout of every argument (and output) over it.

    One value from the draw to the run to the failure message, so that the message
    names exactly what ran.

    Attributes:
        mesh: the drawn mesh.
        argnums: the positional arguments laid out, in order.
        shardings: for each of those, a pytree like it of ``NamedSharding`` (None for a
            leaf that is not an array, passed as it is).
        outs: the layouts asked for the outputs, a pytree like them (None: none asked).
    """

    mesh: Mesh
    argnums: tuple[int, ...]
    shardings: tuple[Any, ...]
    outs: Any = None

    def run(self, f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``partitioner.jit(f)`` on the arguments laid out so, under the mesh."""
        placed = list(args)
        for i, tree in zip(self.argnums, self.shardings, strict=True):
            placed[i] = jax.tree.map(_put, args[i], tree, is_leaf=lambda x: x is None)
        options = {} if self.outs is None else {"out_shardings": self.outs}
        with jax.set_mesh(self.mesh):
            return jit(f, **options)(*placed, **kwargs)

    def describe(self) -> str:
        """One line per laid-out leaf, then per asked output: ``args[0]['w']: P('a', None)``."""
        trees = [(f"args[{i}]", t) for i, t in zip(self.argnums, self.shardings, strict=True)]
        trees += [] if self.outs is None else [("out", self.outs)]
        return "\n".join(
            f"  {name}{keystr(p)}: {None if s is None else s.spec}"
            for name, tree in trees
            for p, s in tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
        )


def _draw_layout(
    data: st.DataObject,
    meshes: st.SearchStrategy[Mesh],
    args: tuple[Any, ...],
    laid: tuple[int, ...],
) -> _Layout:
    """A mesh, then a layout over it of every leaf of the arguments in ``laid``."""
    mesh = data.draw(meshes, label="mesh")
    shardings = strategies.argument_shardings(mesh, tuple(args[i] for i in laid))
    return _Layout(mesh, laid, tuple(data.draw(shardings, label="layouts")))


def _put(x: Any, sharding: Any) -> Any:
    """A leaf laid out; one drawn no layout (not an array) is passed as it is."""
    return x if sharding is None else jax.device_put(x, sharding)


# --- the comparison ---


def _compare(got: Any, want: Any, rtol: float | None, atol: float | None, layout: _Layout) -> None:
    """An AssertionError at the first output leaf that differs beyond its tolerance."""
    paths = [keystr(p) for p, _ in tree_flatten_with_path(want)[0]]
    for path, a, b in zip(paths, jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        r, t = _tolerances(b.dtype, rtol, atol)
        differ = _differing(a, b, r, t)
        if differ is None or differ.any():
            raise AssertionError(_message(path, a, b, differ, (r, t), layout))


def _tolerances(dtype: Any, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """``(rtol, atol)`` for an output of ``dtype``: the user's, else ``TOLERANCES``'."""
    r, t = TOLERANCES.get(np.dtype(dtype).name, (1e-5, 1e-6))
    return (rtol if rtol is not None else r), (atol if atol is not None else t)


def _differing(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray | None:
    """Which elements of ``a`` and ``b`` differ (None: their shapes do).

    The one test of equality, used both to decide and to count in the message, so the
    two cannot disagree: exact for integers and booleans; within the tolerances for
    floating kinds (bfloat16 included, which numpy does not count as inexact), where
    NaN equals NaN (a NaN both sides compute is no difference).
    """
    if a.shape != b.shape:
        return None
    if not jnp.issubdtype(b.dtype, jnp.inexact):
        return np.asarray(a != b)
    return ~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


def _message(
    path: str,
    a: np.ndarray,
    b: np.ndarray,
    differ: np.ndarray | None,
    tolerances: tuple[float, float],
    layout: _Layout,
) -> str:
    """The failure, with all a reader needs to reproduce it without rerunning hypothesis:
    the mesh and its devices, every layout drawn, how many elements differ (counted by
    ``_differing``, as the check decided) and where first, and both values."""
    mesh, laid_out = layout.mesh, "arguments" if layout.outs is None else "arguments and outputs"
    where = np.argwhere(differ) if differ is not None else np.zeros((0, b.ndim), int)
    first = tuple(int(i) for i in where[0]) if len(where) else "-"
    return (
        f"assert_sharding_invariant: output{path} differs from jax.jit's on one device "
        f"over mesh {dict(mesh.shape)} (devices {[d.id for d in mesh.devices.flat]}) "
        f"with the {laid_out} laid out as\n{layout.describe()}\n"
        f"{len(where)} of {max(math.prod(b.shape), 1)} elements differ (rtol={tolerances[0]}, "
        f"atol={tolerances[1]}), first at {first}"
        f"\n  partitioned: {a!r}\n  one device:  {b!r}"
    )
