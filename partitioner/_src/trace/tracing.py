"""Trace a Python function to a ClosedJaxpr, once per signature.

NOTE [trace cache key]: the key is (function, input tree, avals, static
values, mesh, the body's settings (:class:`BodySettings`: the call's memory limit and
the pipeline decision, NOTE [pipeline decision] in ``decision.py``), jax's trace
context). The *function* is the key, not the pjit
wrapper, so a fresh ``pjit(f, ...)`` around the same ``f`` reuses the trace. A
trace whose constants include tracers (the body closes over an outer traced
value) is never cached: its constants belong to one outer trace.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import PyTreeDef, keystr, tree_flatten_with_path

from .. import jax_private as jp
from ..events import emit
from ..sharding.devices import DeviceSource, incompatible_devices
from ..sharding.mesh_env import typed_context
from .decision import NO_PIPELINE, PipelineDecision


@dataclass(frozen=True)
class TracedBody:
    """A traced body: the jaxpr, its output tree and any traced constants.

    ``tracer_consts`` are values of an enclosing trace the body closed over;
    they become leading (replicated) inputs of the ``pjit_p`` equation.
    """

    jaxpr: Any  # ClosedJaxpr whose invars are (*tracer_consts, *flat_args)
    out_tree: PyTreeDef
    tracer_consts: tuple[Any, ...]


class _TraceCache:
    """Per-function dict of traces; dropped with the function (weak keys)."""

    def __init__(self) -> None:
        self._by_fun: weakref.WeakKeyDictionary[Any, dict[Any, TracedBody]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def get(self, fun: Callable[..., Any], key: Any) -> TracedBody | None:
        with self._lock:
            return self._by_fun.get(fun, {}).get(key)

    def put(self, fun: Callable[..., Any], key: Any, value: TracedBody) -> None:
        with self._lock:
            try:
                self._by_fun.setdefault(fun, {})[key] = value
            except TypeError:  # not weak-referenceable: do not cache
                pass

    def clear(self) -> None:
        with self._lock:
            self._by_fun.clear()

    def forget(self, fun: Callable[..., Any]) -> None:
        """Drop ``fun``'s traces (its wrapped function's ``clear_cache``, as jax.jit's)."""
        with self._lock:
            try:
                self._by_fun.pop(fun, None)
            except TypeError:  # not weak-referenceable: never cached
                pass


trace_cache = _TraceCache()


# --- the bodies this thread is tracing ---

_tracing = threading.local()


@dataclass(frozen=True)
class BodySettings:
    """What a call tells the code traced in its body: the choices made while tracing it
    depend on them, so they are part of the trace cache key (NOTE [trace cache key]).

    Attributes:
        memory_limit: the call's ``auto_memory_limit``: what a pipeline's microbatch
            choice must fit.
        pipeline: how the body's AUTO pipelines run (NOTE [pipeline decision]).
    """

    memory_limit: int | None = None
    pipeline: PipelineDecision = NO_PIPELINE


@dataclass(frozen=True)
class _Frame:
    """A body being traced: its mesh, the pmap axis it maps over (None for a pjit), what
    put its call on the mesh's devices (jax's device messages name it), and its
    settings."""

    mesh: Mesh
    axis_name: str | None
    source: DeviceSource | None = None
    settings: BodySettings = BodySettings()


def _frames() -> tuple[_Frame, ...]:
    return getattr(_tracing, "stack", ())


def enclosing_body() -> tuple[Mesh, DeviceSource | None] | None:
    """The mesh of the innermost jit/pjit body this thread is tracing, and what placed
    its call; None outside any (or directly inside a pmap body)."""
    stack = _frames()
    if not stack or stack[-1].axis_name is not None:
        return None
    return stack[-1].mesh, stack[-1].source


def tracing_a_body() -> bool:
    """Whether this thread is tracing the body of one of partitioner's calls."""
    return bool(_frames())


def enclosing_settings() -> BodySettings:
    """The settings of the innermost body this thread is tracing (the defaults outside
    any): the one place code in a body reads what its call decided for it."""
    stack = _frames()
    return stack[-1].settings if stack else BodySettings()


def enclosing_maps() -> tuple[str, ...]:
    """The axis names of the pmap bodies this thread is tracing, outermost first.

    A pmap called while one of these is traced is nested in it.
    """
    return tuple(f.axis_name for f in _frames() if f.axis_name is not None)


