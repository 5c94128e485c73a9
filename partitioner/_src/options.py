"""Library options: the SPMD partitioner to target, the dispatch path, resharding.

Why library options and not only jax's flags: tests and users compare both
partitioners (and both dispatch paths) in one process. The partitioner choice
defaults to ``jax_use_shardy_partitioner``.

NOTE [options in cache keys]: a cached executable must never be reused under
another setting. jaxlib's C++ dispatch cache keys on jax's own configuration,
so :func:`spmd_partitioner` also sets jax's ``jax_use_shardy_partitioner`` for its
block (nested ``jax.jit`` code is then lowered for the same partitioner, which
it must be anyway). Process-wide changes (:func:`set_spmd_partitioner`,
:func:`set_fast_path`) empty the fast-path caches instead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from . import jax_private
from .warn import warn


class _Local(threading.local):
    shardy: bool | None = None


_local = _Local()
_global_shardy: bool | None = None
_fast_path = True
_reshard_committed = False


def use_shardy() -> bool:
    """True when lowering should target Shardy, False for GSPMD."""
    if _local.shardy is not None:
        return _local.shardy
    if _global_shardy is not None:
        return _global_shardy
    return jax_private.jax_uses_shardy()


def _parse(name: str | None) -> bool | None:
    if name is None:
        return None
    if name not in ("shardy", "gspmd"):
        raise ValueError(f"the SPMD partitioner must be 'shardy', 'gspmd' or None, got {name!r}")
    return name == "shardy"


_on_change: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after every process-wide change (NOTE [options in cache keys]).

    Dispatch subscribes its fast-path cache clearing here, so options (at the
    bottom of the pipeline) never import dispatch.
    """
    _on_change.append(callback)


def _changed() -> None:
    for callback in _on_change:
        callback()


def set_spmd_partitioner(name: str | None) -> None:
    """Set the process-wide default: ``"shardy"``, ``"gspmd"``, or None (follow jax)."""
    global _global_shardy
    _global_shardy = _parse(name)
    _changed()


@contextlib.contextmanager
def spmd_partitioner(name: str | None) -> Iterator[None]:
    """Use ``"shardy"`` or ``"gspmd"`` (None: the default) in this thread for the block."""
    choice = _parse(name)
    previous = _local.shardy
    _local.shardy = choice
    try:
        if choice is None:
            yield
        else:
            with jax_private.shardy_config(choice):
                yield
    finally:
        _local.shardy = previous


def set_partitioner(name: str | None) -> None:
    """Deprecated name of :func:`set_spmd_partitioner` (it warns, then sets the default)."""
    warn(
        "partitioner.set_partitioner is deprecated; use partitioner.set_spmd_partitioner",
        DeprecationWarning,
    )
    set_spmd_partitioner(name)


def partitioner(name: str | None) -> AbstractContextManager[None]:
    """Deprecated name of :func:`spmd_partitioner` (it warns, then returns that block)."""
    warn(
        "partitioner.partitioner is deprecated; use partitioner.spmd_partitioner",
        DeprecationWarning,
    )
    return spmd_partitioner(name)


def fast_path_enabled() -> bool:
    """True when cached calls may run in jaxlib's C++ dispatcher."""
    return _fast_path


def set_fast_path(enabled: bool) -> None:
    """Process-wide: let cached calls run in C++ (True) or always take the Python path."""
    global _fast_path
    _fast_path = bool(enabled)
    _changed()


@contextlib.contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    """:func:`set_fast_path` for the block (process-wide), restored afterwards."""
    previous = _fast_path
    set_fast_path(enabled)
    try:
        yield
    finally:
        set_fast_path(previous)


def reshard_committed_enabled() -> bool:
    """True when a committed argument laid out otherwise than its spec is moved (opt-in)."""
    return _reshard_committed


def set_reshard_committed(enabled: bool) -> None:
    """Process-wide opt-in: move committed arguments laid out otherwise than their spec.

    Off by default, as in ``jax.jit``: such a call raises a ValueError naming the
    argument, because moving it is a transfer the program never shows.
    """
    global _reshard_committed
    _reshard_committed = bool(enabled)
    _changed()


@contextlib.contextmanager
def reshard_committed(enabled: bool = True) -> Iterator[None]:
    """:func:`set_reshard_committed` for the block (process-wide), restored afterwards."""
    previous = _reshard_committed
    set_reshard_committed(enabled)
    try:
        yield
    finally:
        set_reshard_committed(previous)


_auto_progress = True


def auto_progress_enabled() -> bool:
    """True when a long AUTO search draws a live progress line on a terminal's stderr."""
    return _auto_progress


def set_auto_progress(enabled: bool) -> None:
    """Process-wide: draw (True, the default) or never draw an AUTO search's live progress
    line on stderr. The search's records on the ``"partitioner"`` logger are not affected."""
    global _auto_progress
    _auto_progress = bool(enabled)


@contextlib.contextmanager
def auto_progress(enabled: bool) -> Iterator[None]:
    """:func:`set_auto_progress` for the block (process-wide), restored afterwards."""
    previous = _auto_progress
    set_auto_progress(enabled)
    try:
        yield
    finally:
        set_auto_progress(previous)
