"""``ParsedPartitionSpec``: the internal, normalised form of a user spec.

Why a second type: transformation rules rewrite specs (vmap inserts a batch
dimension, transposition swaps inputs and outputs). Error messages must still
quote what the user wrote, but only while that is still truthful. The sync level
records how far ``partitions`` has drifted from the user's spec.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from .errors import DuplicateMeshAxisError
from .partition_spec import (
    UNCONSTRAINED,
    AxisName,
    PartitionSpec,
    Spec,
    check_no_reduced,
    is_spec,
)

# jax's sentence first (``except DuplicateSpecError`` and ``match=`` written against jax.jit
# hold), then ours.
MSG_DUPLICATE_AXIS = """\
A single {keyword} specification can map every mesh axis to at most one positional \
dimension, but {spec} has duplicate entries for {shown}.
{where}: the spec {spec} uses mesh {axes} more than once. Each mesh axis can \
partition at most one dimension of a value; e.g. PartitionSpec('x', 'y') instead of \
PartitionSpec('x', 'x')."""

# jax's sentence first (``pytest.raises(match=...)`` written against jax.jit holds), then ours.
MSG_NOT_A_SPEC = """\
{keyword} leaf specifications are expected to be PartitionSpec instances or None, but got \
{value}. {where}: got {value!r} of type {type_name}, where a PartitionSpec, a NamedSharding, \
a SingleDeviceSharding, a Format or None is expected."""

# Said only for an axis name given bare: for another value (an int) it would be wrong advice.
MSG_WRAP_AXIS_NAME = """ Wrap axis names in a spec: PartitionSpec({value!r}) instead of \
{value!r}."""

MSG_BARE_LAYOUT = """\
{where}: got the layout {value!r} alone; as jax.jit, pjit does not accept device-local \
layouts directly. Wrap it with its sharding: Format({value!r}, NamedSharding(mesh, spec))."""

MSG_UNCONSTRAINED_IN_PJIT = """\
Unconstrained dims are not allowed when passed to {where}: {spec}. Dimension {dim} is \
UNCONSTRAINED, which only with_sharding_constraint accepts: a call's inputs and outputs \
need a definite layout, so use None (replicated) or a mesh axis name there."""


class SpecSync(enum.IntEnum):
    """How far ``partitions`` may differ from the user's spec."""

    OUT_OF_SYNC = 0  # arbitrary changes, e.g. a new partitioned axis was inserted
    DIM_PERMUTE = 1  # dims inserted/permuted, but no new mesh axes
    IN_SYNC = 2  # exactly what the user wrote