def check_mesh_unchanged(mesh: Mesh, api: str, inner: str = "jit inside jit") -> None:
    """Reject a mesh entered inside a pjit body that differs from the body's mesh.

    Args:
        inner: what asks for ``mesh``, as jax's message names it (``"jit inside
            jit"``, ``"sharding_constraint inside jit"``).

    Raises:
        ValueError: the mesh in context is not the one the enclosing pjit runs over:
            jax's "Received incompatible devices" where the devices differ.
    """
    stack = _frames()
    if not stack or stack[-1].mesh is mesh:
        return
    outer = stack[-1]
    devices = tuple(mesh.devices.flat)
    if set(devices) != set(outer.mesh.devices.flat):
        origin = outer.source or DeviceSource(tuple(outer.mesh.devices.flat), "the enclosing jit")
        raise incompatible_devices(api, origin, DeviceSource(devices, inner))
    raise ValueError(
        f"{api}: the mesh in context {dict(mesh.shape)} (devices "
        f"{[d.id for d in mesh.devices.flat]}) differs from the mesh {dict(outer.mesh.shape)} "
        f"(devices {[d.id for d in outer.mesh.devices.flat]}) of the enclosing pjit-ed function. "
        "Changing the mesh inside a pjit-ed function is not allowed: enter the mesh "
        "outside the outermost pjit call."
    )


@contextmanager
def _tracing_under(frame: _Frame) -> Iterator[None]:
    stack = _frames()
    _tracing.stack = (*stack, frame)
    try:
        yield
    finally:
        _tracing.stack = stack


def trace_body(
    fun: Callable[..., Any],
    rebuild_args: Callable[[list[Any]], tuple[tuple[Any, ...], dict[str, Any]]],
    in_avals: tuple[Any, ...],
    mesh: Mesh,
    cache_key: Any,
    debug_info: Any,
    *,
    call: Callable[..., Any] | None = None,
    axis_name: str | None = None,
    source: DeviceSource | None = None,
    settings: BodySettings = BodySettings(),
) -> TracedBody:
    """Trace ``fun`` on flat ``in_avals`` (cached, see NOTE [trace cache key]).

    Args:
        fun: the user's function (the cache is keyed on it).
        rebuild_args: flat dynamic leaves -> ``(args, kwargs)`` for ``fun``
            (re-inserting static arguments).
        in_avals: one ShapedArray per flat dynamic leaf.
        mesh: the mesh the body runs over (nested pjits must use the same).
        cache_key: hashable signature (input tree, static values, specs...).
        debug_info: jax DebugInfo naming the function and its arguments.
        call: what is traced, if not ``fun`` itself (a front door's wrapper of it;
            whatever it adds must be in ``cache_key``).
        axis_name: the pmap axis the body maps over (None for a pjit body).
        source: what put the call on ``mesh`` (for the messages of calls inside it).
        settings: what the call tells the code in its body (part of the cache key).
    """
    key = (cache_key, in_avals, mesh, settings, jp.trace_context())
    hit = trace_cache.get(fun, key)
    if hit is not None:
        return hit
    out_tree_box: list[PyTreeDef] = []
    result_paths: list[tuple[str, ...]] = []

    def flat_fun(*flat_args: Any) -> list[Any]:
        args, kwargs = rebuild_args(list(flat_args))
        out = (call or fun)(*args, **kwargs)
        with_paths, tree = tree_flatten_with_path(out)
        out_tree_box.append(tree)
        # jax.jit's names for the results ("result['y']"), for the lowered module.
        result_paths.append(tuple(f"result{keystr(p)}" for p, _ in with_paths))
        return [leaf for _, leaf in with_paths]

    name = getattr(fun, "__name__", repr(fun))
    emit("trace", name=name)
    with (
        _tracing_under(_Frame(mesh, axis_name, source, settings)),
        typed_context(mesh),
        jp.log_elapsed_time(
            "Finished tracing + transforming {fun_name} for pjit in {elapsed_time:.9f} sec",
            fun_name=name,
            event=jp.JAXPR_TRACE_EVENT,
        ),
    ):
        jaxpr, _, consts = jp.trace_to_jaxpr_dynamic(
            _with_result_paths(flat_fun, debug_info, lambda: result_paths[-1]), list(in_avals)
        )
    if any(isinstance(c, jp.Tracer) for c in consts):
        # Closed-over values of an outer trace: make them explicit inputs.
        closed = jp.ClosedJaxpr(jp.convert_constvars_jaxpr(jaxpr), ())
        return TracedBody(closed, out_tree_box[-1], tuple(consts))
    traced = TracedBody(jp.ClosedJaxpr(jaxpr, consts), out_tree_box[-1], ())
    trace_cache.put(fun, key, traced)
    return traced


def _with_result_paths(
    flat_fun: Callable[..., list[Any]],
    debug_info: Any,
    paths: Callable[[], tuple[str, ...]],
) -> Any:
    """``flat_fun`` for jax's tracer, its debug info naming the results once traced.

    ``wrap_init`` forgets the result paths; jax's tracer reads them back (through
    the thunk, after the body returned) both to name the module's results and to
    say *which* output is bad when the body returns a non-JAX value (a ``str``, an
    ``object()``, a generator): jax.jit's "returned a value of type ... at output
    component ['b'], which is not a valid JAX type". Without them jax's own check
    fails on ``len(None)`` instead.
    """
    wrapped = jp.wrap_init(flat_fun, debug_info=debug_info)
    return wrapped.replace_debug_info(debug_info._replace(result_paths=paths))
