"""Library options: which SPMD partitioner to target, and which dispatch path to use.

``partitioner("gspmd" | "shardy")`` for a block of this thread, ``set_partitioner``
for the process (None follows jax's ``jax_use_shardy_partitioner``);
``fast_path(False)`` / ``set_fast_path(False)`` make every call take the
pure-Python dispatch path (the C++ one is the default).
"""

from ._src.options import (
    fast_path,
    fast_path_enabled,
    partitioner,
    set_fast_path,
    set_partitioner,
    use_shardy,
)

__all__ = [
    "fast_path",
    "fast_path_enabled",
    "partitioner",
    "set_fast_path",
    "set_partitioner",
    "use_shardy",
]
