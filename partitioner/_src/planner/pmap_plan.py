"""A ``pmap`` call -> :class:`CallPlan`: a pjit whose body is one pmap region.

A call flows one way: bind the arguments (``trace/arguments.py``; static
positions must be passed) -> each leaf's mapped dimension (``in_axes``) -> the
axis size and its devices (``pmap_devices.py``) -> trace the user's function on
one device's blocks under the axis environment (NOTE [pmap region]) -> the pjit
around the region (``primitives/pmap_region.py``). From there it is pjit's
pipeline: the same dispatcher, lowering (the region becomes a manual-SPMD
computation) and rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef, keystr, tree_unflatten

from .. import jax_private as jp
from .. import pmap_registry as _pmap_registry  # noqa: F401  (installs pmap_region_p's rules)
from ..distributed.local_map import LocalSlices
from ..primitives.call_plan import CallPlan, PlannerFromInfo
from ..primitives.pmap_region import RegionParams, block_aval, nested_chain, placed_on, region_pjit
from ..sharding.call_inputs import abstractify
from ..sharding.errors import MappedAxisError, MappedSizeError
from ..trace.arguments import BoundCall, bind_call
from ..trace.memo import cache_per_jaxpr
from ..trace.tracing import enclosing_maps, trace_body
from .pmap_devices import axis_mesh, check_devices, grid_mesh, map_devices
from .pmap_info import PmapInfo


def plan_pmap_call(info: PmapInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
    """Check one call's arguments, trace the body (cached) and build the pjit over the region."""
    _check_statics_passed(info, len(args))
    bound = bind_call(info.binding, args, kwargs)
    flat = bound.flat
    avals = [
        abstractify(leaf, flat.where(i, info.label), info.binding.static_hint, fun=info.fun)
        for i, leaf in enumerate(flat.leaves)
    ]
    dims = [
        _normalized(d, a.ndim, f"argument args{keystr(p)}", "in_axes", info.label)
        for d, a, p in zip(_in_dims(info, bound, len(args)), avals, flat.paths, strict=True)
    ]
    n = _axis_size(info, avals, dims, flat.paths)
    mesh = axis_mesh(info, n)
    body = _trace_region(info, bound, avals, dims, n, mesh)
    consts, trace_consts = body.const_values
    body_jaxpr = body.jaxpr
    chain = nested_chain(body_jaxpr, info.label)
    if chain:  # NOTE [nested pmap]
        mesh = grid_mesh(info, n, chain)
        body_jaxpr = placed_on(body_jaxpr, mesh)
    check_devices(info, mesh.devices.size)
    region = RegionParams(
        body=body_jaxpr,
        axis_name=info.axis_name,
        mesh=mesh,
        in_dims=(None,) * (len(consts) + len(trace_consts)) + tuple(dims),
        out_dims=body.out_dims,
        name=info.name,
    )
    params = region_pjit(
        region,
        consts,
        [*map(jp.shaped_abstractify, trace_consts), *avals],
        (False,) * len(trace_consts) + bound.donated,
    )
    if chain:
        # Outputs of nested maps are also split over the inner axes: XLA keeps the
        # layout the inner regions give them (read back after compiling).
        params = params.replace(out_axis_resources=(None,) * len(body.out_dims))
    return CallPlan(
        params=params,
        args_flat=tuple(trace_consts) + tuple(flat.leaves),
        in_tree=flat.in_tree,
        out_tree=body.out_tree,
        in_avals=tuple(avals),
        num_consts=len(trace_consts),
        nested_bind=(lambda *xs: region.bind(*consts, *xs)) if enclosing_maps() else None,
        arguments=flat,
    )


def _check_statics_passed(info: PmapInfo, n_args: int) -> None:
    for i in info.binding.static_argnums:
        if i >= n_args:
            raise ValueError(
                f"{info.label}: static_broadcasted_argnums={info.binding.static_argnums} but "
                f"the function was called with {n_args} positional argument(s)"
            )


def _dynamic_in_axes(info: PmapInfo, n_args: int) -> Any:
    """``in_axes`` for the dynamic positional arguments: a tuple with one entry per
    positional argument also covers the static ones, which are dropped from it."""
    axes, statics = info.in_axes, set(info.binding.static_argnums)
    if isinstance(axes, tuple) and len(axes) == n_args:
        return tuple(a for i, a in enumerate(axes) if i not in statics)
    return axes


