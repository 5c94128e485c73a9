"""A catalogue of hand-written sharding helpers, each with a planted bug and a correct twin.

Model code writes helpers like these by hand (spec normalisers, shard counts, index
maps, transposed specs, mesh flattening, serialised specs, OpSharding readers...).
Each case here is one helper in two versions and one property, written as a user
would with ``partitioner.testing.strategies`` and jax's own layouts as the oracle.
The catalogue measures the strategies: at hypothesis' default settings, with no saved
examples, every planted bug must be found in every run (whatever the seed), and no
correct twin flagged. ``python -m tests.testing.bug_catalogue --seeds 20`` prints the
table the property-testing how-to shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from partitioner.testing import assert_same_layout
from partitioner.testing.strategies import meshes, op_shardings, specs_and_shapes

#: hypothesis' own default number of examples.
DEFAULT_BUDGET = settings.get_profile("default").max_examples
DEFAULTS = settings(
    max_examples=DEFAULT_BUDGET,
    database=None,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
)


def _entries(spec: Any) -> list[tuple[str, ...]]:
    return [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]


def _sizes(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.shape)


# --- 1. a spec normaliser ---


def normalise(spec: Any) -> tuple[tuple[str, ...], ...]:
    """Each entry as a tuple of mesh axes, trailing empty entries dropped."""
    out = _entries(spec)
    while out and not out[-1]:
        out.pop()
    return tuple(out)


def normalise_bug(spec: Any) -> tuple[tuple[str, ...], ...]:
    """Drops the last axis of a tuple of three or more (an off-by-one in a slice)."""
    return tuple(e[:-1] if len(e) >= 3 else e for e in normalise(spec))


def normalise_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        rebuilt = P(*(e or None for e in helper(spec)))
        assert_same_layout(NamedSharding(mesh, rebuilt), NamedSharding(mesh, spec), shape)

    return prop


# --- 2. shards per dimension ---


def shards_per_dim(mesh: Mesh, spec: Any, ndim: int) -> list[int]:
    sizes, entries = _sizes(mesh), _entries(spec)
    return [
        math.prod(sizes[a] for a in (entries[d] if d < len(entries) else ())) for d in range(ndim)
    ]


def shards_per_dim_bug(mesh: Mesh, spec: Any, ndim: int) -> list[int]:
    """Counts only the first axis of a tuple."""
    sizes, entries = _sizes(mesh), _entries(spec)
    return [sizes[entries[d][0]] if d < len(entries) and entries[d] else 1 for d in range(ndim)]


def shards_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        block = NamedSharding(mesh, spec).shard_shape(shape)
        assert [n // b for n, b in zip(shape, block)] == helper(mesh, spec, len(shape))

    return prop


# --- 3. an index map: which block each device holds ---


def blocks(mesh: Mesh, spec: Any, shape: Sequence[int]) -> dict[int, tuple[tuple[int, int], ...]]:
    """Device id -> (start, stop) per dimension; a tuple's axes major to minor."""
    sizes, entries = _sizes(mesh), _entries(spec)
    out = {}
    for coords in np.ndindex(*mesh.devices.shape):
        at = dict(zip(mesh.axis_names, coords))
        ranges = []
        for d, n in enumerate(shape):
            axes = entries[d] if d < len(entries) else ()
            pieces, k = math.prod(sizes[a] for a in axes), 0
            for a in axes:
                k = k * sizes[a] + at[a]
            ranges.append((k * n // pieces, (k + 1) * n // pieces))
        out[mesh.devices[coords].id] = tuple(ranges)
    return out


def blocks_bug(
    mesh: Mesh, spec: Any, shape: Sequence[int]
) -> dict[int, tuple[tuple[int, int], ...]]:
    """Reads a tuple's axes minor to major."""
    flipped = P(*(tuple(reversed(e)) if len(e) > 1 else (e or None) for e in _entries(spec)))
    return blocks(mesh, flipped, shape)


def _jax_blocks(
    mesh: Mesh, spec: Any, shape: Sequence[int]
) -> dict[int, tuple[tuple[int, int], ...]]:
    found = NamedSharding(mesh, spec).devices_indices_map(tuple(shape))
    return {
        d.id: tuple(s.indices(n)[:2] for s, n in zip(index, shape)) for d, index in found.items()
    }


def blocks_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        assert helper(mesh, spec, shape) == _jax_blocks(mesh, spec, shape)

    return prop


# --- 4. the spec of a transposed value ---


def transposed(spec: Any, perm: Sequence[int]) -> Any:
    """The spec of ``jnp.transpose(x, perm)`` for ``x`` laid out by ``spec``."""
    entries = _entries(spec) + [()] * (len(perm) - len(_entries(spec)))
    return P(*(entries[p] or None for p in perm))


def transposed_bug(spec: Any, perm: Sequence[int]) -> Any:
    """Applies the inverse permutation (the same for swaps, wrong for cycles)."""
    entries = _entries(spec) + [()] * (len(perm) - len(_entries(spec)))
    out: list[Any] = [None] * len(perm)
    for i, p in enumerate(perm):
        out[p] = entries[i] or None
    return P(*out)


def transposed_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        perm = data.draw(st.permutations(range(len(shape))))
        ours = _jax_blocks(mesh, helper(spec, perm), [shape[p] for p in perm])
        want = {d: tuple(r[p] for p in perm) for d, r in _jax_blocks(mesh, spec, shape).items()}
        assert ours == want

    return prop


# --- 5. flattening a mesh to one axis ---


def flatten(mesh: Mesh) -> Mesh:
    return Mesh(mesh.devices.reshape(-1), ("flat",))


def flatten_bug(mesh: Mesh) -> Mesh:
    """Flattens the device grid column-major."""
    return Mesh(mesh.devices.flatten(order="F"), ("flat",))


def flatten_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        k = data.draw(st.integers(1, 3))
        every = NamedSharding(mesh, P(tuple(mesh.axis_names)))
        assert_same_layout(NamedSharding(helper(mesh), P("flat")), every, (mesh.size * k,))

    return prop


# --- 6. does a spec divide a shape evenly ---


def divides(mesh: Mesh, spec: Any, shape: Sequence[int]) -> bool:
    return all(n % k == 0 for n, k in zip(shape, shards_per_dim(mesh, spec, len(shape))))


def divides_bug(mesh: Mesh, spec: Any, shape: Sequence[int]) -> bool:
    """Checks each axis of a tuple on its own."""
    sizes, entries = _sizes(mesh), _entries(spec)
    return all(n % sizes[a] == 0 for n, e in zip(shape, entries) for a in e)


def divides_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        uneven = mesh.size > 1 and data.draw(st.booleans())
        spec, shape = data.draw(specs_and_shapes(mesh, uneven=uneven))
        padded = NamedSharding(mesh, spec).shard_shape  # jax refuses uneven shapes here
        try:
            padded(shape)
            even = True
        except ValueError:
            even = False
        assert helper(mesh, spec, shape) == even

    return prop


# --- 7. a spec written to text and read back (checkpoint metadata) ---


def to_text(spec: Any) -> str:
    return ";".join(",".join(e) if e else "-" for e in _entries(spec))


def from_text(text: str) -> Any:
    if not text:
        return P()
    return P(*(None if e == "-" else tuple(e.split(",")) for e in text.split(";")))


def from_text_bug(text: str) -> Any:
    """Splits each entry at its first comma only."""
    if not text:
        return P()
    return P(*(None if e == "-" else tuple(e.split(",", 1)) for e in text.split(";")))


def text_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, _ = data.draw(specs_and_shapes(mesh))
        assert normalise(helper(to_text(spec))) == normalise(spec)

    return prop


# --- 8. an FSDP spec: every mesh axis on the first dimension ---


def fsdp(mesh: Mesh) -> Any:
    """The mesh's axes that split something, on dimension 0."""
    return P(tuple(a for a in mesh.axis_names if mesh.shape[a] > 1) or None)


def fsdp_bug(mesh: Mesh) -> Any:
    """Stops at the first size-1 axis (a ``break`` meant as ``continue``)."""
    axes = []
    for a in mesh.axis_names:
        if mesh.shape[a] == 1:
            break
        axes.append(a)
    return P(tuple(axes) or None)


def fsdp_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        block = NamedSharding(mesh, helper(mesh)).shard_shape((mesh.size * 2,))
        assert block == (2,)  # every device its own piece

    return prop


# --- 9. where a device sits in the mesh ---


def position(mesh: Mesh, device: Any) -> tuple[int, ...]:
    (at,) = np.argwhere(mesh.devices == device)
    return tuple(int(i) for i in at)


def position_bug(mesh: Mesh, device: Any) -> tuple[int, ...]:
    """Assumes the mesh holds devices 0..n-1 in order."""
    return tuple(int(i) for i in np.unravel_index(device.id % mesh.size, mesh.devices.shape))


def position_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        device = data.draw(st.sampled_from(list(mesh.devices.flat)))
        assert mesh.devices[helper(mesh, device)] == device

    return prop


# --- 10. the mesh axes a spec uses ---


def used_axes(spec: Any) -> set[str]:
    return {a for e in _entries(spec) for a in e}


def used_axes_bug(spec: Any) -> set[str]:
    """Sees only entries that are a single axis name."""
    return {e for e in spec if isinstance(e, str)}


def used_axes_property(helper: Callable[..., Any]) -> Callable[[], None]:
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        spec, shape = data.draw(specs_and_shapes(mesh))
        split = NamedSharding(mesh, spec).shard_shape(shape)
        # An axis of size > 1 that the spec uses cuts some dimension.
        cutting = {a for a in helper(spec) if mesh.shape[a] > 1}
        want = {a for a in used_axes(spec) if mesh.shape[a] > 1}
        assert cutting == want, (split, cutting, want)

    return prop


# --- 11. the devices of an OpSharding, read from its iota form ---


def op_devices(proto: Any) -> list[int]:
    """Device positions in tile order, from ``tile_assignment_devices`` or the iota form."""
    if proto.tile_assignment_devices:
        return list(proto.tile_assignment_devices)
    dims = list(proto.iota_reshape_dims)
    perm = list(proto.iota_transpose_perm) or list(range(len(dims)))
    return np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(-1).tolist()


def op_devices_bug(proto: Any) -> list[int]:
    """Ignores the iota form's transpose."""
    if proto.tile_assignment_devices:
        return list(proto.tile_assignment_devices)
    return list(range(math.prod(proto.iota_reshape_dims)))


def op_devices_property(helper: Callable[..., Any]) -> Callable[[], None]:
    from partitioner._src import jax_private as jp

    @given(st.data())
    def prop(data: Any) -> None:
        mesh = data.draw(meshes())
        proto = data.draw(op_shardings(mesh))
        if proto.type != jp.OpSharding.Type.OTHER:
            return
        want = [int(d) for d in jp.HloSharding.from_proto(proto).tile_assignment_devices()]
        assert helper(proto) == want

    return prop


@dataclasses.dataclass(frozen=True)
class Case:
    helper: str
    bug: str
    correct: Callable[..., Any]
    buggy: Callable[..., Any]
    prop: Callable[[Callable[..., Any]], Callable[[], None]]


CATALOGUE = (
    Case("spec normaliser", "drops the last axis of a 3+-axis tuple", normalise, normalise_bug, normalise_property),
    Case("shards per dimension", "counts only a tuple's first axis", shards_per_dim, shards_per_dim_bug, shards_property),
    Case("index map", "reads a tuple's axes minor to major", blocks, blocks_bug, blocks_property),
    Case("transposed spec", "applies the inverse permutation", transposed, transposed_bug, transposed_property),
    Case("mesh flattening", "flattens the device grid column-major", flatten, flatten_bug, flatten_property),
    Case("divisibility check", "checks a tuple's axes one by one", divides, divides_bug, divides_property),
    Case("spec to text and back", "splits an entry at its first comma only", from_text, from_text_bug, text_property),
    Case("FSDP spec", "stops at the first size-1 axis", fsdp, fsdp_bug, fsdp_property),
    Case("device position", "assumes devices 0..n-1 in order", position, position_bug, position_property),
    Case("axes a spec uses", "misses axes inside tuples", used_axes, used_axes_bug, used_axes_property),
    Case("OpSharding devices", "ignores the iota transpose", op_devices, op_devices_bug, op_devices_property),
)  # fmt: skip


#: Whether a run finds a bug is settled before shrinking: the measurement leaves it out.
UNSHRUNK = settings(DEFAULTS, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def finds(
    case: Case, helper: Callable[..., Any], run_seed: int, config: settings = UNSHRUNK
) -> bool:
    """Whether the property fails for ``helper`` in one run from ``run_seed``."""
    prop = seed(run_seed)(config(case.prop(helper)))
    try:
        prop()
    except Exception:  # a failed assertion, or jax refusing what the helper made
        return True
    return False


def table(seeds: Sequence[int]) -> list[tuple[str, str, int, int]]:
    """Per case: (helper, bug, runs that found the bug, runs that flagged the correct twin)."""
    return [
        (
            c.helper,
            c.bug,
            sum(finds(c, c.buggy, s) for s in seeds),
            sum(finds(c, c.correct, s) for s in seeds),
        )
        for c in CATALOGUE
    ]


if __name__ == "__main__":
    import argparse
    import os

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    n = parser.parse_args().seeds
    print(f"| helper | planted bug | runs that found it (of {n}) | correct twin flagged |")
    print("|---|---|---:|---:|")
    for helper, bug, found, flagged in table(range(n)):
        print(f"| {helper} | {bug} | {found} | {flagged} |")
