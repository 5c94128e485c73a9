"""The executable cache: compile once per program and layout, even under threads.

NOTE [executable cache]:
- Key: (jaxpr, specs in/out, mesh, donation, partitioner choice, compiler options,
  the user's spelling of a spec where it is not its layout's own: ``spellings_key``,
  and the jax settings that change what is built: the ones lowering reads,
  ``jp.lowering_settings()``, as jax.jit's own caches key on them, and the ones
  jax's compile options are made of, ``jp.compile_settings()``, such as
  ``jax_optimization_level``). The jaxpr is held *weakly*: when the function that
  produced it is dropped (and with it the trace cache entry), its executables are
  freed.
- One compile per program: calls (``get_executable``) and ``Lowered.compile()``
  (``get_lowered_executable``, from the module ``.lower()`` made) share entries, in
  either order: the key is the same for the same program, devices, options and
  settings. Changing a setting compiles again; changing nothing never does.
- Equal programs share: a jaxpr structurally equal to one already compiled for
  the same rest of the key (``trace/equality.py``: e.g. ``vmap`` of a pjit-ed
  function, and a pjit of the vmapped function; or the same call on numpy
  values and on values committed to its all-Auto mesh, typed apart but lowered
  alike) gets that executable, and parsed specs compare by layout alone (not by
  how they were written), so equal layouts are equal keys. The comparison runs
  on misses only.
- Bounded: least-recently-used entries beyond ``capacity`` are evicted.
- Compile once: the first caller of a key compiles; concurrent callers with
  the same key wait on an event (GIL released) and share the result. A
  compile error is stored and re-raised, with its original message, to every
  waiter and to later callers. A thread that re-enters its own in-flight key
  (a compile that calls the same pjit) raises instead of waiting forever.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from .. import jax_private as jp
from .. import options
from ..events import emit
from ..lower.module import LoweredModule
from ..primitives.pjit_call import PjitParams
from ..trace.equality import closed_jaxprs_equal, lowered_type
from .compile import CompilerOptions
from .executable import Executable, build, finish, spellings_key


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    compiling_thread: int = field(default_factory=threading.get_ident)
    value: Any = None
    error: BaseException | None = None


class ExecutableCache:
    """A bounded, thread-safe, weakly-keyed compile-once cache.

    Args:
        capacity: entries kept (least recently used evicted first).
        same_program: whether two key objects stand for the same program (their
            entries are then shared); identity only when None.
        shape_of: a cheap hashable digest of a key object, equal for equal
            programs, which narrows the search for twins.
    """

    def __init__(
        self,
        capacity: int = 4096,
        same_program: Callable[[Any, Any], bool] | None = None,
        shape_of: Callable[[Any], Hashable] | None = None,
    ) -> None:
        self.capacity = capacity
        self._same_program = same_program
        self._shape_of = shape_of
        self._entries: collections.OrderedDict[Hashable, _Entry] = collections.OrderedDict()
        self._keys_of: dict[int, set[Hashable]] = {}  # id(program) -> its keys
        # (shape_of(program), key_rest) -> programs compiled for it, weakly, with their keys
        self._twins: dict[Hashable, list[tuple[weakref.ref[Any], Hashable]]] = {}
        self._buckets_of: dict[int, set[Hashable]] = {}  # id(program) -> its twin buckets
        # Re-entrant: a program's finalizer may run while this thread holds the lock.
        self._lock = threading.RLock()

    def _key(self, program: Any, key_rest: Hashable) -> Hashable:
        pid = id(program)
        if pid not in self._keys_of:
            self._keys_of[pid] = set()
            weakref.finalize(program, self._drop_program, pid)
        key = (pid, key_rest)
        self._keys_of[pid].add(key)
        return key

    def _drop_program(self, pid: int) -> None:
        with self._lock:
            for key in self._keys_of.pop(pid, ()):
                self._entries.pop(key, None)
            for bucket in self._buckets_of.pop(pid, ()):
                live = [(r, k) for r, k in self._twins.get(bucket, ()) if r() is not None]
                if live:
                    self._twins[bucket] = live
                else:
                    self._twins.pop(bucket, None)

    def _twin_entry(self, program: Any, key_rest: Hashable, key: Hashable) -> _Entry | None:
        """The entry of an equal program compiled for ``key_rest``; registers ``program``."""
        if self._same_program is None or self._shape_of is None:
            return None
        bucket = (self._shape_of(program), key_rest)
        candidates = self._twins.setdefault(bucket, [])
        self._buckets_of.setdefault(id(program), set()).add(bucket)
        found = None
        for ref, twin_key in candidates:
            twin = ref()
            entry = self._entries.get(twin_key)
            if twin is not None and entry is not None and self._same_program(twin, program):
                found = entry
                break
        candidates.append((weakref.ref(program), key))
        return found

    def get_or_compile(
        self, program: Any, key_rest: Hashable, compile_fn: Callable[[], Any]
    ) -> tuple[Any, bool]:
        """The cached value for ``(program, key_rest)``, compiling it at most once.

        Args:
            program: the object whose lifetime bounds the entry (the jaxpr).
            key_rest: the hashable remainder of the key.
            compile_fn: builds the value on a miss.

        Returns:
            ``(value, missed)``.
        """
        with self._lock:
            key = self._key(program, key_rest)
            entry = self._entries.get(key)
            mine = False
            if entry is None:
                entry = self._twin_entry(program, key_rest, key)
                mine = entry is None
                if entry is None:
                    entry = _Entry()
                self._entries[key] = entry
                self._evict()
            else:
                self._entries.move_to_end(key)
        if not mine:
            if not entry.done.is_set():
                if entry.compiling_thread == threading.get_ident():
                    raise RuntimeError(
                        "partitioner: a compilation re-entered itself (the function being "
                        "compiled calls the same pjit with the same signature)."
                    )
                entry.done.wait()
            if entry.error is not None:
                raise entry.error
            return entry.value, False
        try:
            entry.value = compile_fn()
        except BaseException as e:
            entry.error = e
            raise
        finally:
            entry.done.set()
        return entry.value, True

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            key, _ = self._entries.popitem(last=False)
            keys = self._keys_of.get(key[0])  # type: ignore[index]
            if keys is not None:
                keys.discard(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._twins.clear()
            self._buckets_of.clear()
            for keys in self._keys_of.values():
                keys.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _program_shape(jaxpr: Any) -> Any:
    """A cheap digest equal for structurally equal jaxprs (narrows the twin search)."""
    return (
        tuple(map(lowered_type, jaxpr.in_avals)),
        tuple(map(lowered_type, jaxpr.out_avals)),
        len(jaxpr.jaxpr.eqns),
    )


executables = ExecutableCache(same_program=closed_jaxprs_equal, shape_of=_program_shape)


def _key(
    params: PjitParams,
    shardy: bool,
    compiler_options: tuple[tuple[str, Any], ...],
    lowering: tuple[Any, ...],
) -> Hashable:
    """The rest of an entry's key, beside its jaxpr (NOTE [executable cache])."""
    return (
        params.in_axis_resources,
        params.out_axis_resources,
        params.mesh,
        params.donated_invars,
        shardy,
        params.committed,
        compiler_options,
        params.keep_unused,
        spellings_key(params.in_axis_resources),
        spellings_key(params.out_axis_resources),
        lowering,
        jp.compile_settings(),
    )


