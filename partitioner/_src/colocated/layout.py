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
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from .. import jax_private as jp
from ..distributed.arrays import global_shape, local_mesh, local_shape

_ONE_DEVICE_AXIS = "colocated"


@dataclass(frozen=True)
class OutputLayout:
    """Where a colocated function's outputs live: a sharding per output.

    ``shardings`` are exactly those the function produced (its first call) or
    ``out_specs_fn`` declared, memory kind included; for a call that ``spans``
    processes (its devices are several processes') they are ``NamedSharding``s
    over the global mesh. ``shapes`` are global; ``local_shapes`` this process's
    blocks, which the function returns (laid out by ``local_shardings``).
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]  # numpy dtypes, or extended ones (typed PRNG keys)
    shardings: tuple[Sharding, ...]
    spans: bool

    @cached_property
    def local_shapes(self) -> tuple[tuple[int, ...], ...]:
        if not self.spans:
            return self.shapes
        return tuple(
            local_shape(shape, *_mesh_spec(s))
            for shape, s in zip(self.shapes, self.shardings, strict=True)
        )

    @cached_property
    def local_shardings(self) -> tuple[Sharding, ...]:
        """Each output's layout over this process's part of its devices."""
        if not self.spans:
            return self.shardings
        return tuple(
            NamedSharding(local_mesh(_mesh_spec(s)[0]), _mesh_spec(s)[1], memory_kind=s.memory_kind)
            for s in self.shardings
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

    def finish(self, blocks: Sequence[jax.Array]) -> list[jax.Array]:
        """The global outputs of this process's ``blocks``, as the function returned them.

        Each keeps its own sharding object where it is the layout's, and is put on
        the layout's (moved, where it is not equivalent) where it is not.
        """
        if self.spans:
            return self.assemble(self.to_local(blocks))
        out = []
        for block, wanted in zip(blocks, self.shardings, strict=True):
            if block.sharding is not wanted and block.sharding != wanted:
                block = jax.device_put(block, wanted)
            out.append(block)
        return out

    def to_local(self, blocks: Sequence[jax.Array]) -> list[jax.Array]:
        """``blocks`` as this process's physical blocks (moved where they are not).

        Why physical: a typed PRNG key is a ``u32`` array underneath, and the
        transfer and the assembly carry plain arrays; :meth:`assemble` wraps keys
        again.
        """
        out = []
        for i, block in enumerate(blocks):
            wanted = self.local_shardings[i]
            if block.sharding is not wanted and not (
                block.sharding.is_equivalent_to(wanted, block.ndim)
                and block.sharding.memory_kind == wanted.memory_kind
            ):
                block = jax.device_put(block, wanted)
            out.append(jp.physical_array(block))
        return out

    def assemble(self, blocks: Sequence[jax.Array]) -> list[jax.Array]:
        """The global outputs whose physical blocks on this process are ``blocks``."""
        out = []
        for i, block in enumerate(blocks):
            if self.spans:
                whole = _physical(
                    jax.ShapeDtypeStruct(self.shapes[i], self.dtypes[i], sharding=self.shardings[i])
                )
                block = jax.make_array_from_single_device_arrays(
                    whole.shape, whole.sharding, [shard.data for shard in block.addressable_shards]
                )
            if jp.is_extended(jax.ShapeDtypeStruct((), self.dtypes[i])):
                block = jax.random.wrap_key_data(block, impl=jp.key_impl(self.dtypes[i]))
                if block.sharding != self.shardings[i]:
                    block = jax.device_put(block, self.shardings[i])
            out.append(block)
        return out

    def describe(self, i: int) -> str:
        return f"{self.dtypes[i]}{list(self.shapes[i])} laid out as {self.shardings[i]}"


def _mesh_spec(sharding: Sharding) -> tuple[Mesh, PartitionSpec]:
    """A layout's global sharding over processes as (mesh, spec)."""
    assert isinstance(sharding, NamedSharding) and isinstance(
        sharding.mesh, Mesh
    )  # by construction
    return sharding.mesh, sharding.spec


