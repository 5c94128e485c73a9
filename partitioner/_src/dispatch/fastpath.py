"""The per-signature dispatch fast path (the role of the seed's ``pmap_lib.cc``).

A cached call must cost little beyond running the executable. Two paths give
identical results (``partitioner.options.fast_path`` switches; the switch is in
the C++ cache key, so with it off every call reaches the Python path):

- **C++**: jaxlib's jit dispatcher keyed on the call signature (tree, avals,
  shardings, committedness, static values, jax config including the mesh in
  context and our options). A hit runs our executable without entering Python.
- **Python**: our own dict keyed on the same signature; a hit skips planning,
  tracing and checks and goes straight to argument placement and execution.

Misses take the slow path (``PjitFunction.plan`` + bind). Calls that cannot
take a fast path always take the slow path (which still hits the executable
cache): any transformation in progress, tracer constants, and committed inputs
that had to be moved to another layout.

NOTE [guarded C++ calls]: two kinds of executable need a little Python around
each run, which the C++ dispatcher cannot do. On CPU, an executable with
collectives: the launch enters the in-flight window (``window.py``). And an
executable that donates inputs: an array a call consumed reports
``is_deleted()``, yet jaxlib's C++ dispatch (ours and jax.jit's alike) hands it
to a multi-device execution, which crashes the process. Measured on a 10-leaf
train step on 8 CPU devices (about 160 us): one ``is_deleted()`` costs about
4 us there, flattening and checking every leaf about 1 us per leaf, and
``delete()``-ing consumed arrays after each call as much; any of these would
miss the 1.05x budget against jax.jit. So the guard remembers the ids of the
arguments the function's previous call donated, and checks leaf by leaf only a
call handed one of those same objects again (``step(state); step(state)``, the
common slip): it raises a RuntimeError naming the consumed argument. Older
consumed arguments, or consumed leaves passed in new containers, are not caught
on this path (they crash in jaxlib, as under jax.jit); every Python path checks
every leaf. Once such an executable is handed to C++, the function's
``__call__`` becomes this guard; every other function's ``__call__`` is the C++
callable itself.
"""

from __future__ import annotations

import functools
import operator
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from jax.tree_util import (
    DictKey,
    SequenceKey,
    tree_flatten,
    tree_flatten_with_path,
    tree_unflatten,
)

from .. import jax_private as jp
from .. import options
from ..events import emit
from ..trace.primitive import pjit_p
from . import window
from .execute import (
    Runnable,
    execute_placed,
    get_runnable,
    place_args_reporting,
)

if TYPE_CHECKING:
    from ..pjit import CallPlan, PjitFunction

_CPP_CAPACITY = 1024
_PY_CAPACITY = 1024


class PjitWrapped:
    """What :func:`partitioner.pjit` returns: call it, ``.lower(...)`` it.

    NOTE [pjit callable]: a call must go straight into jaxlib's C++ dispatcher,
    yet the object must not *be* jaxlib's dispatcher class: jax treats that
    class as its own ``jax.jit`` (``jax.eval_shape`` reads its internals), and
    wrappers such as ``jax.jit``/``jax.vmap`` copy instance attributes like
    ``lower`` onto themselves. So each pjit-ed function gets a tiny subclass
    whose ``__call__`` *is* the C++ callable (a staticmethod: no Python frame
    on the hot path), and ``lower``/``clear_cache`` are ordinary methods that
    wrappers do not copy.
    """

    _cpp: Any
    _dispatcher: Dispatcher

    if TYPE_CHECKING:  # each subclass's __call__ is the C++ callable itself

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @staticmethod
    def make(dispatcher: Dispatcher, cpp: Any) -> PjitWrapped:
        fun = dispatcher._fn._fun
        cls = type(
            f"pjit[{dispatcher._fn._name}]",
            (PjitWrapped,),
            {"__call__": staticmethod(cpp), "__slots__": ()},
        )
        self: PjitWrapped = object.__new__(cls)
        object.__setattr__(self, "_cpp", cpp)
        object.__setattr__(self, "_dispatcher", dispatcher)
        functools.update_wrapper(self, fun)  # type: ignore[arg-type]
        dispatcher._wrapped_cls = weakref.ref(cls)
        return self

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments (arrays or ``jax.ShapeDtypeStruct``s): a ``Lowered``."""
        return self._dispatcher._fn.lower(*args, **kwargs)

    def clear_cache(self) -> None:
        """Forget this function's fast-path entries (executables stay in the shared cache)."""
        self._dispatcher.clear()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Decorated methods bind like plain functions.
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<pjit-ed function {self._dispatcher._fn._name}>"


