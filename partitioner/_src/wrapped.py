"""The callable a front door returns: jaxlib's C++ dispatcher as ``__call__``, plus the stages.

Why one neutral module (jax's ``stages.Wrapped`` is the model): ``jit``, ``pjit``
and ``pmap`` return the same kind of object, differing only in their planner,
so each front door subclasses :class:`Wrapped` for its public name and none
imports another.

NOTE [pjit callable]: a call must go straight into jaxlib's C++ dispatcher,
yet the object must not *be* jaxlib's dispatcher class: jax treats that class
as its own ``jax.jit`` (``jax.eval_shape`` reads its internals), and wrappers
such as ``jax.jit``/``jax.vmap`` copy instance attributes like ``lower`` onto
themselves. So each wrapped function gets a tiny subclass whose ``__call__``
*is* the C++ callable (a staticmethod: no Python frame on the hot path), and
``lower``/``clear_cache`` are ordinary methods that wrappers do not copy. The
hand-over goes one way: :meth:`Wrapped.make` gives the class to the dispatcher,
which alone sets its ``__call__``, now and when the call must become a guard
(NOTE [guarded C++ calls] in ``dispatch/fastpath.py``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from . import lazy
from . import registry as _registry  # noqa: F401  (installs every primitive's rules)
from .dispatch import clear_caches as clear_dispatch_caches
from .dispatch.fastpath import Dispatcher
from .primitives.call_plan import Planner
from .trace.tracing import trace_cache

if TYPE_CHECKING:
    from . import stages
    from .auto import searched as auto_searched
    from .stages import Lowered, Traced
else:
    # The AOT stages load with the first ``.lower()``/``.trace()``: a call never
    # reaches them (``lazy.py``).
    stages = lazy.module("partitioner._src.stages")
    # Loaded by the first plan with an AUTO leaf (NOTE [lazy AUTO] in planner/jit_plan.py).
    auto_searched = lazy.module("partitioner._src.auto.searched")

W = TypeVar("W", bound="Wrapped")


class Wrapped:
    """A function wrapped by a front door: call it, ``.lower(...)`` / ``.trace(...)`` it.

    Subclasses only name the front door (``kind``); see NOTE [pjit callable].
    """

    kind: ClassVar[str] = "wrapped"
    _planner: Planner
    _dispatcher: Dispatcher

    if TYPE_CHECKING:  # each function's own subclass's __call__ is the C++ callable (or its guard)

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @classmethod
    def make(cls: type[W], planner: Planner) -> W:
        """The callable for ``planner``, behind its own dispatcher."""
        dispatcher = Dispatcher(planner)
        sub = type(f"{cls.kind}[{planner.name}]", (cls,), {"__slots__": ()})
        dispatcher.install(sub)
        self: W = object.__new__(sub)
        object.__setattr__(self, "_planner", planner)
        object.__setattr__(self, "_dispatcher", dispatcher)
        functools.update_wrapper(self, planner.fun)  # type: ignore[arg-type]
        return self

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower for these arguments (arrays or ``jax.ShapeDtypeStruct``s)."""
        return stages.lower_plan(self._planner.plan(args, kwargs))

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Trace for these arguments (arrays or ``jax.ShapeDtypeStruct``s): the jaxpr, then ``.lower()``."""
        return stages.Traced(self._planner.plan(args, kwargs))

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The outputs' shapes, dtypes and shardings for these arguments, nothing run (as jax.jit's)."""
        return self.trace(*args, **kwargs).out_info

    def clear_cache(self) -> None:
        """Forget this function's traces and fast-path entries, as jax.jit's ``clear_cache``.

        The next call traces again; executables stay in the shared cache, so an
        equal program is not compiled again.
        """
        self._dispatcher.clear()
        trace_cache.forget(self._planner.fun)

    def cache_size(self) -> int:
        """How many call signatures this function has cached (emptied by :meth:`clear_cache`)."""
        return self._dispatcher.cache_size()

    def _cache_size(self) -> int:
        """jax.jit's (and jax.pmap's) spelling of :meth:`cache_size`, which code reads."""
        return self.cache_size()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Decorated methods bind like plain functions.
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        # jax.jit's own repr, so code and tests that print or compare it keep working.
        try:
            return f"<PjitFunction of {self._planner.fun!r}>"
        except Exception:  # the function's own repr failed: name it as jax does
            return f"<PjitFunction of {self._planner.name}>"


def clear_caches() -> None:
    """Drop every cached trace, AUTO choice, executable and fast-path entry.

    The next call of any wrapped function traces, chooses its AUTO layouts, lowers
    and compiles again. Pending launches in the CPU collective window are waited
    for first.
    """
    clear_dispatch_caches()
    if lazy.loaded(auto_searched):  # else no AUTO or pipeline search was ever made
        auto_searched.clear()
