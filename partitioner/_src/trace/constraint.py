"""``with_sharding_constraint``: pin a value's layout inside a computation.

Its own primitive, so it survives tracing and every transformation carries it
(the rules live in ``rules/``). Outside any trace it simply lays the value out.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.tree_util import tree_flatten_with_path, tree_unflatten

from .. import jax_private as jp
from ..spec.checks import check_spec
from ..spec.mesh_env import resolve_mesh
from ..spec.parsed import ParsedPartitionSpec
from ..spec.tree import broadcast_prefix, meshes_named_by, prepare_axis_resources
from .tracing import check_mesh_unchanged

sharding_constraint_p = jp.Primitive("sharding_constraint")

_API = "with_sharding_constraint"


def with_sharding_constraint(x: Any, axis_resources: Any) -> Any:
    """Constrain every leaf of ``x`` to the layout its spec (a prefix tree) gives.

    ``UNCONSTRAINED`` dims are left for XLA to choose; sizes need not divide
    evenly (XLA pads). Needs a mesh in context.

    Raises:
        RuntimeError: no mesh in context (and no NamedSharding naming one).
        TypeError: a spec leaf is not a PartitionSpec, a NamedSharding or None.
        ValueError: unknown mesh axis, spec longer than the rank, duplicate
            axis, or a spec tree that is not a prefix of ``x``.
    """
    mesh = resolve_mesh(_API, meshes_named_by(axis_resources, f"{_API} axis_resources"))
    check_mesh_unchanged(mesh, _API)
    parsed = prepare_axis_resources(
        axis_resources, f"{_API} axis_resources", allow_unconstrained=True
    )
    leaves_with_paths, tree = tree_flatten_with_path(x)
    specs, paths = broadcast_prefix(parsed, x, api=_API, what="value")
    outs = []
    for (path, leaf), spec in zip(leaves_with_paths, specs, strict=True):
        check_spec(
            spec,
            tuple(jax.numpy.shape(leaf)),
            mesh,
            f"{_API} x{jax.tree_util.keystr(path)}",
            check_divisible=False,
        )
        outs.append(sharding_constraint_p.bind(leaf, axis_resources=spec, mesh=mesh))
    return tree_unflatten(tree, outs)


def _constraint_impl(x: Any, *, axis_resources: ParsedPartitionSpec, mesh: Any) -> Any:
    # Eagerly, a constraint is a re-layout; open dims are laid out unpartitioned.
    # A jax.Array cannot be split unevenly (XLA pads only inside a computation),
    # so a dimension its axes do not divide is laid out unpartitioned too: the
    # value is the same, and uneven constraints stay allowed (no divisibility check).
    shape = jax.numpy.shape(x)
    shards = axis_resources.shards_per_dim(mesh, len(shape))
    entries = [
        axes if axes and shape[d] % shards[d] == 0 else None
        for d, axes in enumerate(axis_resources.partitions)
    ]
    return jax.device_put(x, NamedSharding(mesh, jax.sharding.PartitionSpec(*entries)))


sharding_constraint_p.def_impl(_constraint_impl)
sharding_constraint_p.def_abstract_eval(lambda x, **_: x)