_live: weakref.WeakSet[Dispatcher] = weakref.WeakSet()


def clear_fast_paths() -> None:
    """Forget every live function's fast-path entries."""
    for d in list(_live):
        d.clear()


@dataclass(frozen=True)
class _Hit:
    runnable: Runnable
    out_tree: Any


def _bind(plan: CallPlan) -> Any:
    """Bind ``pjit_p`` for a planned call (staging it, or running it via the impl)."""
    return tree_unflatten(plan.out_tree, pjit_p.bind(*plan.args_flat, **plan.params))


def _leaf_signature(x: Any) -> Any:
    if isinstance(x, jax.Array):
        return (type(x), x.shape, x.dtype, x.aval.weak_type, x.sharding, x.committed)
    shape = getattr(x, "shape", None)
    if shape is not None:
        return (type(x), shape, x.dtype)
    return type(x)


def _marker_getter(path: tuple[Any, ...]) -> Callable[[Any], Any]:
    """A function returning the output leaf at ``path`` (no flatten), else the last leaf."""
    steps = [
        operator.itemgetter(k.idx if isinstance(k, SequenceKey) else k.key)
        if isinstance(k, (SequenceKey, DictKey))
        else operator.attrgetter(k.name)
        for k in path
    ]

    def marker_of(out: Any) -> Any:
        node = out
        try:
            for step in steps:
                node = step(node)
        except (AttributeError, IndexError, KeyError, TypeError):
            node = None
        if isinstance(node, jax.Array):
            return node
        leaves = jax.tree_util.tree_leaves(out)
        return leaves[-1] if leaves else None

    return marker_of


