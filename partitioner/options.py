"""Library options: which SPMD partitioner to target, and which dispatch path to use.

``spmd_partitioner("gspmd" | "shardy")`` for a block of this thread,
``set_spmd_partitioner`` for the process (None follows jax's
``jax_use_shardy_partitioner``; ``partitioner`` / ``set_partitioner`` are their
deprecated names, which warn);
``fast_path(False)`` / ``set_fast_path(False)`` make every call take the
pure-Python dispatch path (the C++ one is the default); ``reshard_committed()`` /
``set_reshard_committed(True)`` opt in to moving committed arguments laid out otherwise
than their spec (off by default: such a call raises, as in ``jax.jit``);
``auto_progress(False)`` / ``set_auto_progress(False)`` stop a long AUTO search's live
progress line on a terminal (its records on the ``"partitioner"`` logger stay).
"""

from ._src.options import (
    auto_progress,
    auto_progress_enabled,
    fast_path,
    fast_path_enabled,
    reshard_committed,
    reshard_committed_enabled,
    set_auto_progress,
    set_fast_path,
    set_reshard_committed,
    set_spmd_partitioner,
    spmd_partitioner,
    use_shardy,
)

# Deprecated names of spmd_partitioner and set_spmd_partitioner (they warn).
from ._src.options import partitioner as partitioner
from ._src.options import set_partitioner as set_partitioner

__all__ = [
    "auto_progress",
    "auto_progress_enabled",
    "fast_path",
    "fast_path_enabled",
    "reshard_committed",
    "reshard_committed_enabled",
    "set_auto_progress",
    "set_fast_path",
    "set_reshard_committed",
    "set_spmd_partitioner",
    "spmd_partitioner",
    "use_shardy",
]
