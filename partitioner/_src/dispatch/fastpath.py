"""The per-signature dispatch fast path (the role of the seed's ``pmap_lib.cc``).

A cached call must cost little beyond running the executable. Two paths give
identical results (``partitioner.options.fast_path`` switches; the switch is in
the C++ cache key, so with it off every call reaches the Python path):

- **C++**: jaxlib's jit dispatcher keyed on the call signature (tree, avals,
  shardings, committedness, static values, jax config including the mesh in
  context and our options). A hit runs our executable without entering Python.
- **Python**: our own dict keyed on the same signature; a hit skips planning,
  tracing and checks and goes straight to argument placement and execution.

Misses take the slow path (the front door's ``plan`` + bind). Calls that cannot
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
every leaf. Once such an executable is handed to C++, the dispatcher makes the
guard the ``__call__`` of the class it installed its C++ callable on
(:meth:`Dispatcher.install`); every other function's ``__call__`` is the C++
callable itself.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax.tree_util import DictKey, SequenceKey, tree_flatten_with_path

from .. import jax_private as jp
from .. import options, window
from ..compiler.cache import get_executable
from ..compiler.executable import Executable
from ..events import emit
from ..lower.module import warn_unusable_donations
from ..primitives.call_plan import Planner
from ..sharding.placement import check_live
from ..trace.arguments import call_leaves, flat_arguments, statics_key
from . import explain
from .execute import run

_CPP_CAPACITY = 1024
_PYTHON_CAPACITY = 1024

_live: weakref.WeakSet[Dispatcher] = weakref.WeakSet()


def clear_fast_paths() -> None:
    """Forget every live function's fast-path entries."""
    for d in list(_live):
        d.clear()


options.on_change(clear_fast_paths)  # NOTE [options in cache keys]


@dataclass(frozen=True)
class _Hit:
    executable: Executable
    out_tree: Any


