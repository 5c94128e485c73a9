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

import math
from collections.abc import Callable, Sequence
from typing import Any

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError as e:
    raise ImportError(
        "partitioner.testing.assert_sharding_invariant needs hypothesis, which is not "
        'installed: pip install "partitioner[testing]" (the testing extra)'
    ) from e

import jax
import numpy as np
from jax.sharding import AxisType, Mesh
from jax.tree_util import keystr, tree_flatten_with_path

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
    axis_types: str = "auto",
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
            axes of the kind ``axis_types`` says). A function whose constraints name
            mesh axes needs meshes with those names: pass ``strategies.meshes(
            axis_names=...)``.
        axis_types: ``"auto"`` (the default) or ``"explicit"``: the drawn meshes' axes.
        out_shardings: also draw a layout for every output and ask for it.
        max_examples: hypothesis' number of examples (each compiles a program).
        deadline: hypothesis' time limit per example (None: none).
        rtol: relative tolerance for floating outputs (default: by dtype,
            ``TOLERANCES``); integer and boolean outputs compare exactly.
        atol: absolute tolerance, likewise.
        **kwargs: its keyword arguments, passed as they are to both sides.

    Raises:
        AssertionError: an output differs from ``jax.jit``'s on one device; names the
            (shrunk) mesh, every argument's layout, the output's path and both values.
        TypeError, ValueError: a bad argument (``f`` not callable, ``axis_types``
            unknown, ``argnums`` out of range), or arguments no mesh over the devices
            can split (every dimension prime to the device count, or no arrays).
    """
    if not callable(f):
        raise TypeError(f"assert_sharding_invariant: f must be callable, got {type(f).__name__}")
    if axis_types not in ("auto", "explicit"):
        raise ValueError(
            f"assert_sharding_invariant: axis_types must be 'auto' or 'explicit', got {axis_types!r}"
        )
    laid = tuple(range(len(args))) if argnums is None else tuple(argnums)
    if any(not isinstance(i, int) or not -len(args) <= i < len(args) for i in laid):
        raise ValueError(
            f"assert_sharding_invariant: argnums {tuple(argnums or ())} out of range for "
            f"{len(args)} positional arguments"
        )
    laid = tuple(sorted({i % len(args) for i in laid})) if args else ()
    _check_divisible(tuple(args[i] for i in laid), jax.device_count())
    kind = AxisType.Explicit if axis_types == "explicit" else AxisType.Auto
    mesh_strategy = meshes if meshes is not None else strategies.meshes(axis_types=(kind,))
    one = jax.devices()[0]
    on_one = jax.device_put(args, one)
    references: dict[tuple[Any, ...], Any] = {}

    def reference(mesh: Mesh) -> Any:
        """``jax.jit``'s value on one device, under a mesh of the same axis names, each of
        size 1 (so constraints naming the axes mean what they say: nothing is split)."""
        names = tuple(mesh.axis_names)
        if names not in references:
            single = Mesh(np.array([one]).reshape((1,) * len(names)), names,
                          axis_types=mesh.axis_types)  # fmt: skip
            with jax.set_mesh(single):
                references[names] = jax.jit(f)(*on_one, **kwargs)
        return references[names]

    @settings(
        max_examples=max_examples,
        deadline=deadline,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        mesh = data.draw(mesh_strategy, label="mesh")
        chosen = data.draw(
            strategies.argument_shardings(mesh, tuple(args[i] for i in laid)), label="layouts"
        )
        placed = list(args)
        for i, shardings in zip(laid, chosen, strict=True):
            placed[i] = jax.tree.map(_put, args[i], shardings, is_leaf=lambda x: x is None)
        options: dict[str, Any] = {}
        expected = reference(mesh)
        if out_shardings:
            options["out_shardings"] = data.draw(
                strategies.argument_shardings(mesh, expected), label="out_shardings"
            )
        with jax.set_mesh(mesh):
            got = jit(f, **options)(*placed, **kwargs)
        _compare(got, expected, rtol, atol, mesh, laid, chosen)

    check()


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


def _put(x: Any, sharding: Any) -> Any:
    return x if sharding is None else jax.device_put(x, sharding)


def _compare(
    got: Any,
    want: Any,
    rtol: float | None,
    atol: float | None,
    mesh: Mesh,
    laid: tuple[int, ...],
    chosen: Any,
) -> None:
    paths = [keystr(p) for p, _ in tree_flatten_with_path(want)[0]]
    for path, a, b in zip(paths, jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        kind = np.dtype(b.dtype)
        exact = not np.issubdtype(kind, np.inexact)
        r, t = TOLERANCES.get(kind.name, (1e-5, 1e-6))
        r, t = (rtol if rtol is not None else r), (atol if atol is not None else t)
        same = a.shape == b.shape and (
            np.array_equal(a, b) if exact else np.allclose(a, b, rtol=r, atol=t, equal_nan=True)
        )
        if not same:
            layouts = "\n".join(
                f"  args[{i}]{keystr(p)}: {None if s is None else s.spec}"
                for i, tree in zip(laid, chosen, strict=True)
                for p, s in tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
            )
            where: np.ndarray = np.zeros((0, b.ndim), int)
            if a.shape == b.shape:
                where = np.argwhere(a != b if exact else ~np.isclose(a, b, rtol=r, atol=t))
            raise AssertionError(
                f"assert_sharding_invariant: output{path} differs from jax.jit's on one device "
                f"over mesh {dict(mesh.shape)} (devices {[d.id for d in mesh.devices.flat]}) "
                f"with the arguments laid out as\n{layouts}\n"
                f"{len(where)} of {max(math.prod(b.shape), 1)} elements differ (rtol={r}, "
                f"atol={t}), first at {tuple(int(i) for i in where[0]) if len(where) else '-'}"
                f"\n  partitioned: {a!r}\n  one device:  {b!r}"
            )
