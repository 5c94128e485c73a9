"""``pjit``: the front door. Arguments in, specs checked, body traced, primitive bound.

A call flows: bind arguments to the signature -> split static / dynamic ->
read the mesh in context -> flatten with key paths -> broadcast the spec
prefixes -> check specs against the mesh and shapes -> trace (cached) ->
``pjit_p.bind`` (eager: compile + run; under a transformation: its rule).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import Mesh
from jax.tree_util import KeyPath, keystr, tree_leaves, tree_unflatten

from . import jax_private as jp
from . import options
from . import registry as _registry  # noqa: F401  (installs every primitive's rules)
from .auto.resolve import clear as clear_auto_choices
from .auto.resolve import has_auto, resolve
from .dispatch import clear_caches as clear_dispatch_caches
from .dispatch.execute import check_usable
from .dispatch.fastpath import Dispatcher
from .primitives.call_plan import CallPlan
from .primitives.pjit_call import PjitParams
from .sharding.auto import AUTO
from .sharding.checks import check_specs
from .sharding.leaves import check_layouts, resolve_inputs
from .sharding.mesh_env import has_explicit_axes, maybe_current_mesh, resolve_mesh
from .sharding.parsed import REPLICATED, ParsedPartitionSpec
from .sharding.placement import (
    Placement,
    check_committed_layout,
    placement_from_arguments,
    unspecified_input_spec,
)
from .sharding.tree import UNSPECIFIED, broadcast_prefix, meshes_named_by, prepare_axis_resources
from .stages import Lowered, Traced, lower_plan
from .trace.arguments import (
    CallArguments,
    FlatArguments,
    SplitArguments,
    abstractify,
    check_hashable,
    flatten_dynamic,
    infer_argnums_and_argnames,
    optional_index_tuple,
    optional_name_tuple,
    rebuilder,
    split_arguments,
    statics_key,
)
from .trace.tracing import TracedBody, check_mesh_unchanged, trace_body


@dataclass(frozen=True)
class _Bound:
    """A call's arguments, bound to the signature and split into static and dynamic."""

    args: tuple[Any, ...]  # positional, keyword arguments for positional parameters moved in
    kwargs: dict[str, Any]
    split: SplitArguments
    dyn_idx: list[int]  # positions of the dynamic positional arguments
    donate: set[int]
    donate_kw: set[str]


@dataclass(frozen=True)
class _Flat:
    """The dynamic arguments flattened: one spec, aval and donation flag per leaf."""

    arguments: FlatArguments
    # None: a tracer's layout, left to XLA; AUTO: chosen after tracing (``_src/auto/``)
    specs: tuple[ParsedPartitionSpec | None, ...]
    avals: tuple[Any, ...]
    donated: tuple[bool, ...]


def _has_bare_specs(parsed_tree: Any) -> bool:
    """Whether a parsed spec tree has a leaf that needs a mesh in context (not UNSPECIFIED)."""
    leaves = tree_leaves(parsed_tree, is_leaf=lambda x: x is UNSPECIFIED)
    return any(leaf is not UNSPECIFIED for leaf in leaves)


