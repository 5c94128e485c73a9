"""``with_sharding_constraint``: pin a value's layout inside a computation.

Its own primitive, so it survives tracing and every transformation carries it
(its rules are below, the lowering in ``lower/nested.py``);
outside any trace it simply lays the value out (the impl, in ``dispatch/execute.py``).

Every transformation rule of ``sharding_constraint_p``: vmap, jvp, transpose.

A constraint is linear and elementwise-shaped: tangents and cotangents are
constrained like the value, and under ``vmap`` a plain batch dimension is left
open for XLA (``UNCONSTRAINED``), or split over ``spmd_axis_name``'s axes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.tree_util import tree_flatten_with_path, tree_unflatten

from .. import jax_private as jp
from ..sharding.checks import check_spec
from ..sharding.mesh_env import has_explicit_axes, maybe_current_mesh, resolve_mesh
from ..sharding.parsed import ParsedPartitionSpec
from ..sharding.tree import (
    broadcast_prefix,
    has_bare_specs,
    meshes_named_by,
    prepare_axis_resources,
)
from ..trace.params import PrimitiveParams
from ..trace.tracing import check_mesh_unchanged
from .rule_helpers import batch_spec, not_mapped, spmd_axes

sharding_constraint_p = jp.Primitive("sharding_constraint")

_API = "with_sharding_constraint"

MSG_EXPLICIT_ASSERT = """\
{where}: `with_sharding_constraint` acts as an assert when all axes of the mesh are of type \
`Explicit` (as in jax.jit). The array sharding: {have} did not match the sharding provided: \
{want}. Please use `jax.sharding.reshard` to shard your input to the sharding you want."""

MSG_EXPLICIT_AXES = """\
{where}: the spec {want} names the Explicit mesh axes {axes}; with_sharding_constraint can \
only refer to Auto axes of the mesh (as in jax.jit). Explicit axes are part of the value's \
type: change them with `jax.sharding.reshard`."""


