"""Library options: which SPMD partitioner to target, and which dispatch path to use.

Why library options and not only jax's flags: tests and users compare both
partitioners (and both dispatch paths) in one process without flipping jax's
global configuration. The partitioner defaults to ``jax_use_shardy_partitioner``.

NOTE [options in cache keys]: each option is a jax configuration state marked
``include_in_jit_key``, so jaxlib's C++ dispatch cache, jax.jit's caches and
our trace cache all see it: a call under another setting never reuses an
executable compiled for the first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _jax_private

_shardy = _jax_private.new_jit_key_state("partitioner_use_shardy", None)
_fast_path = _jax_private.new_jit_key_state("partitioner_fast_path", True)


def use_shardy() -> bool:
    """True when lowering should target Shardy, False for GSPMD."""
    value = _shardy.value
    return _jax_private.jax_uses_shardy() if value is None else bool(value)


def _parse(name: str | None) -> bool | None:
    if name is None:
        return None
    if name not in ("shardy", "gspmd"):
        raise ValueError(f"partitioner must be 'shardy', 'gspmd' or None, got {name!r}")
    return name == "shardy"


def set_partitioner(name: str | None) -> None:
    """Set the process-wide default: ``"shardy"``, ``"gspmd"``, or None (follow jax)."""
    _shardy.set_global(_parse(name))


@contextlib.contextmanager
def partitioner(name: str | None) -> Iterator[None]:
    """Use ``"shardy"`` or ``"gspmd"`` (None: the default) in this thread for the block."""
    previous = _shardy.swap_local(_parse(name))
    try:
        yield
    finally:
        _shardy.set_local(previous)


def fast_path_enabled() -> bool:
    """True when cached calls go through jaxlib's C++ dispatcher."""
    return bool(_fast_path.value)


def set_fast_path(enabled: bool) -> None:
    """Process-wide: use jaxlib's C++ dispatcher (True) or the pure-Python path."""
    _fast_path.set_global(bool(enabled))


@contextlib.contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    """Use the C++ (True) or pure-Python (False) dispatch path in this thread for the block."""
    previous = _fast_path.swap_local(bool(enabled))
    try:
        yield
    finally:
        _fast_path.set_local(previous)