class PjitFunction:
    """The planner behind a pjit-ed function: checks arguments and traces calls.

    Users hold the :class:`PjitWrapped` :func:`pjit` returns; its calls go to
    the dispatcher (``dispatch/fastpath.py``), which asks this planner for a
    :class:`CallPlan` on a miss.
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axis_resources: Any,
        out_axis_resources: Any,
        static_argnums: int | Sequence[int] | None = None,
        donate_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Iterable[str] | None = None,
        donate_argnames: str | Iterable[str] | None = None,
        *,
        kind: str = "pjit",
        device: Any = None,
        compiler_options: dict[str, Any] | None = None,
        auto_memory_limit: int | None = None,
    ) -> None:
        """See :func:`pjit`; ``kind`` is ``"jit"`` for :func:`partitioner.jit`, where a
        ``None`` spec means unspecified, and ``device`` is ``jit(device=...)``."""
        if not callable(fun):
            raise TypeError(
                f"{kind}: expected a callable to partition, got {fun!r} of type "
                f"{type(fun).__name__}"
            )
        self.fun = fun
        self.kind = kind
        self._device = device
        if compiler_options is not None and not isinstance(compiler_options, dict):
            raise TypeError(
                f"{kind}: compiler_options must be a dict of XLA option names to values, got "
                f"{type(compiler_options).__name__}"
            )
        if auto_memory_limit is not None and (
            isinstance(auto_memory_limit, bool)
            or not isinstance(auto_memory_limit, int)
            or auto_memory_limit <= 0
        ):
            raise TypeError(
                f"{kind}: auto_memory_limit must be a positive int (bytes per device), got "
                f"{auto_memory_limit!r}"
            )
        self._memory_limit = auto_memory_limit
        # Hashable, so they key the executable cache beside the program.
        self._compiler_options = tuple(sorted((compiler_options or {}).items()))
        in_name, out_name = (
            ("in_shardings", "out_shardings")
            if kind == "jit"
            else ("in_axis_resources", "out_axis_resources")
        )
        if isinstance(in_axis_resources, list):
            # The top level stands for the argument tuple, so a list there is read
            # as that tuple (as jax.jit reads in_shardings); lists deeper down
            # match lists.
            in_axis_resources = tuple(in_axis_resources)
        # Under a mesh pjit reads None as replicated (the seed's meaning); jit reads
        # it as unspecified, and so does pjit with no mesh anywhere (as jax's does).
        jit = kind == "jit"
        self._in_specs = prepare_axis_resources(
            in_axis_resources, f"{kind} {in_name}", none_is_unspecified=jit, allow_auto=True
        )
        self._out_specs = prepare_axis_resources(
            out_axis_resources, f"{kind} {out_name}", none_is_unspecified=jit, allow_auto=True
        )
        self._meshless_specs = (
            prepare_axis_resources(
                in_axis_resources, in_name, none_is_unspecified=True, allow_auto=True
            ),
            prepare_axis_resources(
                out_axis_resources, out_name, none_is_unspecified=True, allow_auto=True
            ),
        )
        self._needs_mesh = any(map(_has_bare_specs, self._meshless_specs))
        self._named_meshes = meshes_named_by(
            in_axis_resources, f"{kind} {in_name}"
        ) + meshes_named_by(out_axis_resources, f"{kind} {out_name}")
        try:
            self._signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self._signature = None
        name = getattr(fun, "__name__", type(fun).__name__)
        self._static_argnums, self._static_argnames = infer_argnums_and_argnames(
            self._signature,
            optional_index_tuple(static_argnums, "static_argnums", kind),
            optional_name_tuple(static_argnames, "static_argnames", kind),
            f"{kind} {name}",
            "static",
        )
        self._donate_argnums, self._donate_argnames = infer_argnums_and_argnames(
            self._signature,
            optional_index_tuple(donate_argnums, "donate_argnums", kind),
            optional_name_tuple(donate_argnames, "donate_argnames", kind),
            f"{kind} {name}",
            "donate",
        )
        overlap: set[Any] = set(self._static_argnums) & set(self._donate_argnums)
        overlap |= set(self._static_argnames) & set(self._donate_argnames)
        if overlap:
            raise ValueError(
                f"{kind}: arguments {sorted(overlap, key=str)} are both static and donated; a "
                "static argument has no buffer to donate."
            )
        self.name = getattr(fun, "__name__", type(fun).__name__)
        self.api = f"{kind} {self.name}"
        self._donated_positions: dict[int, list[int]] = {}  # by number of positional args

    def _positional_params(self) -> list[inspect.Parameter]:
        params = list(self._signature.parameters.values()) if self._signature else []
        return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def call_arguments(self) -> CallArguments:
        """How the dispatcher reads raw calls (statics completed as :meth:`cpp_statics`)."""
        nums, names = self.cpp_statics()
        return CallArguments(self.api, nums, names)

    def cpp_statics(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Static positions (for arguments passed positionally) and names (passed by
        keyword), as jaxlib's dispatcher and jax.jit apply them."""
        return self._static_argnums, self._static_argnames

    # --- arguments ---

    def _bind_signature(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Move keyword arguments that name positional parameters into ``args``."""
        if not kwargs or self._signature is None:
            return args, kwargs
        bound = self._signature.bind(*args, **kwargs)
        return tuple(bound.args), dict(bound.kwargs)

    def _select(
        self, nums: tuple[int, ...], names: tuple[str, ...], n_raw: int, n: int, kwargs: Any
    ) -> tuple[set[int], set[str]]:
        """Which bound positions and keywords ``nums``/``names`` pick (as jax.jit does):
        positions among the arguments passed positionally (the first ``n_raw``), names
        among those passed by keyword (bound to positions ``n_raw..n`` or left in
        ``kwargs``)."""
        positional = self._positional_params()
        picked = {i for i in nums if i < n_raw}
        picked |= {i for i in range(n_raw, n) if positional[i].name in names}
        return picked, {k for k in kwargs if k in names}

    def _bind_and_split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Bound:
        """Bind keyword arguments, then separate static from dynamic arguments."""
        n_raw = len(args)
        args, kwargs = self._bind_signature(args, kwargs)
        n = len(args)
        static, static_kw = self._select(
            self._static_argnums, self._static_argnames, n_raw, n, kwargs
        )
        donate, donate_kw = self._select(
            self._donate_argnums, self._donate_argnames, n_raw, n, kwargs
        )
        split = split_arguments(args, kwargs, static, static_kw)
        check_hashable(split.statics, self.api)
        return _Bound(
            args=args,
            kwargs=kwargs,
            split=split,
            dyn_idx=[i for i in range(n) if i not in static],
            donate=donate,
            donate_kw=donate_kw,
        )

    def _placement(self, flat: FlatArguments) -> Placement:
        """The mesh in context (or named by the specs), else the arguments' devices."""
        if self._named_meshes or maybe_current_mesh() is not None or self._needs_mesh:
            return Placement(resolve_mesh(self.api, self._named_meshes))
        where = [flat.name(i) for i in range(len(flat.leaves))]
        return placement_from_arguments(self.api, flat.leaves, where, self._device)

    def _flatten(self, bound: _Bound, flat: FlatArguments, mesh: Mesh, in_specs: Any) -> _Flat:
        """Give each flat leaf a spec (an omitted one: its own layout), an aval, and check."""
        arg_specs, _ = broadcast_prefix(
            in_specs,
            bound.split.dynamic_args,
            api=f"{self.api} in_axis_resources",
            what="positional arguments",
        )
        n_pos = flat.positional
        specs: list[ParsedPartitionSpec | None] = []
        for i, leaf in enumerate(flat.leaves):
            where = flat.where(i, self.api)
            check_usable(leaf, mesh, where)
            spec = arg_specs[i] if i < n_pos else REPLICATED
            if spec is UNSPECIFIED:
                specs.append(unspecified_input_spec(leaf, mesh, where, self.api))
            elif spec is AUTO:
                specs.append(AUTO)  # checked once chosen (plan)
            else:
                if not options.reshard_committed_enabled():
                    check_committed_layout(leaf, spec, mesh, where, self.api)
                specs.append(spec)
        typed = has_explicit_axes(mesh)
        avals = tuple(
            abstractify(
                leaf, flat.where(i, self.api), "static_argnums/static_argnames", typed=typed
            )
            for i, leaf in enumerate(flat.leaves)
        )
        # None: a tracer's layout, XLA's; AUTO: not chosen yet
        given = [i for i, s in enumerate(specs) if s is not None and s is not AUTO]
        check_specs(
            self.api,
            "argument args",
            [specs[i] for i in given],  # type: ignore[misc]
            [flat.paths[i] for i in given],
            [avals[i].shape for i in given],
            mesh,
        )
        # Memory kinds and layouts, checked against the arguments (sharding/leaves.py).
        resolved, resolved_avals = resolve_inputs(
            self.api,
            [specs[i] for i in given],  # type: ignore[misc]
            [flat.leaves[i] for i in given],
            [avals[i] for i in given],
            lambda k: flat.where(given[k], self.api),
            mesh,
        )
        avals_list = list(avals)
        for k, i in enumerate(given):
            specs[i], avals_list[i] = resolved[k], resolved_avals[k]
        avals = tuple(avals_list)
        donated = tuple(
            path[0].idx in bound.donate if i < n_pos else path[0].key in bound.donate_kw  # type: ignore[attr-defined]
            for i, path in enumerate(flat.paths)
        )
        return _Flat(flat, tuple(specs), avals, donated)

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
        """Check the arguments, trace the body (cached) and build ``pjit_p``'s params."""
        bound = self._bind_and_split(args, kwargs)
        arguments = flatten_dynamic(bound.split, bound.dyn_idx)
        placement = self._placement(arguments)
        mesh = placement.mesh
        check_mesh_unchanged(mesh, self.api)
        # With no mesh anywhere, None specs are unspecified (as jax reads them).
        in_specs, out_specs = (
            self._meshless_specs if placement.derived else (self._in_specs, self._out_specs)
        )
        flat = self._flatten(bound, arguments, mesh, in_specs)
        static_vals = bound.split.statics
        in_tree = flat.arguments.in_tree
        rebuild = rebuilder(in_tree, static_vals)
        trace_key = (in_tree, statics_key(static_vals))
        debug_info = jp.debug_info(
            self.kind,
            self.fun,
            bound.args,
            bound.kwargs,
            static_argnums=[i for i, _ in static_vals if isinstance(i, int)],
            static_argnames=[k for k, _ in static_vals if isinstance(k, str)],
            signature=self._signature,
        )
        traced = trace_body(self.fun, rebuild, flat.avals, mesh, trace_key, debug_info)
        consts = traced.tracer_consts
        out_specs_flat, out_paths = self._out_specs_for(traced, mesh, out_specs)
        params = PjitParams(
            jaxpr=traced.jaxpr,
            in_axis_resources=(REPLICATED,) * len(consts) + flat.specs,
            out_axis_resources=out_specs_flat,
            mesh=mesh,
            donated_invars=(False,) * len(consts) + flat.donated,
            name=self.name,
            api=self.kind,
            committed=placement.committed,
            compiler_options=self._compiler_options,
        )
        plan = CallPlan(
            params=params,
            args_flat=tuple(consts) + tuple(flat.arguments.leaves),
            in_tree=in_tree,
            out_tree=traced.out_tree,
            in_avals=flat.avals,
            num_consts=len(consts),
            arguments=flat.arguments,
        )
        if has_auto(params.in_axis_resources) or has_auto(params.out_axis_resources):
            plan = self._resolve_auto(plan, flat, out_paths)
        return plan

    def _resolve_auto(self, plan: CallPlan, flat: _Flat, out_paths: list[KeyPath]) -> CallPlan:
        """Choose the AUTO specs (``_src/auto/``), then check the arguments against them
        as against any spec."""
        plan = resolve(plan, flat.arguments.paths, out_paths, self._memory_limit)
        n_consts = plan.num_consts
        if not options.reshard_committed_enabled():
            for i, spec in enumerate(flat.specs):
                if spec is AUTO:
                    chosen = plan.params.in_axis_resources[n_consts + i]
                    assert chosen is not None  # resolve() chose a spec for every AUTO leaf
                    where = flat.arguments.where(i, self.api)
                    check_committed_layout(
                        flat.arguments.leaves[i], chosen, plan.mesh, where, self.api
                    )
        return plan

    def _out_specs_for(
        self, traced: TracedBody, mesh: Mesh, out_specs: Any
    ) -> tuple[tuple[ParsedPartitionSpec | None, ...], list[KeyPath]]:
        """One spec per output leaf (an omitted one is None: XLA propagates a layout; AUTO
        stays for the plan to choose), and each leaf's key path."""
        out_avals = traced.jaxpr.out_avals
        outs = tree_unflatten(traced.out_tree, list(out_avals))
        specs, paths = broadcast_prefix(
            out_specs, outs, api=f"{self.api} out_axis_resources", what="outputs"
        )
        given = [i for i, s in enumerate(specs) if s is not UNSPECIFIED and s is not AUTO]
        check_specs(
            self.api,
            "output",
            [specs[i] for i in given],
            [paths[i] for i in given],
            [out_avals[i].shape for i in given],
            mesh,
        )
        check_layouts(
            self.api,
            [specs[i] for i in given],
            [out_avals[i] for i in given],
            lambda k: f"{self.api} output{keystr(paths[given[k]])}",
        )
        return tuple(None if s is UNSPECIFIED else s for s in specs), paths

    def donated_positions(self, n: int) -> list[int]:
        """Positions of the donated arguments in a call with ``n`` positional arguments."""
        positions = self._donated_positions.get(n)
        if positions is None:
            positions = self._donated_positions[n] = [i for i in self._donate_argnums if i < n]
        return positions

    def __repr__(self) -> str:
        return f"{self.kind}({self.name})"


class PjitWrapped:
    """What :func:`partitioner.pjit` returns: call it, ``.lower(...)`` it.

    NOTE [pjit callable]: a call must go straight into jaxlib's C++ dispatcher,
    yet the object must not *be* jaxlib's dispatcher class: jax treats that
    class as its own ``jax.jit`` (``jax.eval_shape`` reads its internals), and
    wrappers such as ``jax.jit``/``jax.vmap`` copy instance attributes like
    ``lower`` onto themselves. So each pjit-ed function gets a tiny subclass
    whose ``__call__`` *is* the C++ callable (a staticmethod: no Python frame
    on the hot path), and ``lower``/``clear_cache`` are ordinary methods that
    wrappers do not copy. The dispatcher may replace that ``__call__`` by a
    guard (NOTE [guarded C++ calls] in ``dispatch/fastpath.py``).
    """

    _planner: Any  # the front door's planner (PjitFunction here)
    _dispatcher: Dispatcher

    if TYPE_CHECKING:  # each subclass's __call__ is the C++ callable (or its guard)

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    _kind = "pjit"

    @classmethod
    def make(cls, planner: Any, dispatcher: Dispatcher) -> PjitWrapped:
        """The callable for ``planner`` (a front door's planner: ``name``, ``fun``, ``plan``)."""
        cpp = dispatcher.take_cpp()
        sub = type(
            f"{cls._kind}[{planner.name}]",
            (cls,),
            {"__call__": staticmethod(cpp), "__slots__": ()},
        )
        self: PjitWrapped = object.__new__(sub)
        object.__setattr__(self, "_planner", planner)
        object.__setattr__(self, "_dispatcher", dispatcher)
        functools.update_wrapper(self, planner.fun)  # type: ignore[arg-type]
        # A weak reference: the class holds the C++ callable, which holds the
        # dispatcher; a strong one back would keep a dropped function alive.
        cls_ref = weakref.ref(sub)

        def replace_call(make_call: Callable[[Any], Callable[..., Any]]) -> None:
            live = cls_ref()
            if live is not None:
                live.__call__ = staticmethod(make_call(cpp))  # type: ignore[method-assign]

        dispatcher.replace_call = replace_call
        return self

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower for these arguments (arrays or ``jax.ShapeDtypeStruct``s)."""
        return lower_plan(self._planner.plan(args, kwargs))

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Trace for these arguments (arrays or ``jax.ShapeDtypeStruct``s): the jaxpr, then ``.lower()``."""
        return Traced(self._planner.plan(args, kwargs))

    def clear_cache(self) -> None:
        """Forget this function's fast-path entries (executables stay in the shared cache)."""
        self._dispatcher.clear()

    def cache_size(self) -> int:
        """How many call signatures this function has cached (emptied by :meth:`clear_cache`)."""
        return self._dispatcher.cache_size()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Decorated methods bind like plain functions.
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<{self._kind}-ed function {self._planner.name}>"


def clear_caches() -> None:
    """Drop every cached trace, AUTO choice, executable and fast-path entry.

    The next call of any pjit-ed function traces, chooses its AUTO layouts, lowers
    and compiles again. Pending launches in the CPU collective window are waited
    for first.
    """
    clear_dispatch_caches()
    clear_auto_choices()


def _one_of(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of a spec argument given under its name or its jax.jit-style alias.

    Raises:
        TypeError: both spellings were given.
    """
    if value is not UNSPECIFIED and alias_value is not UNSPECIFIED:
        raise TypeError(
            f"pjit: {name} and {alias} are two names for the same argument; pass only one."
        )
    return value if value is not UNSPECIFIED else alias_value


def device_option(device: Any, backend: str | None, keep_unused: Any, inline: Any, api: str) -> Any:
    """Check jax.jit's placement options; the device a mesh-less call defaults to (or None).

    ``keep_unused`` and ``inline`` are accepted as jax.jit's: unused inputs are
    always kept (docs/api.md), and inlining is a property of the caller's jaxpr.

    Raises:
        TypeError: ``device`` is not a jax.Device, or a flag is not a bool.
        ValueError: both ``device`` and ``backend``, or an unknown backend.
    """
    for name, flag in (("keep_unused", keep_unused), ("inline", inline)):
        if not isinstance(flag, bool):
            raise TypeError(f"{api}: {name} must be a bool, got {flag!r}")
    if device is not None and backend is not None:
        raise ValueError(f"{api}: pass device or backend, not both (got {device}, {backend!r})")
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"{api}: device must be a jax.Device, got {device!r}")
    if backend is not None:
        try:
            return jax.devices(backend)[0]
        except RuntimeError as e:
            raise ValueError(f"{api}: backend {backend!r} is not available: {e}") from None
    return device


def make_wrapped(cls: type[PjitWrapped], planner: PjitFunction) -> PjitWrapped:
    """The callable users hold: the planner behind jaxlib's C++ dispatcher."""
    dispatcher = Dispatcher(
        planner.name,
        planner.fun,
        planner.plan,
        planner.donated_positions,
        planner.call_arguments(),
    )
    return cls.make(planner, dispatcher)


def pjit(
    fun: Callable[..., Any],
    in_axis_resources: Any = UNSPECIFIED,
    out_axis_resources: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    *,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    in_shardings: Any = UNSPECIFIED,
    out_shardings: Any = UNSPECIFIED,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
    auto_memory_limit: int | None = None,
) -> PjitWrapped:
    """Partition ``fun`` over the mesh in context at each call.

    Args:
        fun: the function; arguments and results are pytrees of arrays.
        in_axis_resources: a pytree prefix of the tuple of *dynamic* positional
            arguments (static ones removed): a single spec/None for all, or one
            entry per argument (a top-level list counts as that tuple).
            Keyword-only arguments are replicated. Leaves are PartitionSpecs,
            ``None`` (replicated), NamedShardings (their spec; their mesh must be
            the mesh in context, and is used when there is none) or
            ``partitioner.AUTO`` (partitioner chooses the layout over the mesh in
            context when the call is lowered; ``Lowered.report()`` shows why). Omitted: every
            argument as it is laid out (a committed array keeps its layout, an
            uncommitted one is replicated). With no mesh in context and no
            PartitionSpec given, the call runs on its committed arguments'
            devices (else the default device) and ``None`` means unspecified, as
            in jax.
        out_axis_resources: a pytree prefix of the output, with the same leaves.
            Omitted: as XLA's sharding propagation lays each output out.
        static_argnums: positional arguments traced as Python constants.
        donate_argnums: positional arguments whose buffers the output may reuse.
        static_argnames: the same as ``static_argnums``, by parameter name.
        donate_argnames: the same as ``donate_argnums``, by parameter name.
        in_shardings: today's ``jax.jit`` spelling of ``in_axis_resources`` (pass one).
        out_shardings: today's ``jax.jit`` spelling of ``out_axis_resources`` (pass one).
        keep_unused: as in ``jax.jit`` (see :func:`partitioner.jit`).
        device: as in ``jax.jit``.
        backend: as in ``jax.jit``.
        inline: as in ``jax.jit``.
        compiler_options: as in ``jax.jit``: XLA options by name for every compile.
        auto_memory_limit: bytes per device the program must fit (arguments +
            outputs + temporaries - aliased, as XLA's memory analysis counts them)
            when partitioner chooses AUTO layouts; ``None``: no limit.

    Returns:
        PjitWrapped: call it to run, ``.lower(...)`` for the AOT stages,
        ``.clear_cache()`` to drop its fast-path entries.
    """
    in_axis_resources = _one_of(
        "in_axis_resources", in_axis_resources, "in_shardings", in_shardings
    )
    out_axis_resources = _one_of(
        "out_axis_resources", out_axis_resources, "out_shardings", out_shardings
    )
    planner = PjitFunction(
        fun,
        in_axis_resources,
        out_axis_resources,
        static_argnums,
        donate_argnums,
        static_argnames,
        donate_argnames,
        device=device_option(device, backend, keep_unused, inline, "pjit"),
        compiler_options=compiler_options,
        auto_memory_limit=auto_memory_limit,
    )
    return make_wrapped(PjitWrapped, planner)