def _entry_axes(entry: Any) -> tuple[Any, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _typed_constraint(leaf: Any, spec: ParsedPartitionSpec, mesh: Mesh, where: str) -> bool:
    """Check a constraint against the value's type over Explicit axes, as jax.jit does.

    Over a mesh whose axes (in context) are all Explicit the constraint is an
    assert: the value's type already fixes its layout. Over a mixed mesh it may
    only name the Auto axes. Returns True when the constraint is an assert
    (nothing to bind).

    Raises:
        AssertionError: all axes Explicit and the spec differs from the type's.
        ValueError: a mixed mesh and the spec names an Explicit axis.
    """
    abstract = jp.get_abstract_mesh()
    if abstract.empty or not has_explicit_axes(mesh):
        return False
    if abstract.are_all_axes_explicit:
        have = jp.typeof(leaf).sharding.spec
        for d, axes in enumerate(spec.partitions):
            if d in spec.unconstrained_dims:
                continue
            if d >= len(have) or _entry_axes(have[d]) != axes:
                raise AssertionError(
                    MSG_EXPLICIT_ASSERT.format(where=where, have=have, want=spec.describe())
                )
        return True
    types = dict(zip(abstract.axis_names, abstract.axis_types, strict=True))
    explicit = [a for axes in spec.partitions for a in axes if types.get(a) == AxisType.Explicit]
    if explicit:
        raise ValueError(MSG_EXPLICIT_AXES.format(where=where, want=spec.describe(), axes=explicit))
    return False


@dataclasses.dataclass(frozen=True)
class ConstraintParams(PrimitiveParams):
    """The parameters of one ``sharding_constraint_p`` equation.

    Attributes:
        axis_resources: the layout to pin (``UNCONSTRAINED`` dims left to XLA).
        mesh: the mesh it is over (the enclosing pjit's).
    """

    primitive: ClassVar[jp.Primitive] = sharding_constraint_p

    axis_resources: ParsedPartitionSpec
    mesh: Mesh


#: The primitive name of jax's own ``with_sharding_constraint``.
JAX_CONSTRAINT = "sharding_constraint"


def constraint_spec(eqn: Any) -> ParsedPartitionSpec | None:
    """The layout a constraint equation pins: ours, or jax's own over a NamedSharding
    (its spec); None for any other equation. The one reader of a constraint's spec
    (the report's rows, AUTO's cost model, a pipeline's batch axes)."""
    if eqn.primitive is sharding_constraint_p:
        return ConstraintParams.of(eqn.params).axis_resources
    sharding = eqn.params.get("sharding") if eqn.primitive.name == JAX_CONSTRAINT else None
    if isinstance(sharding, NamedSharding):
        return ParsedPartitionSpec.from_user_input(
            sharding.spec, JAX_CONSTRAINT, allow_unconstrained=True
        )
    return None


def constraints(jaxpr: Any) -> Iterator[tuple[Any, ParsedPartitionSpec]]:
    """Every constraint of ``jaxpr`` (its bodies included), in order, with its spec."""
    for eqn in jaxpr.eqns:
        spec = constraint_spec(eqn)
        if spec is not None:
            yield eqn, spec
    for sub in jp.subjaxprs(jaxpr):
        yield from constraints(sub)


def with_sharding_constraint(x: Any, axis_resources: Any) -> Any:
    """Constrain every leaf of ``x`` to the layout its spec (a prefix tree) gives.

    ``UNCONSTRAINED`` dims are left for XLA to choose; sizes need not divide
    evenly (XLA pads). Needs a mesh in context.

    Raises:
        RuntimeError: no mesh in context, and a PartitionSpec leaf or no
            NamedSharding naming one.
        TypeError: a spec leaf is not a PartitionSpec, a NamedSharding or None.
        ValueError: unknown mesh axis, spec longer than the rank, duplicate
            axis, or a spec tree that is not a prefix of ``x``.
    """
    if axis_resources is None and maybe_current_mesh() is None:
        raise ValueError(
            f"{_API}: got sharding None, which is not allowed with no mesh in context (under "
            "a mesh, None means replicated). Pass a NamedSharding, or enter a mesh "
            "(jax.set_mesh) and pass a PartitionSpec."
        )
    # Leaves first, as jax: a leaf that is no spec is a TypeError with or without a mesh.
    parsed = prepare_axis_resources(
        axis_resources, f"{_API} axis_resources", allow_unconstrained=True, keyword="shardings"
    )
    named = meshes_named_by(axis_resources, f"{_API} axis_resources")
    mesh = resolve_mesh(_API, named, bare_specs=has_bare_specs(axis_resources))
    check_mesh_unchanged(mesh, _API, "sharding_constraint inside jit")
    leaves_with_paths, tree = tree_flatten_with_path(x)
    specs, paths = broadcast_prefix(parsed, x, api=_API, what="value")
    outs = []
    for (path, leaf), spec in zip(leaves_with_paths, specs, strict=True):
        where = f"{_API} x{jax.tree_util.keystr(path)}"
        check_spec(spec, tuple(jax.numpy.shape(leaf)), mesh, where, check_divisible=False)
        if _typed_constraint(leaf, spec, mesh, where):  # NOTE [explicit axes]
            outs.append(leaf)
            continue
        # A Format leaf's concrete layout is jax's layout constraint on top (as
        # jax's with_sharding_constraint applies it); Layout.AUTO leaves it to XLA.
        layout = spec.layout
        out = ConstraintParams(spec.with_layout(None), mesh).bind(leaf)
        outs.append(with_layout_constraint(out, layout) if isinstance(layout, Layout) else out)
    return tree_unflatten(tree, outs)


# --- abstract evaluation ---


def abstract_eval(x: Any, **_: Any) -> Any:
    """A constraint changes a value's layout, never its type."""
    return x


# --- batching ---


def batcher(axis_data: Any, vals_in: Any, dims_in: Any, **kwargs: Any) -> tuple[Any, Any]:
    params = ConstraintParams.of(kwargs)
    (x,), (d,) = vals_in, dims_in
    if d is not_mapped:
        return params.bind(x), d
    spmd = spmd_axes(axis_data)
    spec = batch_spec(
        params.axis_resources, d, spmd, params.mesh, axis_data.size, open_dim=not spmd
    )
    return params.replace(axis_resources=spec).bind(x), d


# --- jvp ---


def jvp(primals: Any, tangents: Any, **kwargs: Any) -> tuple[Any, Any]:
    params = ConstraintParams.of(kwargs)
    (x,), (t,) = primals, tangents
    out = params.bind(x)
    if type(t) is jp.Zero:
        return out, t
    return out, params.bind(t)


# --- transpose ---


def transpose(ct: Any, x: Any, **kwargs: Any) -> list[Any]:
    if type(ct) is jp.Zero:
        return [jp.Zero(x.aval.to_ct_aval()) if jp.is_undefined_primal(x) else None]
    return [ConstraintParams.of(kwargs).bind(ct)]
