"""Error messages shared across the pipeline.

Why one module: every check names the API, the argument's tree path, the value,
what was expected and the fix. Keeping the long texts here keeps the checks short
and the wording consistent between ``pjit``, constraints and the AOT stages.
"""

from __future__ import annotations

MSG_NO_MESH = """\
{api} needs a mesh in context, but none is active.
Wrap the call in a mesh context:

    with partitioner.mesh(devices, ("data", "model")):   # or: with jax.sharding.Mesh(...)
        y = f(x)

The mesh is looked up when the function is called or lowered, not when pjit is applied."""

MSG_MESH_MISMATCH = """\
{where}: this NamedSharding is over the mesh {mesh}, but the call runs over {source}, \
{expected}. A NamedSharding given as a spec must use that mesh: build it from the same \
mesh, or pass its PartitionSpec alone (NamedSharding(mesh, spec).spec)."""

MSG_UNDEFINED_AXIS = """\
{where}: the spec {spec} names mesh axis {axis!r}, which is not in the current mesh \
(axes {mesh_axes}). Did you forget the mesh, or misspell the axis? Use one of {mesh_axes}."""

MSG_RANK = """\
{where}: the spec {spec} has {spec_len} entries but the value has rank {ndim} \
(shape {shape}). A spec can be at most as long as the value's rank (ndim); drop the \
trailing entries, e.g. {suggestion}."""

MSG_NOT_DIVISIBLE = """\
{where}: dimension {dim} of shape {shape} has size {size}, which is not divisible by \
{divisor}, the product of the sizes of mesh axes {axes} it is split over ({sizes}). \
Pad the dimension to a multiple of {divisor}, or partition it over fewer axes."""

MSG_DUPLICATE_AXIS = """\
{where}: the spec {spec} uses mesh axis {axis!r} more than once. Each mesh axis can \
partition at most one dimension of a value; e.g. PartitionSpec('x', 'y') instead of \
PartitionSpec('x', 'x')."""

MSG_NOT_A_SPEC = """\
{where}: expected a PartitionSpec, a NamedSharding or None as a spec leaf, got {value!r} \
of type {type_name}. Wrap axis names in a spec: PartitionSpec({value!r}) instead of {value!r}."""

MSG_UNCONSTRAINED_IN_PJIT = """\
{where}: the spec {spec} marks dimension {dim} UNCONSTRAINED, which only \
with_sharding_constraint accepts. pjit needs a definite layout for its inputs and \
outputs: use None (replicated) or a mesh axis name there."""

MSG_NOT_A_PREFIX = """\
{api}: the spec tree is not a pytree prefix of the {what} at {path}: {detail}.
Specs must mirror the structure of the {what} (or a prefix of it, one spec standing for a
whole subtree). For arguments, pass one spec per positional argument:
in_axis_resources=(PartitionSpec('x'), None) for f(x, y)."""

MSG_BAD_MESH = """\
mesh(devices, axis_names): {detail}. Pass a numpy array of devices with one named axis per
dimension, e.g. mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))."""

MSG_UNPARSEABLE_OP_SHARDING = """\
parse_op_sharding: the OpSharding {op_sharding} cannot be expressed as a PartitionSpec over \
the mesh {mesh_shape}: {detail}. Only shardings whose tiles follow mesh axes (as
get_aval_sharding_proto builds them) have a spec."""