def get_executable(params: PjitParams) -> tuple[Executable, bool]:
    """The compiled executable for these params (NOTE [executable cache]), and whether
    this call built it."""
    shardy = options.use_shardy()

    def build_it() -> Executable:
        emit("cache_miss", name=params.name)
        return build(params, shardy)

    key = _key(params, shardy, params.compiler_options, jp.lowering_settings())
    return executables.get_or_compile(params.jaxpr, key, build_it)


def get_lowered_executable(
    params: PjitParams,
    lowered: LoweredModule,
    program: Any,
    kept: tuple[int, ...] | None,
    lowering: tuple[Any, ...],
    compiler_options: CompilerOptions | None,
) -> tuple[Executable, bool]:
    """The executable of a module ``.lower()`` made, shared with the calls of its program.

    Args:
        params: the call's params (``lowered`` is their pruned body's module).
        lowered: the module; compiled on a miss, as it is.
        program: the pruned jaxpr ``lowered`` came from; ``kept``: the inputs it takes.
        lowering: ``jp.lowering_settings()`` when ``lowered`` was lowered.
        compiler_options: as ``Lowered.compile`` takes them (None: none).

    Raises:
        TypeError: an option's value is not hashable (XLA's are numbers, strings
            and booleans).
    """
    options_key = tuple(sorted((compiler_options or {}).items()))
    try:
        hash(options_key)
    except TypeError:
        bad = [k for k, v in options_key if not isinstance(v, Hashable)]
        raise TypeError(
            f"{params.api}.lower(...).compile: compiler_options values must be numbers, "
            f"strings or booleans, as XLA takes them; got unhashable values for {bad}"
        ) from None

    def build_it() -> Executable:
        emit("cache_miss", name=params.name)
        return finish(lowered, program, compiler_options or None, kept)

    key = _key(params, lowered.shardy, options_key, lowering)
    return executables.get_or_compile(params.jaxpr, key, build_it)
