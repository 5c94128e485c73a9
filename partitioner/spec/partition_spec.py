"""The user-facing ``PartitionSpec`` value type.

Why our own class: jax's ``PartitionSpec`` cannot be subclassed and carries
``reduced``/``unreduced`` state partitioner does not model. Ours is a small,
immutable, canonical value that converts to and from jax's in both directions, so
either can be passed anywhere a spec is accepted.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any, TypeAlias

import jax

#: A dimension marker meaning "XLA may shard this dimension as it likes". It is
#: jax's own sentinel object, so a jax spec holding it converts to ours unchanged.
UNCONSTRAINED: Any = jax.sharding.PartitionSpec.UNCONSTRAINED

AxisName: TypeAlias = Hashable
#: A canonical entry: ``None``, one axis name, a tuple of >= 2 names, or UNCONSTRAINED.
Entry: TypeAlias = Any


def _canonical_entry(entry: Any) -> Entry:
    """Canonicalise one spec entry (``()`` -> ``None``, ``('x',)`` -> ``'x'``)."""
    if entry is None or entry is UNCONSTRAINED:
        return entry
    if isinstance(entry, (tuple, list)):
        names = tuple(entry)
        for name in names:
            if name is None or isinstance(name, (tuple, list)) or name is UNCONSTRAINED:
                raise TypeError(
                    f"PartitionSpec entry {entry!r}: a tuple entry must hold mesh axis "
                    f"names only, got {name!r}. Example: PartitionSpec(('data', 'model'))."
                )
        if not names:
            return None
        return names[0] if len(names) == 1 else names
    if not isinstance(entry, Hashable):
        raise TypeError(
            f"PartitionSpec entry {entry!r} of type {type(entry).__name__} is not a mesh "
            "axis name; entries are None, an axis name, or a tuple of axis names."
        )
    return entry


class PartitionSpec:
    """How each dimension of an array is split over mesh axes.

    Each entry is ``None`` (not partitioned), a mesh axis name, a tuple of names
    (split over their product, major to minor) or :data:`UNCONSTRAINED`.

    Invariants (checked by tests): entries are canonical, so
    ``PartitionSpec(('x',)) == PartitionSpec('x')`` and
    ``PartitionSpec(()) == PartitionSpec(None)``; ``eval(repr(p)) == p`` where
    ``PartitionSpec`` is in scope; ``from_jax(p.to_jax()) == p``.
    """

    __slots__ = ("_partitions",)
    _partitions: tuple[Entry, ...]

    UNCONSTRAINED = UNCONSTRAINED

    def __init__(self, *partitions: Any) -> None:
        object.__setattr__(self, "_partitions", tuple(_canonical_entry(p) for p in partitions))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("PartitionSpec is immutable")

    @property
    def partitions(self) -> tuple[Entry, ...]:
        return self._partitions

    def __len__(self) -> int:
        return len(self._partitions)

    def __getitem__(self, i: int) -> Entry:
        return self._partitions[i]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._partitions)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartitionSpec):
            return self._partitions == other._partitions
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("partitioner.PartitionSpec", self._partitions))

    def __repr__(self) -> str:
        body = ", ".join(repr(p) for p in self._partitions)
        return f"PartitionSpec({body})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (PartitionSpec, self._partitions)

    def to_jax(self) -> jax.sharding.PartitionSpec:
        """The equivalent ``jax.sharding.PartitionSpec``."""
        return jax.sharding.PartitionSpec(*self._partitions)

    @classmethod
    def from_jax(cls, spec: jax.sharding.PartitionSpec) -> PartitionSpec:
        """Convert a jax spec; ``reduced``/``unreduced`` axes are not representable."""
        if spec.unreduced or spec.reduced:
            raise ValueError(
                f"{spec!r} has reduced/unreduced axes, which partitioner does not model; "
                "use a spec with partitions only."
            )
        return cls(*spec.partitions)


def is_spec(x: Any) -> bool:
    """True for ours or jax's PartitionSpec."""
    return isinstance(x, (PartitionSpec, jax.sharding.PartitionSpec))


def as_spec(x: PartitionSpec | jax.sharding.PartitionSpec) -> PartitionSpec:
    """Our spec for either kind (jax's is converted)."""
    return x if isinstance(x, PartitionSpec) else PartitionSpec.from_jax(x)