class _Conversions:
    """The conversions of a parsed spec: the PartitionSpec it spells, how it cuts a shape.

    Why apart from :class:`ParsedPartitionSpec`: that class makes, rewrites and
    compares specs; these only read ``partitions`` and ``unconstrained_dims``
    (its invariants) to answer what a layout is in jax's terms and per device.
    """

    __slots__ = ()
    partitions: tuple[tuple[AxisName, ...], ...]
    unconstrained_dims: frozenset[int]

    @property
    def mesh_axes(self) -> tuple[AxisName, ...]:
        """Every mesh axis used, in spec order (major to minor)."""
        return tuple(a for axes in self.partitions for a in axes)

    def shards_per_dim(self, mesh: Mesh, ndim: int) -> tuple[int, ...]:
        """How many pieces each of ``ndim`` dimensions is cut into over ``mesh``."""
        sizes = dict(mesh.shape)
        parts = self.partitions + ((),) * (ndim - len(self.partitions))
        return tuple(math.prod(sizes[a] for a in axes) for axes in parts[:ndim])

    def shard_shape(self, shape: tuple[int, ...], mesh: Mesh) -> tuple[int, ...]:
        """The per-device shape of a value of ``shape`` laid out with this spec (ceil)."""
        per_dim = self.shards_per_dim(mesh, len(shape))
        return tuple(-(-n // k) for n, k in zip(shape, per_dim, strict=True))

    def to_partition_spec(self) -> Spec:
        """The PartitionSpec of these partitions (trailing unpartitioned dims dropped)."""
        entries: list[Any] = [
            UNCONSTRAINED if d in self.unconstrained_dims else (axes or None)
            for d, axes in enumerate(self.partitions)
        ]
        while entries and entries[-1] is None:
            entries.pop()
        return PartitionSpec(*entries)

    def to_closed_spec(self) -> Spec:
        """The spec with UNCONSTRAINED dims laid out unpartitioned (for NamedSharding)."""
        return PartitionSpec(*(axes or None for axes in self.partitions))


class ParsedPartitionSpec(_Conversions):
    """A spec as a tuple of axis-name tuples, one per leading dimension.

    Invariants: ``partitions[d]`` is a tuple of mesh axis names (``()`` means
    unpartitioned); no axis name appears twice; ``d in unconstrained_dims`` implies
    ``partitions[d] == ()``. Equality and hashing see the layout only, not the
    user's spec (which only feeds messages) nor the sync level, so every spelling
    of one layout shares caches.
    """

    __slots__ = (
        "partitions",
        "unconstrained_dims",
        "unsafe_user_spec",
        "sync",
        "memory_kind",
        "layout",
    )
    partitions: tuple[tuple[AxisName, ...], ...]
    unconstrained_dims: frozenset[int]
    unsafe_user_spec: Any
    sync: SpecSync
    # The memory space the user asked for (a NamedSharding's ``memory_kind``,
    # e.g. "pinned_host"); None where the spec says nothing about memory
    # (a PartitionSpec or None leaf). NOTE [memory kinds] in ``lower/memory.py``.
    memory_kind: str | None
    # The memory layout the user asked for (a ``Format`` leaf's ``Layout`` or
    # ``Layout.AUTO``); None where the spec leaves it to XLA's default.
    layout: Any

    def __init__(
        self,
        user_spec: Any,
        partitions: tuple[tuple[AxisName, ...], ...] | list[tuple[AxisName, ...]],
        sync: SpecSync = SpecSync.IN_SYNC,
        unconstrained_dims: frozenset[int] = frozenset(),
        memory_kind: str | None = None,
        layout: Any = None,
    ) -> None:
        object.__setattr__(self, "partitions", tuple(tuple(p) for p in partitions))
        object.__setattr__(self, "unconstrained_dims", frozenset(unconstrained_dims))
        object.__setattr__(self, "unsafe_user_spec", user_spec)
        object.__setattr__(self, "sync", SpecSync(sync))
        object.__setattr__(self, "memory_kind", memory_kind)
        object.__setattr__(self, "layout", layout)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ParsedPartitionSpec is immutable")

    def _init_args(self) -> dict[str, Any]:
        """What ``__init__`` rebuilds this spec from, by its parameter names."""
        return {
            "user_spec": self.unsafe_user_spec,
            "partitions": self.partitions,
            "sync": self.sync,
            "unconstrained_dims": self.unconstrained_dims,
            "memory_kind": self.memory_kind,
            "layout": self.layout,
        }

    def _replace(self, **changes: Any) -> ParsedPartitionSpec:
        """A copy with some of ``__init__``'s arguments changed (checked again by it)."""
        return ParsedPartitionSpec(**{**self._init_args(), **changes})

    def __reduce__(self) -> tuple[Any, ...]:
        # The default slot-state protocol restores through __setattr__, which
        # refuses; rebuild through __init__ so copy/deepcopy/pickle work.
        return (ParsedPartitionSpec, tuple(self._init_args().values()))

    # --- user spec, for messages ---

    @property
    def user_spec(self) -> Any:
        """The user's spec; only valid while fully in sync."""
        return self.unsynced_user_spec(SpecSync.IN_SYNC)

    def unsynced_user_spec(self, min_sync: SpecSync) -> Any:
        if self.sync < min_sync:
            raise AssertionError(
                f"internal error: spec sync {self.sync!r} below {min_sync!r}; please report"
            )
        return self.unsafe_user_spec

    def describe(self) -> str:
        """The spec as the user wrote it when still truthful, else the parsed form."""
        if self.sync == SpecSync.IN_SYNC and self.unsafe_user_spec is not None:
            return repr(self.unsafe_user_spec)
        return repr(self.to_partition_spec())

    # --- construction ---

    @classmethod
    def from_user_input(
        cls,
        entry: Any,
        arg_name: str,
        *,
        allow_unconstrained: bool = False,
        keyword: str | None = None,
    ) -> ParsedPartitionSpec:
        """Parse one spec leaf: a PartitionSpec, a ``NamedSharding`` (its spec) or ``None``.

        A NamedSharding's mesh is not checked here (it is not known yet when
        ``pjit`` is applied); ``sharding.tree.meshes_named_by`` collects it for that.

        Args:
            keyword: the option the leaf was given to, as jax's message names it
                (``"in_shardings"``); ``arg_name`` where None.

        Raises:
            TypeError: ``entry`` is not a spec, a NamedSharding or ``None``.
            ValueError: reduced axes, or UNCONSTRAINED where it is not allowed.
            DuplicateMeshAxisError: an axis repeats (jax's ``DuplicateSpecError``,
                also a ValueError).
        """
        return _parse_leaf(entry, arg_name, allow_unconstrained, keyword or arg_name)

    @classmethod
    def coerce(
        cls,
        value: Any,
        where: str,
        *,
        allow_unconstrained: bool = False,
        keyword: str | None = None,
    ) -> ParsedPartitionSpec:
        """``value`` as a parsed spec: a parsed spec as is, ``None`` replicated, else parsed.

        The one conversion every API that takes "a spec" uses (spec trees,
        ``get_aval_sharding_proto``, ``sharding_spec_from_parsed``).

        Raises:
            TypeError / ValueError: as :meth:`from_user_input`, naming ``where``.
        """
        if isinstance(value, ParsedPartitionSpec):
            return value
        return cls.from_user_input(
            value, where, allow_unconstrained=allow_unconstrained, keyword=keyword
        )

    def insert_axis_partitions(
        self, dim: int, axes: tuple[AxisName, ...], *, unconstrained: bool = False
    ) -> ParsedPartitionSpec:
        """A spec with a new dimension at ``dim`` partitioned over ``axes``.

        Used by vmap: the batch dimension comes in unpartitioned (``axes == ()``,
        the user's spec is still meaningful up to a permutation) or over the
        ``spmd_axis_name`` (new axes: out of sync). ``unconstrained`` marks the
        new dimension open (constraints leave a batch dimension to XLA).
        """
        if unconstrained and axes:
            raise ValueError("an unconstrained dimension cannot be partitioned")
        parts = self.partitions + ((),) * max(0, dim - len(self.partitions))
        new_parts = parts[:dim] + (tuple(axes),) + parts[dim:]
        shifted = {d if d < dim else d + 1 for d in self.unconstrained_dims}
        unconstrained_dims = frozenset(shifted | ({dim} if unconstrained else set()))
        sync = min(self.sync, SpecSync.DIM_PERMUTE if not axes else SpecSync.OUT_OF_SYNC)
        # A layout orders the old dims; a batched value is laid out by XLA.
        return self._replace(
            partitions=new_parts, sync=sync, unconstrained_dims=unconstrained_dims, layout=None
        )

    def with_memory_kind(self, memory_kind: str | None) -> ParsedPartitionSpec:
        """The same layout in another memory space (None: unstated)."""
        return self._replace(memory_kind=memory_kind)

    def with_layout(self, layout: Any) -> ParsedPartitionSpec:
        """The same layout and memory kind with another memory layout (None: XLA's default)."""
        return self._replace(layout=layout)

    # --- value semantics ---

    def _key(self) -> tuple[Any, ...]:
        # The layout only: neither the user's spelling nor the sync level, so a
        # spec vmap rewrote equals the user spec with the same layout and both
        # share one executable (NOTE [executable cache]).
        parts = list(self.partitions)
        while parts and parts[-1] == () and len(parts) - 1 not in self.unconstrained_dims:
            parts.pop()
        return (tuple(parts), self.unconstrained_dims, self.memory_kind, self.layout)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParsedPartitionSpec):
            return NotImplemented
        return self._key() == other._key()

    def __len__(self) -> int:
        return len(self.partitions)

    def __getitem__(self, i: int) -> tuple[AxisName, ...]:
        return self.partitions[i]

    def __iter__(self) -> Iterator[tuple[AxisName, ...]]:
        return iter(self.partitions)

    def __repr__(self) -> str:
        extra = (
            f", unconstrained_dims={sorted(self.unconstrained_dims)}"
            if self.unconstrained_dims
            else ""
        )
        if self.memory_kind is not None:
            extra += f", memory_kind={self.memory_kind!r}"
        if self.layout is not None:
            extra += f", layout={self.layout!r}"
        return f"ParsedPartitionSpec(partitions={self.partitions}, sync={self.sync.name}{extra})"


def stated_memory_kind(sharding: NamedSharding) -> str | None:
    """The memory kind a NamedSharding states (jax fills in its devices' default)."""
    return sharding.memory_kind


#: The fully replicated spec (what a ``None`` leaf means).
REPLICATED = ParsedPartitionSpec(None, ())


def _parse_leaf(
    entry: Any, arg_name: str, allow_unconstrained: bool, keyword: str
) -> ParsedPartitionSpec:
    """:meth:`ParsedPartitionSpec.from_user_input`: unwrap the leaf, then parse its entries."""
    layout = None
    if isinstance(entry, Format):
        layout, entry = entry.layout, entry.sharding
    elif isinstance(entry, (Layout, type(Layout.AUTO))):
        raise ValueError(MSG_BARE_LAYOUT.format(where=arg_name, value=entry))
    if entry is None:
        return ParsedPartitionSpec(None, (), layout=layout)
    memory_kind = None
    if isinstance(entry, SingleDeviceSharding):
        # One device: nothing to partition (its device is the call's mesh,
        # ``sharding.tree.meshes_named_by``).
        return ParsedPartitionSpec(
            PartitionSpec(), (), memory_kind=entry.memory_kind, layout=layout
        )
    if isinstance(entry, NamedSharding):
        memory_kind = stated_memory_kind(entry)
        entry = entry.spec
    if not is_spec(entry):
        raise TypeError(
            MSG_NOT_A_SPEC.format(
                keyword=keyword, where=arg_name, value=entry, type_name=type(entry).__name__
            )
            + (MSG_WRAP_AXIS_NAME.format(value=entry) if isinstance(entry, str) else "")
        )
    check_no_reduced(entry, arg_name)
    partitions, unconstrained = _entries(entry, arg_name, allow_unconstrained)
    _check_unique_axes(entry, partitions, arg_name, keyword)
    return ParsedPartitionSpec(
        entry,
        partitions,
        unconstrained_dims=frozenset(unconstrained),
        memory_kind=memory_kind,
        layout=layout,
    )


def _entries(
    spec: Any, arg_name: str, allow_unconstrained: bool
) -> tuple[list[tuple[AxisName, ...]], set[int]]:
    """Each dimension's mesh axes, and the UNCONSTRAINED dimensions, of a PartitionSpec.

    Raises:
        ValueError: UNCONSTRAINED where it is not allowed.
    """
    partitions: list[tuple[AxisName, ...]] = []
    unconstrained: set[int] = set()
    for dim, p in enumerate(spec):
        if p is UNCONSTRAINED:
            if not allow_unconstrained:
                raise ValueError(
                    MSG_UNCONSTRAINED_IN_PJIT.format(where=arg_name, spec=spec, dim=dim)
                )
            unconstrained.add(dim)
            partitions.append(())
            continue
        partitions.append(() if p is None else (p if isinstance(p, tuple) else (p,)))
    return partitions, unconstrained


def _check_unique_axes(
    spec: Any, partitions: list[tuple[AxisName, ...]], arg_name: str, keyword: str
) -> None:
    """Refuse a spec naming a mesh axis twice, as jax does when it builds the sharding.

    Raises:
        DuplicateMeshAxisError: jax's ``DuplicateSpecError`` (and a ValueError),
            naming every repeated axis.
    """
    counts = Counter(axis for axes in partitions for axis in axes)
    repeated = [axis for axis, n in counts.items() if n > 1]
    if not repeated:
        return
    raise DuplicateMeshAxisError(
        MSG_DUPLICATE_AXIS.format(
            keyword=keyword,
            spec=spec,
            shown=", ".join(sorted(f"`{a}`" for a in repeated)),
            where=arg_name,
            axes=("axis " if len(repeated) == 1 else "axes ") + ", ".join(map(repr, repeated)),
        ),
        pspec=spec,
    )
