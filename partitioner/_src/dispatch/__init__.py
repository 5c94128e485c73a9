"""Stage 6: dispatch. Fast paths, argument placement and execution of what the compiler built."""

from __future__ import annotations

from .. import window
from ..compiler.cache import executables
from ..trace.tracing import trace_cache
from .fastpath import clear_fast_paths


def clear_caches() -> None:
    """Drop every cached trace, executable and fast-path entry.

    The next call of any pjit-ed function traces, lowers and compiles again.
    Pending launches in the CPU collective window are waited for first.
    """
    window.drain()
    clear_fast_paths()
    executables.clear()
    trace_cache.clear()
