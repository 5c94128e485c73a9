"""``with_sharding_constraint``: pin a value's layout inside a computation.

Its own primitive, so it survives tracing and every transformation carries it
(the rules live in ``rules/constraint.py``, the lowering in ``lower/rules.py``);
outside any trace it simply lays the value out (the impl, in ``dispatch/execute.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import Mesh
from jax.tree_util import tree_flatten_with_path, tree_unflatten

from ..jax_private import core
from ..spec.checks import check_spec
from ..spec.mesh_env import resolve_mesh
from ..spec.parsed import ParsedPartitionSpec
from ..spec.tree import broadcast_prefix, meshes_named_by, prepare_axis_resources
from .params import PrimitiveParams
from .tracing import check_mesh_unchanged

sharding_constraint_p = core.Primitive("sharding_constraint")

_API = "with_sharding_constraint"


@dataclasses.dataclass(frozen=True)
class ConstraintParams(PrimitiveParams):
    """The parameters of one ``sharding_constraint_p`` equation.

    Attributes:
        axis_resources: the layout to pin (``UNCONSTRAINED`` dims left to XLA).
        mesh: the mesh it is over (the enclosing pjit's).
    """

    primitive: ClassVar[core.Primitive] = sharding_constraint_p

    axis_resources: ParsedPartitionSpec
    mesh: Mesh


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
        # A Format leaf's concrete layout is jax's layout constraint on top (as
        # jax's with_sharding_constraint applies it); Layout.AUTO leaves it to XLA.
        layout = spec.layout
        out = ConstraintParams(spec.with_layout(None), mesh).bind(leaf)
        outs.append(with_layout_constraint(out, layout) if isinstance(layout, Layout) else out)
    return tree_unflatten(tree, outs)


sharding_constraint_p.def_abstract_eval(lambda x, **_: x)
