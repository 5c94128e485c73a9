"""``pmap``: the second front door. A map over devices, as a pjit whose body is a pmap region.

A call flows: split the static (broadcast) arguments -> flatten with key paths ->
give every leaf its mapped dimension (``in_axes``) -> the axis size and its
devices -> trace the user's function on one device's blocks under the axis
environment (NOTE [pmap region] in ``primitives/pmap_region.py``) -> a ``pjit_p`` over the
one-axis mesh whose body is the region. From there it is pjit's pipeline: the
same dispatcher (C++ fast path, executable cache, events, ``clear_caches``), the
same lowering (the region becomes a manual-SPMD computation) and pjit_p's
transformation rules, which reach the region's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh
from jax.tree_util import PyTreeDef, keystr, tree_unflatten

from . import jax_private as jp
from .dispatch.fastpath import Dispatcher
from .distributed.local_map import LocalSlices, is_multiprocess, job_devices
from .pjit import PjitWrapped
from .primitives.call_plan import CallPlan
from .primitives.pmap_region import RegionParams, block_aval, pmap_region_p, region_pjit
from .sharding.sharding_spec import ShardingSpec, sharding_spec_from_parsed
from .trace.arguments import (
    CallArguments,
    abstractify,
    check_hashable,
    flatten_dynamic,
    index_tuple,
    rebuilder,
    split_arguments,
    statics_key,
)
from .trace.memo import cache_per_jaxpr
from .trace.tracing import enclosing_maps, trace_body


def _axes_per_leaf(axes: Any, tree: Any, what: str, name: str) -> list[int | None]:
    """``axes`` (a pytree prefix of ``tree``, leaves int or None) broadcast to one per leaf.

    Raises:
        ValueError: ``axes`` is not a prefix of ``tree``, or a leaf is not an int or None.
    """
    out: list[int | None] = []

    def expand(axis: Any, subtree: Any) -> None:
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise ValueError(
                f"pmap {name}: {what} leaves must be an int or None, got {axis!r} of type "
                f"{type(axis).__name__}"
            )
        out.extend([None if axis is None else int(axis)] * len(jax.tree_util.tree_leaves(subtree)))

    try:
        jax.tree_util.tree_map(expand, axes, tree, is_leaf=lambda x: x is None)
    except ValueError as e:
        if str(e).startswith(f"pmap {name}"):
            raise
        raise ValueError(
            f"pmap {name}: {what} {axes!r} is not a pytree prefix of the "
            f"{'arguments' if what == 'in_axes' else 'outputs'} "
            f"{jax.tree_util.tree_structure(tree)}: {e}"
        ) from None
    return out


def _check_axes_types(axes: Any, what: str, name: str) -> None:
    """As jax.pmap: every leaf of ``axes`` is exactly an ``int`` (a bool is not) or None.

    Raises:
        TypeError: a leaf of another type (``in_axes=False``, a float, a string...).
    """
    bad = [leaf for leaf in jax.tree_util.tree_leaves(axes) if type(leaf) is not int]
    if bad:
        raise TypeError(
            f"pmap {name}: {what} must be an int, None, or a (nested) container with those "
            f"types as leaves, but got {axes!r} (leaf {bad[0]!r} of type "
            f"{type(bad[0]).__name__}); write 0 to map the leading dimension, None to broadcast"
        )


def _normalized(dim: int | None, ndim: int, where: str, what: str, name: str) -> int | None:
    if dim is None:
        return None
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise ValueError(
            f"pmap {name}: {what} {dim} for {where} of rank {ndim - (what == 'out_axes')} is out "
            f"of range"
        )
    return d


class PmapFunction:
    """The planner behind a pmap-ed function: checks arguments and traces calls."""

    def __init__(
        self,
        fun: Callable[..., Any],
        axis_name: str | None,
        in_axes: Any,
        out_axes: Any,
        static_broadcasted_argnums: int | Sequence[int],
        devices: Sequence[jax.Device] | None,
        backend: str | None,
        axis_size: int | None,
        donate_argnums: int | Sequence[int],
    ) -> None:
        if not callable(fun):
            raise TypeError(f"pmap: expected a callable to map, got {fun!r}")
        self.fun = fun
        self.name = getattr(fun, "__name__", type(fun).__name__)
        if axis_name is not None and not isinstance(axis_name, str):
            raise TypeError(f"pmap {self.name}: axis_name must be a str or None, got {axis_name!r}")
        # An unnamed axis is named after the function, as classic jax.pmap's was: a
        # fresh pmap of the same function then reuses its trace (NOTE [derived jaxpr cache]).
        self.axis_name = axis_name or f"_pmap_{id(fun):x}"
        in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
        _check_axes_types(in_axes, "in_axes", self.name)
        _check_axes_types(out_axes, "out_axes", self.name)
        self._in_axes = in_axes
        self.out_axes = out_axes
        self.api = f"pmap {self.name}"
        self.static_argnums = index_tuple(
            static_broadcasted_argnums, "static_broadcasted_argnums", self.api, negative=False
        )
        self._donate = index_tuple(donate_argnums, "donate_argnums", self.api, negative=False)
        if set(self.static_argnums) & set(self._donate):
            raise ValueError(
                f"pmap {self.name}: arguments {sorted(set(self.static_argnums) & set(self._donate))} are "
                "both static and donated"
            )
        if devices is not None:
            devices = tuple(devices)
            if not devices or not all(isinstance(d, jax.Device) for d in devices):
                raise ValueError(
                    f"pmap {self.name}: devices must be a non-empty sequence of jax.Device, got "
                    f"{devices!r}"
                )
        self._devices = devices
        self._backend = backend
        if axis_size is not None and (not isinstance(axis_size, int) or axis_size < 1):
            raise ValueError(
                f"pmap {self.name}: axis_size must be a positive int, got {axis_size!r}"
            )
        self._axis_size = axis_size
        self._meshes: dict[tuple[int, ...], Mesh] = {}
        self.multiprocess = is_multiprocess()
        self._body = _Body(self)  # what is traced: the function, outputs expanded
        leaves, tree = jax.tree_util.tree_flatten(out_axes, is_leaf=lambda x: x is None)
        self._out_axes_key = (tree, tuple(map(repr, leaves)))

    # --- arguments ---

    def _in_dims(
        self, dyn_args: tuple[Any, ...], dyn_idx: list[int], n_leaves: int
    ) -> list[int | None]:
        """Each flat leaf's mapped dimension (``in_axes``; keyword arguments: 0)."""
        axes = self._in_axes
        if isinstance(axes, tuple) and len(axes) == len(dyn_idx) + len(self.static_argnums):
            axes = tuple(axes[i] for i in dyn_idx)  # in_axes also covers the static arguments
        positional = _axes_per_leaf(axes, dyn_args, "in_axes", self.name)
        return positional + [0] * (n_leaves - len(positional))

    def _mesh(self, n: int) -> Mesh:
        """The one-axis mesh of the first ``n`` devices (the given ones, else local ones)."""
        if self._devices is not None:
            # More devices than the axis: the outer map of a nest takes the devices of
            # the whole nest (checked against the nest in ``_grid``, or ``_check_devices``).
            if len(self._devices) % n:
                self._check_devices(n)
            available = list(self._devices)
        elif jax.process_count() > 1:  # NOTE [multi-process pmap]: global arrays here
            if not self.multiprocess:
                raise ValueError(
                    f"pmap {self.name}: this pmap was made before "
                    "partitioner.distributed.initialize(); in a multi-process job, make it after"
                )
            available = job_devices(n // jax.process_count(), self._backend)
        else:
            available = jax.local_devices(backend=self._backend)
            if n > len(available):
                raise ValueError(
                    f"pmap {self.name}: the mapped axis has size {n}, larger than the "
                    f"{len(available)} available {available[0].platform} devices"
                )
        chosen = available[:n]
        key = tuple(d.id for d in chosen)
        mesh = self._meshes.get(key)
        if mesh is None:
            mesh = self._meshes[key] = Mesh(np.array(chosen), (self.axis_name,))
        return mesh

    def _check_devices(self, n: int) -> None:
        """Raise unless ``devices`` (if given) lists one device per device of the map."""
        if self._devices is not None and n != len(self._devices):
            raise ValueError(
                f"pmap {self.name}: the map needs {n} devices (its mapped axis, times those "
                f"of the maps nested in it), but devices lists {len(self._devices)} devices; "
                "they must be equal"
            )

    def _axis_size_of(self, avals: Sequence[Any], dims: Sequence[int | None], paths: Any) -> int:
        sizes = {
            keystr(path): (a.shape[d], d)
            for a, d, path in zip(avals, dims, paths, strict=True)
            if d is not None
        }
        distinct = {s for s, _ in sizes.values()}
        if len(distinct) > 1:
            listed = ", ".join(f"args{p} has {s} at dimension {d}" for p, (s, d) in sizes.items())
            raise ValueError(f"pmap {self.name}: the mapped axis sizes differ: {listed}")
        if not distinct:
            if self._axis_size is None:
                raise ValueError(
                    f"pmap {self.name}: no argument is mapped (in_axes all None); give axis_size"
                )
            return self._axis_size
        (n,) = distinct
        if self._axis_size is not None and self._axis_size != n:
            raise ValueError(
                f"pmap {self.name}: axis_size={self._axis_size} but the mapped arguments have "
                f"size {n}"
            )
        return n

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
        """Check the arguments, trace the body (cached) and build the pjit over the region."""
        n_args = len(args)
        for i in self.static_argnums:
            if i >= n_args:
                raise ValueError(
                    f"pmap {self.name}: static_broadcasted_argnums={self.static_argnums} but the function "
                    f"was called with {n_args} positional argument(s)"
                )
        split = split_arguments(args, kwargs, set(self.static_argnums), ())
        check_hashable(split.statics, self.api)
        dyn_idx = [i for i in range(n_args) if i not in self.static_argnums]
        flat = flatten_dynamic(split, dyn_idx)
        dims = self._in_dims(split.dynamic_args, dyn_idx, len(flat.leaves))
        leaves, paths, n_pos = flat.leaves, flat.paths, flat.positional
        in_tree = flat.in_tree
        avals = [
            abstractify(leaf, flat.where(i, self.api), "static_broadcasted_argnums")
            for i, leaf in enumerate(leaves)
        ]
        dims = [
            _normalized(d, a.ndim, f"argument args{keystr(p)}", "in_axes", self.name)
            for d, a, p in zip(dims, avals, paths, strict=True)
        ]
        n = self._axis_size_of(avals, dims, paths)
        mesh = self._mesh(n)
        statics = split.statics
        debug_info = jp.debug_info(
            "pmap", self.fun, args, kwargs, static_argnums=list(self.static_argnums)
        )
        body = self._trace(in_tree, statics, avals, dims, n, mesh, debug_info)
        consts, trace_consts = body.const_values
        body_jaxpr = body.jaxpr
        chain = _nested_chain(body_jaxpr, self.name)
        if chain:  # NOTE [nested pmap]
            mesh = self._grid(n, chain)
            body_jaxpr = _placed(body_jaxpr, mesh)
        self._check_devices(mesh.devices.size)
        region = RegionParams(
            body=body_jaxpr,
            axis_name=self.axis_name,
            mesh=mesh,
            in_dims=(None,) * (len(consts) + len(trace_consts)) + tuple(dims),
            out_dims=body.out_dims,
            name=self.name,
        )
        donated = {i for i in self._donate if i < n_args}
        flags = tuple(
            i < n_pos and path[0].idx in donated  # type: ignore[attr-defined]
            for i, path in enumerate(paths)
        )
        params = region_pjit(
            region,
            consts,
            [*map(jp.shaped_abstractify, trace_consts), *avals],
            (False,) * len(trace_consts) + flags,
        )
        if chain:
            # Outputs of nested maps are also split over the inner axes: XLA keeps the
            # layout the inner regions give them (read back after compiling).
            params = params.replace(out_axis_resources=(None,) * len(body.out_dims))
        nested = bool(enclosing_maps())
        return CallPlan(
            params=params,
            args_flat=tuple(trace_consts) + tuple(leaves),
            in_tree=in_tree,
            out_tree=body.out_tree,
            in_avals=tuple(avals),
            num_consts=len(trace_consts),
            nested_bind=(lambda *xs: region.bind(*consts, *xs)) if nested else None,
            arguments=flat,
        )

    def _grid(self, n: int, chain: list[tuple[str, int]]) -> Mesh:
        """The device grid of this map and the maps nested in it (NOTE [nested pmap])."""
        names = (self.axis_name, *(a for a, _ in chain))
        if len(set(names)) != len(names):
            raise ValueError(f"pmap {self.name}: nested maps reuse an axis name: {names}")
        sizes = (n, *(s for _, s in chain))
        total = math.prod(sizes)
        available = (
            list(self._devices)
            if self._devices is not None
            else jax.local_devices(backend=self._backend)
        )
        if total > len(available):
            raise ValueError(
                f"pmap {self.name}: nested maps over {dict(zip(names, sizes))} need {total} "
                f"devices, larger than the {len(available)} available"
            )
        return Mesh(np.array(available[:total]).reshape(sizes), names)

    def _trace(
        self,
        in_tree: PyTreeDef,
        statics: tuple[tuple[int | str, Any], ...],
        avals: list[Any],
        dims: list[int | None],
        n: int,
        mesh: Mesh,
        debug_info: Any,
    ) -> _TracedRegion:
        """The per-device body on blocks, traced under the axis environment."""

        rebuild_args = rebuilder(in_tree, statics)

        def rebuild(blocks: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return rebuild_args(
                [
                    b if d is None else jax.lax.squeeze(b, (d,))
                    for b, d in zip(blocks, dims, strict=True)
                ]
            )

        block_avals = tuple(block_aval(a, d) for a, d in zip(avals, dims, strict=True))
        # Keyed on the user's function (not this wrapper), with what the traced
        # body adds to it (out_axes), so a fresh pmap of the same function reuses it.
        key = (
            in_tree,
            statics_key(statics),
            tuple(dims),
            self.axis_name,
            n,
            self._out_axes_key,
        )
        try:
            with jp.extend_axis_env_nd([(self.axis_name, n)]):
                traced = trace_body(
                    self.fun,
                    rebuild,
                    block_avals,
                    mesh,
                    key,
                    debug_info,
                    call=self._body,
                    axis_name=self.axis_name,
                )
        except NameError as e:
            raise NameError(f"pmap {self.name}: {e}") from None
        out_avals = traced.jaxpr.out_avals
        out_axes = (
            _axes_per_leaf(
                self.out_axes,
                tree_unflatten(traced.out_tree, list(out_avals)),
                "out_axes",
                self.name,
            )
            if traced.out_tree.num_leaves
            else []
        )
        out_dims = tuple(
            _normalized(d, a.ndim, f"output {i}", "out_axes", self.name)
            for i, (d, a) in enumerate(zip(out_axes, out_avals, strict=True))
        )
        jaxpr = traced.jaxpr
        consts = tuple(jaxpr.consts)
        return _TracedRegion(
            _const_free(jaxpr), traced.out_tree, out_dims, (consts, traced.tracer_consts)
        )

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """The map run op by op, for ``jax.disable_jit()`` (jaxlib's dispatcher calls it).

        Nothing is compiled: the function is vectorized over the mapped axis under
        its name, so collectives (``psum``, ``all_gather``, ``axis_index``...) give
        the values the compiled map gives, as jax.pmap's eager mode does.
        """
        statics = {i: args[i] for i in self.static_argnums if i < len(args)}
        dyn_idx = [i for i in range(len(args)) if i not in statics]
        axes = self._in_axes
        if isinstance(axes, tuple) and len(axes) == len(args):
            axes = tuple(axes[i] for i in dyn_idx)  # in_axes also covers the static arguments

        def call(*dyn: Any, **kw: Any) -> Any:
            full = dict(statics) | dict(zip(dyn_idx, dyn, strict=True))
            return self.fun(*(full[i] for i in range(len(args))), **kw)

        mapped = jax.vmap(
            call,
            in_axes=axes,
            out_axes=self.out_axes,
            axis_name=self.axis_name,
            axis_size=self._axis_size,
        )
        return mapped(*(args[i] for i in dyn_idx), **kwargs)

    # --- many processes (NOTE [multi-process pmap]) ---

    def local_leaves(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call's dynamic leaves, their mapped dims, and how to rebuild the call from leaves."""
        split = split_arguments(args, kwargs, set(self.static_argnums), ())
        dyn_idx = [i for i in range(len(args)) if i not in self.static_argnums]
        flat = flatten_dynamic(split, dyn_idx)
        dims = [
            _normalized(d, np.ndim(x), f"argument args{keystr(p)}", "in_axes", self.name)
            for d, x, p in zip(
                self._in_dims(split.dynamic_args, dyn_idx, len(flat.leaves)),
                flat.leaves,
                flat.paths,
                strict=True,
            )
        ]
        return flat.leaves, dims, rebuilder(flat.in_tree, split.statics)

    def map_devices(self, n_local: int) -> list[jax.Device]:
        """The devices of a multi-process map with ``n_local`` entries in each process.

        Raises:
            ValueError: ``devices`` lists another number of this process's devices.
        """
        if self._devices is None:
            return job_devices(n_local, self._backend)
        mine = [d for d in self._devices if d.process_index == jax.process_index()]
        if len(mine) != n_local:
            raise ValueError(
                f"pmap {self.name}: this process passes {n_local} entries of the mapped axis, but "
                f"devices lists {len(mine)} of its devices; they must be equal"
            )
        return list(self._devices)

    def donated_positions(self, n: int) -> list[int]:
        return sorted(i for i in self._donate if i < n)

    def __repr__(self) -> str:
        return f"pmap({self.name})"


class _TracedRegion:
    """A traced per-device body: const-free jaxpr, output tree and dims, the constants."""

    def __init__(
        self, jaxpr: Any, out_tree: PyTreeDef, out_dims: tuple[int | None, ...], consts: Any
    ) -> None:
        self.jaxpr, self.out_tree, self.out_dims, self.const_values = (
            jaxpr,
            out_tree,
            out_dims,
            consts,
        )


class _Body:
    """The user's function with its outputs expanded at ``out_axes`` (the traced function)."""

    def __init__(self, planner: PmapFunction) -> None:
        self.planner = planner
        self.__name__ = planner.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.planner.fun(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten(out)
        axes = _axes_per_leaf(self.planner.out_axes, out, "out_axes", self.planner.name)
        expanded = [
            x if d is None else jax.lax.expand_dims(x, (d if d >= 0 else d + np.ndim(x) + 1,))
            for x, d in zip(leaves, axes, strict=True)
        ]
        return tree_unflatten(tree, expanded)


def _nested_chain(jaxpr: Any, name: str) -> list[tuple[str, int]]:
    """The axes (name, size) of the pmaps nested in ``jaxpr``'s top level, outermost first.

    NOTE [nested pmap]: a pmap called inside a pmap body binds its region there
    (``CallPlan.nested_bind``), over a placeholder mesh of its own devices; the
    outermost map then runs over the grid of all their devices, outer axis
    first (as jax.pmap nests: inner map ``j`` of outer index ``i`` runs on device
    ``i * size_j + j``), and every nested region gets that grid as its mesh.

    Raises:
        ValueError: nested maps of different axes or sizes side by side, or a
            map nested inside control flow (a scan, cond...) of the body.
    """
    chains = []
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            inner = RegionParams.of(eqn.params)
            chains.append([(inner.axis_name, inner.size), *_nested_chain(inner.body, name)])

    if any(c != chains[0] for c in chains[1:]):
        raise ValueError(
            f"pmap {name}: the pmaps nested in it must map the same axes with the same sizes, "
            f"got {chains}"
        )
    if _regions_below(jaxpr.jaxpr):
        raise ValueError(
            f"pmap {name}: a pmap nested inside control flow or a call of its body (scan, "
            "cond, jit...) is not supported; call the inner pmap at the body's top level"
        )
    return chains[0] if chains else []


def _regions_below(jaxpr: Any) -> bool:
    """Whether a pmap region sits in a sub-jaxpr (control flow, a call) of ``jaxpr``."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            continue
        for sub in jp.jaxprs_in_params(eqn.params):
            if any(e.primitive is pmap_region_p for e in sub.eqns) or _regions_below(sub):
                return True
    return False


@cache_per_jaxpr
def _const_free(jaxpr: Any) -> Any:
    """``jaxpr`` with its constants as leading inputs (the region closes them in again)."""
    return jp.ClosedJaxpr(jp.convert_constvars_jaxpr(jaxpr.jaxpr), ())


@cache_per_jaxpr
def _placed(jaxpr: Any, mesh: Mesh) -> Any:
    """``jaxpr`` with every nested region (at any depth of nesting) over ``mesh``."""
    eqns = []
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is pmap_region_p:
            inner = RegionParams.of(eqn.params)
            eqn = eqn.replace(
                params=inner.replace(mesh=mesh, body=_placed(inner.body, mesh)).as_kwargs()
            )
        eqns.append(eqn)
    return jp.ClosedJaxpr(jaxpr.jaxpr.replace(eqns=eqns), jaxpr.consts)


class PmapWrapped(PjitWrapped):
    """What :func:`partitioner.pmap` returns (NOTE [pjit callable]: the same mechanics)."""

    _kind = "pmap"

    def _cache_size(self) -> int:
        """jax.pmap's spelling of :meth:`cache_size` (classic code reads it)."""
        return self.cache_size()


def pmap(
    fun: Callable[..., Any],
    axis_name: str | None = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: int | Sequence[int] = (),
    devices: Sequence[jax.Device] | None = None,
    backend: str | None = None,
    axis_size: int | None = None,
    donate_argnums: int | Sequence[int] = (),
) -> PmapWrapped:
    """Map ``fun`` over the leading (``in_axes``) dimension of its arguments, one slice per device.

    The semantics of ``jax.pmap``: collectives over ``axis_name`` inside,
    ``in_axes``/``out_axes`` pytree prefixes with ``None`` for broadcast inputs and
    unmapped outputs, keyword arguments mapped over their leading dimension. The
    outputs are ``jax.Array``s laid out one slice per device
    (``partitioner.sharding_spec_of`` gives their ``ShardingSpec``).
    """
    planner = PmapFunction(
        fun,
        axis_name,
        in_axes,
        out_axes,
        static_broadcasted_argnums,
        devices,
        backend,
        axis_size,
        donate_argnums,
    )
    dispatcher = Dispatcher(
        planner.name,
        planner.fun,
        planner.plan,
        planner.donated_positions,
        CallArguments(planner.api, planner.static_argnums, ()),
        eager=planner.eager,
    )
    wrapped = cast(PmapWrapped, PmapWrapped.make(planner, dispatcher))
    if planner.multiprocess:  # NOTE [multi-process pmap]
        slices = LocalSlices(
            planner.api, planner.axis_name, planner.local_leaves, planner.map_devices
        )
        replace = dispatcher.replace_call
        assert replace is not None  # set by PmapWrapped.make

        def outermost(make_call: Callable[[Any], Callable[..., Any]]) -> None:
            replace(lambda cpp: slices.wrap(make_call(cpp)))

        dispatcher.replace_call = outermost
        outermost(lambda cpp: cpp)
    return wrapped


def sharding_spec_of(x: jax.Array) -> ShardingSpec:
    """The pmap-style ``ShardingSpec`` of ``x``'s layout (a pmap output's: one slice per device).

    Raises:
        ValueError: ``x`` is not laid out by a NamedSharding over a mesh.
    """
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or not isinstance(sharding.mesh, Mesh):
        raise ValueError(
            f"sharding_spec_of: expected a jax.Array laid out by a NamedSharding over a mesh, got "
            f"{sharding if sharding is not None else type(x).__name__}"
        )
    return sharding_spec_from_parsed(tuple(x.shape), sharding.spec, sharding.mesh)
