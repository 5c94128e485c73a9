"""``PartitionSpec``: the user-facing spec, which *is* ``jax.sharding.PartitionSpec``.

Why jax's own type and not a class of ours: a spec must work wherever jax's does
(``NamedSharding(mesh, spec)``, ``jax.device_put(x, spec)`` under ``jax.set_mesh``,
``shard_map``), and jax checks ``isinstance(spec, jax.sharding.PartitionSpec)`` in
those places while refusing subclasses. So ``partitioner.PartitionSpec(...)`` checks
its entries (clear TypeErrors, where jax accepts nonsense such as ``('x', None)``)
and then builds a jax spec; ``isinstance(p, partitioner.PartitionSpec)`` is true of
every jax spec. jax canonicalises entries (``('x',)`` -> ``'x'``, ``()`` -> ``None``)
and interns specs, so equal specs are equal, hash equal and even identical.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeAlias

import jax

#: A dimension marker meaning "XLA may shard this dimension as it likes". It is
#: jax's own sentinel object.
UNCONSTRAINED: Any = jax.sharding.PartitionSpec.UNCONSTRAINED

AxisName: TypeAlias = Hashable
#: The type of every spec, for annotations (``PartitionSpec`` below only builds them).
Spec: TypeAlias = jax.sharding.PartitionSpec
_JaxSpec = jax.sharding.PartitionSpec


def _check_entry(entry: Any) -> None:
    """Reject an entry no mesh can partition by: ours names the entry and the fix."""
    if entry is None or entry is UNCONSTRAINED:
        return
    if isinstance(entry, (tuple, list)):
        for name in entry:
            if name is None or isinstance(name, (tuple, list)) or name is UNCONSTRAINED:
                raise TypeError(
                    f"PartitionSpec entry {entry!r}: a tuple entry must hold mesh axis "
                    f"names only, got {name!r}. Example: PartitionSpec(('data', 'model'))."
                )
        return
    if not isinstance(entry, Hashable):
        raise TypeError(
            f"PartitionSpec entry {entry!r} of type {type(entry).__name__} is not a mesh "
            "axis name; entries are None, an axis name, or a tuple of axis names."
        )


class _SpecType(type):
    """Makes ``isinstance(x, PartitionSpec)`` mean "x is a jax PartitionSpec"."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _JaxSpec)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _JaxSpec)


class PartitionSpec(metaclass=_SpecType):
    """How each dimension of an array is split over mesh axes.

    Each entry is ``None`` (not partitioned), a mesh axis name, a tuple of names
    (split over their product, major to minor) or :data:`UNCONSTRAINED`.
    ``PartitionSpec(*entries)`` returns a ``jax.sharding.PartitionSpec``.

    Invariants (checked by tests): ``PartitionSpec(('x',)) == PartitionSpec('x')``,
    ``PartitionSpec(()) == PartitionSpec(None)``, trailing ``None`` entries are kept
    (``PartitionSpec('x') != PartitionSpec('x', None)``), and
    ``eval(repr(p), {'P': PartitionSpec}) == p``.

    Raises:
        TypeError: an entry is not None, an axis name, a tuple of names or
            UNCONSTRAINED.
    """

    UNCONSTRAINED = UNCONSTRAINED

    def __new__(cls, *partitions: Any) -> Spec:  # type: ignore[misc]
        for entry in partitions:
            _check_entry(entry)
        return _JaxSpec(*partitions)


def is_spec(x: Any) -> bool:
    """True for a PartitionSpec (ours are jax's)."""
    return isinstance(x, _JaxSpec)


def check_no_reduced(spec: Any, where: str) -> None:
    """Reject ``reduced``/``unreduced`` axes, which partitioner does not model.

    Raises:
        ValueError: naming ``where`` and the spec.
    """
    if spec.unreduced or spec.reduced:
        raise ValueError(
            f"{where}: {spec!r} has reduced/unreduced axes, which partitioner does not "
            "model; use a spec with partitions only."
        )