def _physical(struct: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The plain array behind ``struct`` (a key array's ``u32`` data, trailing dims whole)."""
    if not jp.is_extended(struct):
        return struct
    physical = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(struct.shape, struct.dtype))
    return jax.ShapeDtypeStruct(
        physical.shape,
        physical.dtype,
        sharding=jp.physical_sharding(jp.shaped_abstractify(struct), struct.sharding),
    )


def _global_sharding(sharding: Any, what: str, spans: bool) -> Sharding:
    """``sharding`` as an output's layout: itself in one process, over a mesh in several.

    Raises:
        ValueError: not a sharding; in several processes, not a NamedSharding over a
            mesh or one device.
    """
    if not isinstance(sharding, Sharding):
        raise ValueError(
            f"colocated_python: {what} must have a jax.sharding.Sharding, got {sharding!r}"
        )
    if not spans:
        return sharding
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return sharding
    if isinstance(sharding, SingleDeviceSharding):
        mesh = Mesh(np.array(list(sharding.device_set)), (_ONE_DEVICE_AXIS,))
        return NamedSharding(mesh, PartitionSpec(), memory_kind=sharding.memory_kind)
    raise ValueError(
        f"colocated_python: in a job of several processes, {what} must be laid out by a "
        f"NamedSharding over a mesh or on one device, got {sharding}"
    )


def layout_from_specs(out_specs: Any, spans: bool) -> OutputLayout:
    """The layout ``out_specs_fn`` declares (a pytree of ShapeDtypeStructs with shardings).

    Raises:
        ValueError: a leaf without a sharding (or, over processes, not laid out over a
            mesh or one device).
    """
    leaves, treedef = jax.tree_util.tree_flatten(out_specs)
    shardings = []
    for i, leaf in enumerate(leaves):
        if getattr(leaf, "sharding", None) is None:
            raise ValueError(
                f"colocated_python: out_specs_fn's output {i} ({leaf}) has no sharding; give "
                "jax.ShapeDtypeStruct(shape, dtype, sharding=...)"
            )
        shardings.append(_global_sharding(leaf.sharding, f"out_specs_fn's output {i}", spans))
    return _checked_layout(
        OutputLayout(
            treedef,
            tuple(tuple(leaf.shape) for leaf in leaves),
            tuple(leaf.dtype for leaf in leaves),
            tuple(shardings),
            spans,
        )
    )


def _checked_layout(layout: OutputLayout) -> OutputLayout:
    """``layout``, if the runtime can make its outputs.

    Raises:
        ValueError: a string output of a call that spans processes (jax 0.10.2's
            runtime cannot assemble a string array from several processes' shards).
    """
    for i, dtype in enumerate(layout.dtypes):
        if layout.spans and isinstance(dtype, np.dtypes.StringDType):
            raise ValueError(
                f"colocated_python: output {i} is a StringDType array of a call over several "
                "processes' devices, and jax's runtime cannot assemble a string array from "
                "several processes; return strings from a call on this process's devices "
                "(its arguments host-local arrays) or encode them as numbers"
            )
    return layout


def layout_from_outputs(outputs: Any, global_mesh: Mesh | None, spans: bool) -> OutputLayout:
    """The layout a first (discovery) call's host-local outputs show.

    For a call that spans processes, each output must be laid out over this
    process's block of ``global_mesh`` (the arguments' mesh); its global shape is
    the blocks' together.

    Raises:
        ValueError: an output that is not a ``jax.Array``, or laid out elsewhere.
    """
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    shardings, shapes = [], []
    for i, leaf in enumerate(leaves):
        check_output(leaf, i)
        sharding = leaf.sharding
        shape = tuple(leaf.shape)
        if spans:
            mesh, spec = _mesh_and_spec(sharding)
            if global_mesh is None or mesh != local_mesh(global_mesh):
                raise ValueError(
                    f"colocated_python: in a job of several processes, output {i} must be laid "
                    f"out over this process's part of the arguments' mesh (or give "
                    f"out_specs_fn), got {sharding}"
                )
            shape = global_shape(shape, global_mesh, spec)
            sharding = NamedSharding(global_mesh, spec, memory_kind=sharding.memory_kind)
        shardings.append(sharding)
        shapes.append(shape)
    return _checked_layout(
        OutputLayout(
            treedef, tuple(shapes), tuple(x.dtype for x in leaves), tuple(shardings), spans
        )
    )


def _mesh_and_spec(sharding: Any) -> tuple[Mesh | None, PartitionSpec]:
    """A block's sharding as (mesh, spec); a single device is a one-device mesh."""
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return sharding.mesh, sharding.spec
    if isinstance(sharding, SingleDeviceSharding):
        return Mesh(np.array(list(sharding.device_set)), (_ONE_DEVICE_AXIS,)), PartitionSpec()
    return None, PartitionSpec()


def check_output(leaf: Any, i: int) -> None:
    if not isinstance(leaf, jax.Array):
        raise ValueError(
            f"colocated_python only supports jax.Array as input and output, but output {i} is "
            f"{type(leaf).__name__}"
        )