def _in_dims(info: PmapInfo, bound: BoundCall, n_args: int) -> list[int | None]:
    """Each flat leaf's mapped dimension (``in_axes``; keyword arguments: 0)."""
    axes = _dynamic_in_axes(info, n_args)
    positional = _axes_per_leaf(axes, bound.dynamic_args, "in_axes", info.label)
    return positional + [0] * (len(bound.flat.leaves) - len(positional))


def _axes_per_leaf(axes: Any, tree: Any, what: str, label: str) -> list[int | None]:
    """``axes`` (a pytree prefix of ``tree``, leaves int or None) broadcast to one per leaf.

    Raises:
        ValueError: ``axes`` is not a prefix of ``tree``, or a leaf is not an int or None.
    """
    out: list[int | None] = []

    def expand(axis: Any, subtree: Any) -> None:
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise ValueError(
                f"{label}: {what} leaves must be an int or None, got {axis!r} of type "
                f"{type(axis).__name__}"
            )
        out.extend([None if axis is None else int(axis)] * len(jax.tree_util.tree_leaves(subtree)))

    try:
        jax.tree_util.tree_map(expand, axes, tree, is_leaf=lambda x: x is None)
    except ValueError as e:
        if str(e).startswith(label):
            raise
        raise ValueError(
            f"{label}: {what} {axes!r} is not a pytree prefix of the "
            f"{'arguments' if what == 'in_axes' else 'outputs'} "
            f"{jax.tree_util.tree_structure(tree)}: {e}"
        ) from None
    return out


def _normalized(dim: int | None, ndim: int, where: str, what: str, label: str) -> int | None:
    """``dim`` (an ``in_axes`` / ``out_axes`` entry) as an axis of a rank-``ndim`` value, >= 0.

    Raises:
        MappedAxisError: ``dim`` out of range (jax.pmap's ``IndexError``, also a ValueError).
    """
    if dim is None:
        return None
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise MappedAxisError(
            f"{label}: {what} {dim} for {where} of rank {ndim - (what == 'out_axes')} is out "
            f"of range"
        )
    return d


def _axis_size(info: PmapInfo, avals: Sequence[Any], dims: Sequence[int | None], paths: Any) -> int:
    """The mapped axis's size: every mapped argument's, else ``axis_size``.

    Raises:
        MappedSizeError: mapped sizes differ (jax.pmap's ``IndivisibleError``).
        ValueError: nothing mapped and no ``axis_size``; or ``axis_size``
            differs from the mapped arguments'.
    """
    sizes = {
        keystr(path): (a.shape[d], d)
        for a, d, path in zip(avals, dims, paths, strict=True)
        if d is not None
    }
    distinct = {s for s, _ in sizes.values()}
    if len(distinct) > 1:
        listed = ", ".join(f"args{p} has {s} at dimension {d}" for p, (s, d) in sizes.items())
        raise MappedSizeError(f"{info.label}: the mapped axis sizes differ: {listed}")
    if not distinct:
        if info.axis_size is None:
            raise ValueError(
                f"{info.label}: no argument is mapped (in_axes all None); give axis_size"
            )
        return info.axis_size
    (n,) = distinct
    if info.axis_size is not None and info.axis_size != n:
        raise ValueError(
            f"{info.label}: axis_size={info.axis_size} but the mapped arguments have size {n}"
        )
    return n


@dataclass(frozen=True)
class _TracedRegion:
    """A traced per-device body: const-free jaxpr, output tree and dims, the constants."""

    jaxpr: Any
    out_tree: PyTreeDef
    out_dims: tuple[int | None, ...]
    const_values: tuple[tuple[Any, ...], tuple[Any, ...]]  # (closed-over values, tracers)


