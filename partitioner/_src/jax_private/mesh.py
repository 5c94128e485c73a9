"""The ambient mesh, shared with ``with jax.sharding.Mesh(...)`` and ``jax.set_mesh``.

partitioner keeps no mesh stack of its own: it pushes onto jax's thread-local
resource stack, so either context manager nests inside the other.
"""

from __future__ import annotations

from typing import Any

from jax._src import config as _config
from jax._src import mesh as _mesh_lib


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


def context_meshes() -> tuple[Any | None, Any | None]:
    """(the classic ``with mesh:`` mesh, the ``jax.set_mesh`` mesh), each None when not set.

    jax's two doors read different ones: its pjit the classic resource
    environment, jax.jit the mesh ``jax.set_mesh`` sets (``planner/jit_info.py``).
    """
    physical = _mesh_lib.thread_resources.env.physical_mesh
    concrete = _mesh_lib.get_concrete_mesh()
    return (
        None if physical.empty else physical,
        None if concrete is None or concrete.empty else concrete,
    )


def legacy_mesh_active() -> bool:
    """Whether a classic ``with mesh:`` (or ``partitioner.mesh``) context is active.

    jax's pjit reads a ``None`` spec as replicated only there (its resource
    environment); under ``jax.set_mesh`` it is unspecified.
    """
    return not _mesh_lib.thread_resources.env.physical_mesh.empty
