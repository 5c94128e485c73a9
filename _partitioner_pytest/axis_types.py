"""The one spelling of ``axis_types`` across partitioner.testing.

``strategies.meshes``, ``assert_sharding_invariant`` and the plugin's ``mesh`` fixture
all take ``axis_types`` in the form ``jax.make_mesh`` takes it: a
``jax.sharding.AxisType`` (every axis of that type) or a sequence of them. Each value
may also be the type's name as a string, in any case (``"auto"``, ``"Explicit"``):
``assert_sharding_invariant`` took ``"auto"`` / ``"explicit"`` before the kit agreed on
one type, and a form accepted once stays accepted. This module is the only place that
reads the forms, so the three cannot drift apart again.

It lives in the plugin's package, the lowest of the kit (it loads before partitioner and
imports neither jax nor partitioner when pytest loads it: the plugin imports this module
where used), so the kit's modules import it downward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn, TypeAlias

from jax.sharding import AxisType

AxisTypeLike: TypeAlias = AxisType | str
"""An axis type: ``jax.sharding.AxisType`` or its name (``"auto"``, ``"explicit"``, ...)."""

AxisTypes: TypeAlias = AxisTypeLike | Sequence[AxisTypeLike]
"""What every ``axis_types`` argument of the kit takes: one axis type, or a sequence."""

_BY_NAME = {t.name.lower(): t for t in AxisType}

MSG_BAD_AXIS_TYPES = """\
{where}: axis_types must be a jax.sharding.AxisType ({names}), its name as a string, \
or a non-empty sequence of those; got {value!r}. For example axis_types=AxisType.Auto \
or axis_types=(AxisType.Auto, AxisType.Explicit)."""


def normalize_axis_types(value: AxisTypes, where: str) -> AxisType | tuple[AxisType, ...]:
    """``value`` with every name read as its ``AxisType``: one type stays one type (the
    caller decides what it means for several axes), a sequence becomes a tuple.

    Invariant: the result holds only ``AxisType`` members, and a sequence result is
    non-empty; ``normalize_axis_types(normalize_axis_types(v, w), w)`` is the same value.

    Raises:
        TypeError: ``value``, or one of its items, is neither an AxisType nor a string.
        ValueError: a string names no AxisType, or the sequence is empty.
    """
    if isinstance(value, (AxisType, str)):
        return _one(value, value, where)
    if not isinstance(value, Sequence) or not value:
        _refuse(value, where, TypeError if not isinstance(value, Sequence) else ValueError)
    return tuple(_one(item, value, where) for item in value)


def _one(item: object, value: object, where: str) -> AxisType:
    """One axis type; an error names the whole ``value`` the user passed."""
    if isinstance(item, AxisType):
        return item
    if not isinstance(item, str):
        _refuse(value, where, TypeError)
    if item.lower() not in _BY_NAME:
        _refuse(value, where, ValueError)
    return _BY_NAME[item.lower()]


def _refuse(value: object, where: str, error: type[Exception]) -> NoReturn:
    names = ", ".join(f"AxisType.{t.name}" for t in AxisType)
    raise error(MSG_BAD_AXIS_TYPES.format(where=where, names=names, value=value))