class _Body:
    """The user's function with its outputs expanded at ``out_axes`` (what is traced)."""

    def __init__(self, info: PmapInfo) -> None:
        self.info = info
        self.__name__ = info.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.info.fun(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten(out)
        axes = _axes_per_leaf(self.info.out_axes, out, "out_axes", self.info.label)
        expanded = [
            x if d is None else jax.lax.expand_dims(x, (d if d >= 0 else d + np.ndim(x) + 1,))
            for x, d in zip(leaves, axes, strict=True)
        ]
        return tree_unflatten(tree, expanded)


def _trace_region(
    info: PmapInfo,
    bound: BoundCall,
    avals: list[Any],
    dims: list[int | None],
    n: int,
    mesh: Any,
) -> _TracedRegion:
    """The per-device body on blocks, traced under the axis environment."""

    def rebuild(blocks: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return bound.rebuild(
            [
                b if d is None else jax.lax.squeeze(b, (d,))
                for b, d in zip(blocks, dims, strict=True)
            ]
        )

    block_avals = tuple(block_aval(a, d) for a, d in zip(avals, dims, strict=True))
    # Keyed on the user's function (not this wrapper), with what the traced
    # body adds to it (out_axes), so a fresh pmap of the same function reuses it.
    key = (*bound.trace_key(), tuple(dims), info.axis_name, n, info.out_axes_key)
    debug_info = jp.debug_info(
        "pmap", info.fun, bound.args, bound.kwargs, static_argnums=list(info.binding.static_argnums)
    )
    try:
        with jp.extend_axis_env_nd([(info.axis_name, n)]):
            traced = trace_body(
                info.fun,
                rebuild,
                block_avals,
                mesh,
                key,
                debug_info,
                call=_Body(info),
                axis_name=info.axis_name,
            )
    except NameError as e:
        raise NameError(f"{info.label}: {e}") from None
    return _TracedRegion(
        _const_free(traced.jaxpr),
        traced.out_tree,
        _out_dims(info, traced),
        (tuple(traced.jaxpr.consts), traced.tracer_consts),
    )


def _out_dims(info: PmapInfo, traced: Any) -> tuple[int | None, ...]:
    """Each output's mapped dimension (``out_axes``), normalized."""
    out_avals = traced.jaxpr.out_avals
    if not traced.out_tree.num_leaves:
        return ()
    out_axes = _axes_per_leaf(
        info.out_axes, tree_unflatten(traced.out_tree, list(out_avals)), "out_axes", info.label
    )
    return tuple(
        _normalized(d, a.ndim, f"output {i}", "out_axes", info.label)
        for i, (d, a) in enumerate(zip(out_axes, out_avals, strict=True))
    )


@cache_per_jaxpr
def _const_free(jaxpr: Any) -> Any:
    """``jaxpr`` with its constants as leading inputs (the region closes them in again)."""
    return jp.ClosedJaxpr(jp.convert_constvars_jaxpr(jaxpr.jaxpr), ())


def eager_map(info: PmapInfo, *args: Any, **kwargs: Any) -> Any:
    """The map run op by op, for ``jax.disable_jit()`` (jaxlib's dispatcher calls it).

    Nothing is compiled: the function is vectorized over the mapped axis under
    its name, so collectives (``psum``, ``all_gather``, ``axis_index``...) give
    the values the compiled map gives, as jax.pmap's eager mode does.
    """
    statics = {i: args[i] for i in info.binding.static_argnums if i < len(args)}
    dyn_idx = [i for i in range(len(args)) if i not in statics]

    def call(*dyn: Any, **kw: Any) -> Any:
        full = dict(statics) | dict(zip(dyn_idx, dyn, strict=True))
        return info.fun(*(full[i] for i in range(len(args))), **kw)

    mapped = jax.vmap(
        call,
        in_axes=_dynamic_in_axes(info, len(args)),
        out_axes=info.out_axes,
        axis_name=info.axis_name,
        axis_size=info.axis_size,
    )
    return mapped(*(args[i] for i in dyn_idx), **kwargs)


def local_leaves(info: PmapInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call's dynamic leaves, their mapped dims, and how to rebuild the call from leaves
    (NOTE [multi-process pmap])."""
    bound = bind_call(info.binding, args, kwargs)
    flat = bound.flat
    dims = [
        _normalized(d, np.ndim(x), f"argument args{keystr(p)}", "in_axes", info.label)
        for d, x, p in zip(_in_dims(info, bound, len(args)), flat.leaves, flat.paths, strict=True)
    ]
    return flat.leaves, dims, bound.rebuild


@dataclass(frozen=True)
class PmapPlanner(PlannerFromInfo):
    """The :class:`Planner` of a pmap-ed function: its record and the functions above."""

    info: PmapInfo

    @property
    def eager(self) -> Callable[..., Any]:
        return lambda *args, **kwargs: eager_map(self.info, *args, **kwargs)

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
        return plan_pmap_call(self.info, args, kwargs)

    def wrap_call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """In a multi-process job, calls take and give this process's slices."""
        return call if self._slices is None else self._slices.wrap(call)

    @functools.cached_property
    def _slices(self) -> LocalSlices | None:
        """One per map: it remembers which local signatures the processes agreed on."""
        info = self.info
        if not info.multiprocess:
            return None
        return LocalSlices(
            info.label,
            info.axis_name,
            lambda args, kwargs: local_leaves(info, args, kwargs),
            lambda n_local: map_devices(info, n_local),
        )
