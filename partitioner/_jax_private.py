"""Every private jax entry point partitioner uses, in one place.

Why: ``jax._src`` moves between releases. Keeping each use behind a small
function here means a jax upgrade touches one module. Nothing outside this file
imports from ``jax._src``.
"""

from __future__ import annotations

from typing import Any

from jax._src import config as _config
from jax._src import mesh as _mesh_lib
from jax._src.lib import xla_client  # jaxlib's OpSharding/HloSharding/CompileOptions


# --- the ambient mesh (shared with `with jax.sharding.Mesh(...)`) ---


def _sync_mesh_config() -> None:
    # jax keys its own caches on this config value; keep it in step exactly as
    # `Mesh.__enter__` does so jax.jit sees our mesh the way it sees its own.
    stack = _mesh_lib.thread_resources.stack
    _config.mesh_context_manager.set_local(
        tuple(t.physical_mesh for t in stack if not t.physical_mesh.empty)
    )


def push_mesh(mesh: Any) -> None:
    """Enter ``mesh`` on jax's thread-local resource stack (no deprecation warning)."""
    res = _mesh_lib.thread_resources
    env = res.stack[-1].with_mesh(mesh)
    res.stack.append(env)
    res.env = env
    _sync_mesh_config()


def pop_mesh() -> None:
    """Leave the innermost mesh pushed by :func:`push_mesh` or ``with Mesh``."""
    res = _mesh_lib.thread_resources
    res.stack.pop()
    res.env = res.stack[-1]
    _sync_mesh_config()


def ambient_mesh() -> Any | None:
    """The innermost mesh in context, or None.

    `with Mesh` and `partitioner.mesh` share jax's resource stack, so they nest in
    either order; a mesh set with ``jax.set_mesh`` is used when neither is active.
    """
    physical = _mesh_lib.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    concrete = _mesh_lib.get_concrete_mesh()
    if concrete is not None and not concrete.empty:
        return concrete
    return None