class Dispatcher:
    """Routes calls of one ``PjitFunction`` through the C++ or Python fast path."""

    def __init__(
        self, fn: PjitFunction, static_argnums: tuple[int, ...], static_argnames: tuple[str, ...]
    ) -> None:
        self._fn = fn
        self._static_argnums = frozenset(static_argnums)
        self._static_argnames = frozenset(static_argnames)
        self._cpp_cache = jp.cpp_dispatch_cache(_CPP_CAPACITY)
        cpp = jp.cpp_dispatcher(
            fn._name,
            fn._fun,
            self._cpp_miss,
            sorted(static_argnums),
            sorted(static_argnames),
            ("partitioner", id(self)),
            self._cpp_cache,
        )
        # Only users hold the C++ callable (inside the PjitWrapped); nothing here
        # points back at it, so a dropped function is freed at once, with its
        # fast-path entries.
        self._public: Any = cpp
        self._py: dict[Any, _Hit] = {}
        self._py_lock = threading.Lock()
        self._wrapped_cls: weakref.ref[type] | None = None
        self._guarded = False
        self._windowed = False
        self._donates = False
        self._last_donated: set[int] = set()  # ids of the arguments the last call donated
        self._marker_of: Callable[[Any], Any] = _marker_getter(())  # finds it in an output
        self._small_marker = True
        _live.add(self)

    def public_callable(self) -> PjitWrapped:
        """The callable users get (see :class:`PjitWrapped`)."""
        cpp, self._public = self._public, None
        return PjitWrapped.make(self, cpp)

    def clear(self) -> None:
        """Forget this function's fast-path entries (executables stay in the shared cache)."""
        self._cpp_cache.clear()
        with self._py_lock:
            self._py.clear()

    # --- guarded C++ calls (NOTE [guarded C++ calls]) ---

    def _install_guard(self, runnable: Runnable, out: Any) -> None:
        """Route this function's calls through a guard from now on (NOTE [guarded C++ calls])."""
        self._windowed = self._windowed or runnable.windowed
        self._donates = self._donates or bool(runnable.donated)
        if runnable.marker is not None:
            self._marker_of = _marker_getter(tree_flatten_with_path(out)[0][runnable.marker][0])
            self._small_marker = runnable.small_marker
        cls = self._wrapped_cls() if self._wrapped_cls is not None else None
        if self._guarded or cls is None:
            return
        cls.__call__ = staticmethod(self._make_guard(cls.__dict__["__call__"].__func__))  # type: ignore[method-assign]
        self._guarded = True

    def _make_guard(self, cpp: Any) -> Callable[..., Any]:
        """The guard around ``cpp``; a closure, as every attribute lookup shows in the step time."""
        fn = self._fn

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._donates and self._donating_again(args, kwargs):
                fn.plan(args, kwargs)  # raises if one was consumed, naming it
            if not self._windowed:
                return cpp(*args, **kwargs)
            window.make_room()
            out = cpp(*args, **kwargs)
            if window.wants_marker():
                window.launched(self._marker_of(out), self._small_marker)
            return out

        return guarded

    def _donating_again(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Note this call's donated arguments; True if the previous call donated one of them."""
        positions = self._fn.donated_positions(len(args))
        if len(positions) == 1 and not kwargs:  # the common case, kept cheap
            donated: Any = {id(args[positions[0]])}
        else:
            donated = {id(args[i]) for i in positions} | set(map(id, kwargs.values()))
        again = not donated.isdisjoint(self._last_donated)
        self._last_donated = donated
        return again

    # --- misses ---

    def _cpp_miss(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        out, runnable, cpp_ok = self._call(args, kwargs)
        if runnable is not None and runnable.donated:
            self._donating_again(args, kwargs)
        if not cpp_ok or runnable is None or not options.fast_path_enabled():
            return out, None, False
        leaves, tree = jp.dispatch_flatten(out)
        if not all(isinstance(x, jax.Array) for x in leaves):
            return out, None, False
        # jaxlib's dispatcher sees physical arrays: a key array is flattened
        # (dispatch registry) into its u32 data, so the signature and the
        # outputs are described physically.
        in_avals = runnable.compiled.lowered.in_avals
        data = jp.fastpath_data(
            runnable.compiled.executable,
            tree,
            [jp.physical_sharding(a, s) for a, s in zip(in_avals, runnable.in_shardings)],
            [x.sharding for x in leaves],
            [x.aval for x in leaves],
        )
        if runnable.windowed or runnable.donated:
            self._install_guard(runnable, out)
        return out, data, False

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        statics = tuple((i, args[i]) for i in sorted(self._static_argnums) if i < len(args))
        static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_argnames))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in self._static_argnums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        leaves, tree = tree_flatten((dyn_args, dyn_kwargs))
        key = (
            tree,
            tuple(map(_leaf_signature, leaves)),
            statics,
            static_kw,
            jp.ambient_mesh(),
            jp.trace_context(),
        )
        hash(key)  # raises TypeError for unhashable static values
        return key, leaves

    def _call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, Runnable | None, bool]:
        """Run one call; returns (outputs, runnable, whether C++ may cache it)."""
        if not jp.at_top_level():
            return _bind(self._fn.plan(args, kwargs)), None, False
        try:
            key, leaves = self._key(args, kwargs)
        except TypeError:  # an unhashable static value: plan() reports it
            key, leaves = None, []
        hit = self._py.get(key) if key is not None else None
        if hit is not None:
            try:
                placed, moved = place_args_reporting(leaves, hit.runnable.in_shardings)
            except (RuntimeError, ValueError):
                self._fn.plan(args, kwargs)  # the same check, naming the argument's path
                raise
            out = tree_unflatten(hit.out_tree, execute_placed(hit.runnable, placed))
            return out, hit.runnable, not moved
        emit("dispatch_miss", name=self._fn._name)
        plan = self._fn.plan(args, kwargs)
        if plan.num_consts:
            return _bind(plan), None, False
        runnable = get_runnable(**plan.params)
        placed, moved = place_args_reporting(plan.args_flat, runnable.in_shardings)
        out = tree_unflatten(plan.out_tree, execute_placed(runnable, placed))
        if not moved and key is not None:
            with self._py_lock:
                if len(self._py) >= _PY_CAPACITY:
                    self._py.pop(next(iter(self._py)))
                self._py[key] = _Hit(runnable, plan.out_tree)
        return out, runnable, not moved
