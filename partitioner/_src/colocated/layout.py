"""Where a colocated function's outputs live, and their assembly into global arrays.

Each process's call returns (or is promised) its *block* of every output: an
array over this process's part of the output mesh. In one process that block is
the whole output; over several, the blocks of all processes are put together
into one global ``jax.Array`` per output, laid out by the output spec, without a
copy (the blocks' shards become the global array's shards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .. import jax_private as jp
from ..distributed.arrays import global_shape, local_mesh, local_shape

_ONE_DEVICE_AXIS = "colocated"


@dataclass(frozen=True)
class OutputLayout:
    """Where a colocated function's outputs live: a mesh and a spec per output.

    ``shapes`` are global; ``local_shapes`` this process's blocks, which the function
    returns (laid out by ``spec`` over ``local_mesh(mesh)``).
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]  # numpy dtypes, or extended ones (typed PRNG keys)
    specs: tuple[PartitionSpec, ...]
    meshes: tuple[Mesh, ...]

    @cached_property
    def local_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(
            local_shape(shape, mesh, spec)
            for shape, mesh, spec in zip(self.shapes, self.meshes, self.specs, strict=True)
        )

    @cached_property
    def local_shardings(self) -> tuple[NamedSharding, ...]:
        """Each output's layout over this process's part of its mesh."""
        return tuple(
            NamedSharding(local_mesh(mesh), spec)
            for mesh, spec in zip(self.meshes, self.specs, strict=True)
        )

    @cached_property
    def local_structs(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """This process's block of every output, physically (what a promise is made of)."""
        return tuple(
            _physical(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
            for shape, dtype, sharding in zip(
                self.local_shapes, self.dtypes, self.local_shardings, strict=True
            )
        )

    def to_local(self, blocks: Sequence[jax.Array]) -> list[jax.Array]:
        """``blocks`` as this process's physical blocks (moved where they are not).

        Why physical: a typed PRNG key is a ``u32`` array underneath, and the
        transfer and the assembly carry plain arrays; :meth:`assemble` wraps keys
        again.
        """
        out = []
        for i, block in enumerate(blocks):
            wanted = self.local_shardings[i]
            if not block.sharding.is_equivalent_to(wanted, block.ndim):
                block = jax.device_put(block, wanted)
            out.append(jp.physical_array(block))
        return out

    def assemble(self, blocks: Sequence[jax.Array]) -> list[jax.Array]:
        """The global outputs whose physical blocks on this process are ``blocks``."""
        out = []
        for i, block in enumerate(blocks):
            if jax.process_count() > 1:
                whole = _physical(
                    jax.ShapeDtypeStruct(
                        self.shapes[i],
                        self.dtypes[i],
                        sharding=NamedSharding(self.meshes[i], self.specs[i]),
                    )
                )
                block = jax.make_array_from_single_device_arrays(
                    whole.shape, whole.sharding, [shard.data for shard in block.addressable_shards]
                )
            if jp.is_extended(jax.ShapeDtypeStruct((), self.dtypes[i])):
                block = jax.random.wrap_key_data(block, impl=jp.key_impl(self.dtypes[i]))
            out.append(block)
        return out

    def describe(self, i: int) -> str:
        return f"{self.dtypes[i]}{list(self.shapes[i])} laid out as {self.specs[i]}"


def _physical(struct: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The plain array behind ``struct`` (a key array's ``u32`` data, trailing dims whole)."""
    if not jp.is_extended(struct):
        return struct
    physical = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(struct.shape, struct.dtype))
    sharding = struct.sharding
    assert isinstance(sharding, NamedSharding)
    extra = (None,) * (len(physical.shape) - len(struct.shape))
    return jax.ShapeDtypeStruct(
        physical.shape,
        physical.dtype,
        sharding=NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec, *extra)),
    )


def mesh_and_spec(sharding: Any, what: str) -> tuple[Mesh, PartitionSpec]:
    """A sharding as (mesh, spec); a single device is a one-device mesh.

    Raises:
        ValueError: another kind of sharding.
    """
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return sharding.mesh, sharding.spec
    if isinstance(sharding, SingleDeviceSharding):
        return Mesh(np.array(list(sharding.device_set)), (_ONE_DEVICE_AXIS,)), PartitionSpec()
    raise ValueError(
        f"colocated_python: {what} must be laid out by a NamedSharding over a mesh or on one "
        f"device, got {sharding}"
    )


def layout_from_specs(out_specs: Any) -> OutputLayout:
    """The layout ``out_specs_fn`` declares (a pytree of ShapeDtypeStructs with shardings).

    Raises:
        ValueError: a leaf without a sharding, or not laid out over a mesh or one device.
    """
    leaves, treedef = jax.tree_util.tree_flatten(out_specs)
    meshes, specs = [], []
    for i, leaf in enumerate(leaves):
        if getattr(leaf, "sharding", None) is None:
            raise ValueError(
                f"colocated_python: out_specs_fn's output {i} ({leaf}) has no sharding; give "
                "jax.ShapeDtypeStruct(shape, dtype, sharding=...)"
            )
        mesh, spec = mesh_and_spec(leaf.sharding, f"out_specs_fn's output {i}")
        meshes.append(mesh)
        specs.append(spec)
    return OutputLayout(
        treedef,
        tuple(tuple(leaf.shape) for leaf in leaves),
        tuple(leaf.dtype for leaf in leaves),
        tuple(specs),
        tuple(meshes),
    )


def layout_from_outputs(outputs: Any, global_mesh: Mesh | None) -> OutputLayout:
    """The layout a first (discovery) call's host-local outputs show.

    In a job of several processes, each output must be laid out over this
    process's block of ``global_mesh`` (the arguments' mesh); its global shape is
    the blocks' together.

    Raises:
        ValueError: an output that is not a ``jax.Array``, or laid out elsewhere.
    """
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    meshes, specs, shapes = [], [], []
    for i, leaf in enumerate(leaves):
        check_output(leaf, i)
        mesh, spec = mesh_and_spec(leaf.sharding, f"output {i}")
        shape = tuple(leaf.shape)
        if jax.process_count() == 1:
            pass  # the block is the whole
        elif global_mesh is not None and mesh == local_mesh(global_mesh):
            mesh, shape = global_mesh, global_shape(shape, global_mesh, spec)
        else:
            raise ValueError(
                f"colocated_python: in a job of several processes, output {i} must be laid out "
                f"over this process's part of the arguments' mesh (or give out_specs_fn), got "
                f"{leaf.sharding}"
            )
        meshes.append(mesh)
        specs.append(spec)
        shapes.append(shape)
    return OutputLayout(
        treedef,
        tuple(shapes),
        tuple(x.dtype for x in leaves),
        tuple(specs),
        tuple(meshes),
    )


def check_output(leaf: Any, i: int) -> None:
    if not isinstance(leaf, jax.Array):
        raise ValueError(
            f"colocated_python only supports jax.Array as input and output, but output {i} is "
            f"{type(leaf).__name__}"
        )
