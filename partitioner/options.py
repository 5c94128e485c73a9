"""Library options: which of XLA's SPMD partitioners (GSPMD or Shardy) to target.

Why a library option and not only jax's flag: tests and users compare both
partitioners in one process without flipping jax's global configuration. The
default follows ``jax_use_shardy_partitioner`` so partitioner behaves like jax
unless told otherwise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from . import _jax_private


class _Options(threading.local):
    def __init__(self) -> None:
        self.shardy: bool | None = None


_global_shardy: bool | None = None
_local = _Options()


def use_shardy() -> bool:
    """True when lowering should target Shardy, False for GSPMD."""
    if _local.shardy is not None:
        return _local.shardy
    if _global_shardy is not None:
        return _global_shardy
    return _jax_private.jax_uses_shardy()


def set_partitioner(name: str | None) -> None:
    """Set the process-wide default: ``"shardy"``, ``"gspmd"``, or None (follow jax)."""
    global _global_shardy
    _global_shardy = _parse(name)


@contextlib.contextmanager
def partitioner(name: str | None) -> Iterator[None]:
    """Use ``"shardy"`` or ``"gspmd"`` (or None: the default) in this thread for the block."""
    previous = _local.shardy
    _local.shardy = _parse(name)
    try:
        yield
    finally:
        _local.shardy = previous


def _parse(name: str | None) -> bool | None:
    if name is None:
        return None
    if name not in ("shardy", "gspmd"):
        raise ValueError(f"partitioner must be 'shardy', 'gspmd' or None, got {name!r}")
    return name == "shardy"
