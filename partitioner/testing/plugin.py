"""partitioner's pytest plugin, under the name users import: ``--virtual-devices N``, the
``mesh`` fixture, the ``needs_devices(n)`` marker.

pytest loads the plugin from the ``_partitioner_pytest`` package (the ``pytest11``
entry point ``partitioner``), which sits beside ``partitioner`` so that loading it
imports neither jax nor partitioner: every pytest run where partitioner is installed
loads it, and most never ask for it. This module is the same plugin (its hooks, the
fixture, the constants), for ``-p partitioner.testing.plugin`` where the entry point is
not installed, and for the names a user's conftest refers to.
"""

from __future__ import annotations

from _partitioner_pytest import (
    INI,
    MSG_TOO_LATE,
    OPTION,
    MeshFactory,
    mesh,
    pytest_addoption,
    pytest_configure,
    pytest_load_initial_conftests,
    pytest_runtest_setup,
)

from .._src.cpu_devices import XLA_FLAG  # the flag the plugin sets (shared with the CLI)

__all__ = [
    "INI",
    "MSG_TOO_LATE",
    "OPTION",
    "XLA_FLAG",
    "MeshFactory",
    "mesh",
    "pytest_addoption",
    "pytest_configure",
    "pytest_load_initial_conftests",
    "pytest_runtest_setup",
]