def _leaf_signature(x: Any) -> Any:
    if isinstance(x, jax.Array):
        layout = None if x.is_deleted() else jp.array_layout(x)
        return (type(x), x.shape, x.dtype, x.aval.weak_type, x.sharding, x.committed, layout)
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
    """Routes the calls of one wrapped function through the C++ or Python fast path.

    It reads everything it needs from the front door's :class:`Planner`: the
    function and its name (for jaxlib), how its calls bind (statics and donation,
    ``trace/arguments.py``), ``plan(args, kwargs)`` for a miss and ``eager`` for
    ``jax.disable_jit()``, ``wrap_call`` for what users call. It alone sets the
    ``__call__`` of the class it is given (:meth:`install`): the C++ callable,
    and later a guard around it where one is needed (NOTE [guarded C++ calls]).
    """

    def __init__(self, planner: Planner) -> None:
        self.name = planner.name
        self._planner = planner
        self._binding = planner.binding
        self._cpp_cache = jp.cpp_dispatch_cache(_CPP_CAPACITY)
        # Only users hold the C++ callable (as their function's ``__call__``); once
        # installed, this holds it and its class weakly, so a dropped function is
        # freed at once, with its fast-path entries.
        self._cpp: Any = jp.cpp_dispatcher(
            planner.name,
            planner.eager,
            self._cpp_miss,
            sorted(self._binding.static_argnums),
            sorted(self._binding.static_argnames),
            ("partitioner", id(self)),
            self._cpp_cache,
        )
        self._owner: weakref.ref[type] | None = None
        self._cpp_ref: weakref.ref[Any] | None = None
        self._python_cache: dict[Any, _Hit] = {}
        self._python_cache_lock = threading.Lock()
        self._guarded = False
        self._windowed = False
        self._donates = False
        self._last_donated: set[int] = set()  # ids of the arguments the last call donated
        self._marker_of: Callable[[Any], Any] = _marker_getter(())  # finds it in an output
        self._small_marker = True
        _live.add(self)

    def install(self, owner: type) -> None:
        """Make the C++ callable ``owner.__call__`` (as the planner wraps calls), once.

        ``owner`` is the wrapped function's own class (NOTE [pjit callable] in
        ``wrapped.py``); both are held weakly from here on: users hold them.
        """
        cpp, self._cpp = self._cpp, None
        if cpp is None:
            raise RuntimeError(
                "internal error: the C++ callable was installed twice; please report"
            )
        self._owner, self._cpp_ref = weakref.ref(owner), weakref.ref(cpp)
        self._set_call(owner, cpp)

    def _set_call(self, owner: type, call: Callable[..., Any]) -> None:
        # A staticmethod: no bound-method frame between the user and the callable.
        owner.__call__ = staticmethod(self._planner.wrap_call(call))  # type: ignore[assignment]

    def clear(self) -> None:
        """Forget this function's fast-path entries (executables stay in the shared cache)."""
        self._cpp_cache.clear()
        with self._python_cache_lock:
            self._python_cache.clear()

    def cache_size(self) -> int:
        """The call signatures cached: each is in the Python cache, hit first by C++ or not."""
        return len(self._python_cache)

    # --- guarded C++ calls (NOTE [guarded C++ calls]) ---

    def _install_guard(self, executable: Executable, out: Any) -> None:
        """Route this function's calls through a guard from now on."""
        self._windowed = self._windowed or executable.windowed
        self._donates = self._donates or bool(executable.aliased)
        if executable.marker is not None:
            path = tree_flatten_with_path(out)[0][executable.marker][0]
            self._marker_of = _marker_getter(path)
            self._small_marker = executable.small_marker
        owner = self._owner() if self._owner is not None else None
        cpp = self._cpp_ref() if self._cpp_ref is not None else None
        if self._guarded or owner is None or cpp is None:
            return
        self._set_call(owner, self._make_guard(cpp))
        self._guarded = True

    def _make_guard(self, cpp: Any) -> Callable[..., Any]:
        """The guard around ``cpp``; a closure, as every attribute lookup shows in the step time."""
        check_consumed = self._check_consumed

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._donates and self._donating_again(args, kwargs):
                check_consumed(args, kwargs)
            if not self._windowed:
                return cpp(*args, **kwargs)
            window.make_room()
            out = cpp(*args, **kwargs)
            if window.wants_marker():
                marker = self._marker_of(out)
                # Called under a jax trace (jax.jit around this function): the C++ path
                # bound the primitive, so nothing was launched and the tracer is no marker.
                if not isinstance(marker, jp.Tracer):
                    window.launched(marker, self._small_marker)
            return out

        return guarded

    def _check_consumed(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise a RuntimeError naming an argument an earlier call consumed (donated)."""
        flat = flat_arguments(self._binding, args, kwargs)
        for i, leaf in enumerate(flat.leaves):
            check_live(leaf, flat.where(i, self._binding.api))

    def _donating_again(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Note this call's donated arguments; True if the previous call donated one of them."""
        positions = self._binding.donated_positions(len(args))
        if len(positions) == 1 and not kwargs:  # the common case, kept cheap
            donated: Any = {id(args[positions[0]])}
        else:
            donated = {id(args[i]) for i in positions} | set(map(id, kwargs.values()))
        again = not donated.isdisjoint(self._last_donated)
        self._last_donated = donated
        return again

    # --- misses ---

    def _cpp_miss(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        out, executable, cpp_ok = self._call(args, kwargs)
        if executable is not None and executable.aliased:
            self._donating_again(args, kwargs)
        if (
            not cpp_ok
            or executable is None
            or executable.uses_tokens  # runtime tokens are threaded in Python, as jax does
            or executable.in_layouts  # inputs with stated layouts are placed in Python
            or not options.fast_path_enabled()
        ):
            return out, None, False
        leaves, tree = jp.dispatch_flatten(out)
        if not all(isinstance(x, jax.Array) for x in leaves):
            return out, None, False
        # jaxlib's dispatcher sees physical arrays: a key array is flattened
        # (dispatch registry) into its u32 data, so the signature and the
        # outputs are described physically.
        in_avals = executable.lowered.in_avals
        n_args = len(call_leaves(self._binding, args, kwargs)[1])
        data = jp.fastpath_data(
            executable.loaded,
            tree,
            [jp.physical_sharding(a, s) for a, s in zip(in_avals, executable.in_shardings)],
            [x.sharding for x in leaves],
            [x.aval for x in leaves],
            executable.lowered.committed,
            kept=executable.per_input([True] * len(in_avals), n_args, pruned=False),
        )
        if executable.windowed or executable.aliased:
            self._install_guard(executable, out)
        return out, data, False

    def _python_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        statics, leaves, tree = call_leaves(self._binding, args, kwargs)
        key = (
            tree,
            tuple(map(_leaf_signature, leaves)),
            statics_key(statics),
            jp.ambient_mesh(),
            jp.trace_context(),
            jp.compile_settings(),  # NOTE [executable cache]: a change compiles again
        )
        hash(key)  # raises TypeError for unhashable static values
        return key, leaves

    def _explain(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Log why this call missed (``jax_explain_cache_misses``), naming what changed."""
        flat = flat_arguments(self._binding, args, kwargs)
        with self._python_cache_lock:
            seen = list(self._python_cache)
        names = explain.ArgNames(self._binding.positional_names())
        explain.explain_miss(self.name, self._planner.fun, key, seen, flat, names)

    def _call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, Executable | None, bool]:
        """Run one call; returns (outputs, executable, whether C++ may cache it)."""
        if not jp.at_top_level():
            return self._planner.plan(args, kwargs).bind(), None, False
        try:
            key, leaves = self._python_key(args, kwargs)
        except TypeError:  # an unhashable static value: plan() reports it
            key, leaves = None, []
        hit = self._python_cache.get(key) if key is not None else None
        if hit is not None:
            out, moved = run(
                hit.executable,
                leaves,
                hit.out_tree,
                lambda i: flat_arguments(self._binding, args, kwargs).where(i, self._binding.api),
            )
            return out, hit.executable, not moved
        if jp.no_tracing():
            raise RuntimeError(
                f"re-tracing function {self._planner.fun} for `{self._binding.api.partition(' ')[0]}`, "
                "but 'no_tracing' is set"
            )
        emit("dispatch_miss", name=self.name)
        if key is not None and explain.enabled():
            self._explain(key, args, kwargs)
        plan = self._planner.plan(args, kwargs)
        if plan.num_consts:
            return plan.bind(), None, False
        executable, _ = get_executable(plan.params)
        warn_unusable_donations(executable.lowered)  # each new function's first call, as jax.jit
        out, moved = run(executable, plan.args_flat, plan.out_tree, plan.where)
        if not moved and key is not None:
            with self._python_cache_lock:
                if len(self._python_cache) >= _PYTHON_CAPACITY:
                    self._python_cache.pop(next(iter(self._python_cache)))
                self._python_cache[key] = _Hit(executable, plan.out_tree)
        return out, executable, not moved
