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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jax.sharding import Mesh
from jax.tree_util import (
    keystr,
    tree_unflatten,
)

from . import jax_private as jp
from . import rules as _rules  # noqa: F401  (registers the transformation rules)
from .dispatch.execute import check_usable
from .dispatch.fastpath import Dispatcher
from .spec.checks import check_specs
from .spec.mesh_env import resolve_mesh
from .spec.parsed import REPLICATED, ParsedPartitionSpec
from .spec.placement import check_layouts, resolve_inputs
from .spec.tree import broadcast_prefix, meshes_named_by, prepare_axis_resources
from .stages import Lowered, lower_plan
from .trace.arguments import (
    CallArguments,
    FlatArguments,
    SplitArguments,
    abstractify,
    check_hashable,
    flatten_dynamic,
    index_tuple,
    name_tuple,
    rebuilder,
    split_arguments,
    statics_key,
)
from .trace.plan import CallPlan
from .trace.primitive import PjitParams
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
    specs: tuple[ParsedPartitionSpec, ...]
    avals: tuple[Any, ...]
    donated: tuple[bool, ...]


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
        static_argnums: int | Sequence[int] | None = (),
        donate_argnums: int | Sequence[int] | None = (),
        static_argnames: str | Sequence[str] | None = (),
        donate_argnames: str | Sequence[str] | None = (),
    ) -> None:
        if not callable(fun):
            raise TypeError(
                f"pjit: expected a callable to partition, got {fun!r} of type {type(fun).__name__}"
            )
        self.fun = fun
        if isinstance(in_axis_resources, list):
            # The top level stands for the argument tuple, so a list there is read
            # as that tuple (as jax.jit reads in_shardings); lists deeper down
            # match lists.
            in_axis_resources = tuple(in_axis_resources)
        self._in_specs = prepare_axis_resources(in_axis_resources, "pjit in_axis_resources")
        self._out_specs = prepare_axis_resources(out_axis_resources, "pjit out_axis_resources")
        self._named_meshes = meshes_named_by(
            in_axis_resources, "pjit in_axis_resources"
        ) + meshes_named_by(out_axis_resources, "pjit out_axis_resources")
        self._static_argnums = index_tuple(static_argnums, "static_argnums", "pjit")
        self._donate_argnums = index_tuple(donate_argnums, "donate_argnums", "pjit")
        self._static_argnames = name_tuple(static_argnames, "static_argnames", "pjit")
        self._donate_argnames = name_tuple(donate_argnames, "donate_argnames", "pjit")
        overlap = set(self._static_argnums) & set(self._donate_argnums)
        if overlap:
            raise ValueError(
                f"pjit: arguments {sorted(overlap)} are both static and donated; a static argument has no buffer to donate."
            )
        try:
            self._signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self._signature = None
        self.name = getattr(fun, "__name__", type(fun).__name__)
        self.api = f"pjit {self.name}"
        self._donated_positions: dict[int, list[int]] = {}  # by number of positional args

    def _positional_params(self) -> list[inspect.Parameter]:
        params = list(self._signature.parameters.values()) if self._signature else []
        return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def call_arguments(self) -> CallArguments:
        """How the dispatcher reads raw calls (statics completed as :meth:`cpp_statics`)."""
        nums, names = self.cpp_statics()
        return CallArguments(self.api, nums, names)

    def cpp_statics(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Static positions and names for the C++ dispatcher, each completed from the other.

        jaxlib's dispatcher treats positional and keyword static arguments
        separately, so a parameter named in ``static_argnames`` but passed
        positionally (or the reverse) must be listed both ways.
        """
        nums = {i for i in self._static_argnums if i >= 0}
        names = set(self._static_argnames)
        params = list(self._signature.parameters.values()) if self._signature else []
        positional = self._positional_params()
        for i in list(nums):
            if i < len(positional) and positional[i].kind is positional[i].POSITIONAL_OR_KEYWORD:
                names.add(positional[i].name)
        for i, p in enumerate(positional):
            if p.name in names:
                nums.add(i)
        if any(i < 0 for i in self._static_argnums):
            if not positional or any(p.kind is p.VAR_POSITIONAL for p in params):
                raise ValueError(
                    f"pjit {self.name}: negative static_argnums need a function with a fixed number of positional parameters"
                )
            nums |= {i + len(positional) for i in self._static_argnums if i < 0}
        return tuple(sorted(nums)), tuple(sorted(names))

    # --- arguments ---

    def _bind_signature(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Move keyword arguments that name positional parameters into ``args``."""
        if not kwargs or self._signature is None:
            return args, kwargs
        bound = self._signature.bind(*args, **kwargs)
        return tuple(bound.args), dict(bound.kwargs)

    def _argnums_for_names(self, names: tuple[str, ...]) -> tuple[set[int], set[str]]:
        positions: set[int] = set()
        keywords: set[str] = set()
        params = list(self._signature.parameters.values()) if self._signature else []
        for name in names:
            for i, p in enumerate(params):
                if p.name == name and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    positions.add(i)
                    break
            else:
                keywords.add(name)
        return positions, keywords

    def _normalized_argnums(self, nums: tuple[int, ...], n: int, what: str) -> set[int]:
        out = set()
        for i in nums:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise ValueError(
                    f"pjit {self.name}: {what}={nums} but the function was called with {n} positional "
                    f"argument(s); every index must be < {n}. Pass the argument positionally or drop it "
                    f"from {what}."
                )
            out.add(j)
        return out

    def _bind_and_split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Bound:
        """Bind keyword arguments, then separate static from dynamic arguments."""
        args, kwargs = self._bind_signature(args, kwargs)
        n = len(args)
        static_pos_names, static_kw = self._argnums_for_names(self._static_argnames)
        donate_pos_names, donate_kw = self._argnums_for_names(self._donate_argnames)
        static = self._normalized_argnums(self._static_argnums, n, "static_argnums")
        static |= {i for i in static_pos_names if i < n}
        donate = self._normalized_argnums(self._donate_argnums, n, "donate_argnums")
        donate |= {i for i in donate_pos_names if i < n}
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

    def _flatten(self, bound: _Bound, mesh: Mesh) -> _Flat:
        """Flatten the dynamic arguments with key paths, give each leaf a spec, check them."""
        split = bound.split
        flat = flatten_dynamic(split, bound.dyn_idx)
        arg_specs, _ = broadcast_prefix(
            self._in_specs,
            split.dynamic_args,
            api=f"{self.api} in_axis_resources",
            what="positional arguments",
        )
        n_pos = flat.positional
        specs = tuple(arg_specs) + (REPLICATED,) * (len(flat.leaves) - n_pos)
        for i, leaf in enumerate(flat.leaves):
            check_usable(leaf, mesh, flat.where(i, self.api))
        avals = tuple(
            abstractify(leaf, flat.where(i, self.api), "static_argnums/static_argnames")
            for i, leaf in enumerate(flat.leaves)
        )
        check_specs(self.api, "argument args", specs, flat.paths, [a.shape for a in avals], mesh)
        specs, avals = resolve_inputs(
            self.api, specs, flat.leaves, avals, lambda i: flat.where(i, self.api), mesh
        )
        donated = tuple(
            path[0].idx in bound.donate if i < n_pos else path[0].key in bound.donate_kw  # type: ignore[attr-defined]
            for i, path in enumerate(flat.paths)
        )
        return _Flat(flat, specs, avals, donated)

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPlan:
        """Check the arguments, trace the body (cached) and build ``pjit_p``'s params."""
        mesh = resolve_mesh(self.api, self._named_meshes)
        check_mesh_unchanged(mesh, self.api)
        bound = self._bind_and_split(args, kwargs)
        flat = self._flatten(bound, mesh)
        static_vals = bound.split.statics
        in_tree = flat.arguments.in_tree
        rebuild = rebuilder(in_tree, static_vals)
        trace_key = (in_tree, statics_key(static_vals))
        debug_info = jp.api_util.debug_info(
            "pjit",
            self.fun,
            bound.args,
            bound.kwargs,
            static_argnums=[i for i, _ in static_vals if isinstance(i, int)],
            static_argnames=[k for k, _ in static_vals if isinstance(k, str)],
            signature=self._signature,
        )
        traced = trace_body(self.fun, rebuild, flat.avals, mesh, trace_key, debug_info)
        consts = traced.tracer_consts
        params = PjitParams(
            jaxpr=traced.jaxpr,
            in_axis_resources=(REPLICATED,) * len(consts) + flat.specs,
            out_axis_resources=self._out_specs_for(traced, mesh),
            mesh=mesh,
            donated_invars=(False,) * len(consts) + flat.donated,
            name=self.name,
        )
        return CallPlan(
            params=params,
            args_flat=tuple(consts) + tuple(flat.arguments.leaves),
            in_tree=in_tree,
            out_tree=traced.out_tree,
            in_avals=flat.avals,
            num_consts=len(consts),
            arguments=flat.arguments,
        )

    def _out_specs_for(self, traced: TracedBody, mesh: Mesh) -> tuple[ParsedPartitionSpec, ...]:
        out_avals = traced.jaxpr.out_avals
        outs = tree_unflatten(traced.out_tree, list(out_avals))
        specs, paths = broadcast_prefix(
            self._out_specs, outs, api=f"{self.api} out_axis_resources", what="outputs"
        )
        check_specs(self.api, "output", specs, paths, [a.shape for a in out_avals], mesh)
        check_layouts(self.api, specs, out_avals, lambda i: f"{self.api} output{keystr(paths[i])}")
        return tuple(specs)

    def donated_positions(self, n: int) -> list[int]:
        """Positions of the donated arguments in a call with ``n`` positional arguments."""
        positions = self._donated_positions.get(n)
        if positions is None:
            by_name, _ = self._argnums_for_names(self._donate_argnames)
            wanted = {i + n if i < 0 else i for i in self._donate_argnums} | by_name
            positions = self._donated_positions[n] = sorted(i for i in wanted if 0 <= i < n)
        return positions

    def __repr__(self) -> str:
        return f"pjit({self.name})"


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

    def clear_cache(self) -> None:
        """Forget this function's fast-path entries (executables stay in the shared cache)."""
        self._dispatcher.clear()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Decorated methods bind like plain functions.
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<{self._kind}-ed function {self._planner.name}>"


class _Unset:
    """Marks a spec argument the caller did not pass (None means replicated)."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


def _one_of(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of a spec argument given under its name or its jax.jit-style alias.

    Raises:
        TypeError: both spellings, or neither, were given.
    """
    if value is not _UNSET and alias_value is not _UNSET:
        raise TypeError(
            f"pjit: {name} and {alias} are two names for the same argument; pass only one."
        )
    if value is _UNSET and alias_value is _UNSET:
        raise TypeError(
            f"pjit: missing {name} (or its alias {alias}): a spec tree for the "
            f"{'arguments' if name.startswith('in') else 'outputs'}, e.g. PartitionSpec('data') "
            "or None (replicated)."
        )
    return value if value is not _UNSET else alias_value


def pjit(
    fun: Callable[..., Any],
    in_axis_resources: Any = _UNSET,
    out_axis_resources: Any = _UNSET,
    static_argnums: int | Sequence[int] | None = (),
    donate_argnums: int | Sequence[int] | None = (),
    *,
    static_argnames: str | Sequence[str] | None = (),
    donate_argnames: str | Sequence[str] | None = (),
    in_shardings: Any = _UNSET,
    out_shardings: Any = _UNSET,
) -> PjitWrapped:
    """Partition ``fun`` over the mesh in context at each call.

    Args:
        fun: the function; arguments and results are pytrees of arrays.
        in_axis_resources: a pytree prefix of the tuple of *dynamic* positional
            arguments (static ones removed): a single spec/None for all, or one
            entry per argument (a top-level list counts as that tuple).
            Keyword-only arguments are replicated. Leaves are PartitionSpecs,
            ``None`` (replicated) or NamedShardings (their spec; their mesh must be
            the mesh in context, and is used when there is none).
        out_axis_resources: a pytree prefix of the output, with the same leaves.
        static_argnums: positional arguments traced as Python constants.
        donate_argnums: positional arguments whose buffers the output may reuse.
        static_argnames: the same as ``static_argnums``, by parameter name.
        donate_argnames: the same as ``donate_argnums``, by parameter name.
        in_shardings: today's ``jax.jit`` spelling of ``in_axis_resources`` (pass one).
        out_shardings: today's ``jax.jit`` spelling of ``out_axis_resources`` (pass one).

    Returns:
        A :class:`PjitWrapped`: call it to run, ``.lower(...)`` for the AOT
        stages, ``.clear_cache()`` to drop its fast-path entries.
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
    )
    dispatcher = Dispatcher(
        planner.name,
        planner.fun,
        planner.plan,
        planner.donated_positions,
        planner.call_arguments(),
    )
    return PjitWrapped.make(planner, dispatcher)
