"""partitioner's exception classes: subclasses of the classes jax raises for the same mistake.

Why subclasses: code written against ``jax.jit`` / ``jax.pmap`` catches jax's
classes (``except IndivisibleError``); ours must land in those clauses while
keeping messages that name the argument path, the axis and the sizes. Each
class also keeps ``ValueError`` among its bases, the class partitioner raised
before, so ``except ValueError`` written against partitioner still holds.

Every class takes the message alone, so an error listing several bad leaves of
one spec tree keeps their class (``checks.raise_all``). The classes live at the
lowest stage that raises them, so every stage above may too.
"""

from __future__ import annotations

from typing import Any

from .. import jax_private as jp


class IndivisibleShapeError(jp.IndivisibleError):
    """A dimension not divisible by the product of the mesh axes it is split over.

    jax raises ``IndivisibleError`` (a ``ValueError``) when a sharding does not
    divide its value's shape.
    """


class DuplicateMeshAxisError(jp.DuplicateSpecError, ValueError):
    """A spec naming one mesh axis for two dimensions (or twice in one).

    jax raises ``DuplicateSpecError`` (an ``Exception``, not a ``ValueError``)
    when a spec given to ``jax.jit`` or ``with_sharding_constraint`` repeats an
    axis; it carries ``mesh`` and ``pspec`` attributes, as this one does.
    """

    def __init__(self, message: str, *, mesh: Any = None, pspec: Any = None) -> None:
        super().__init__(message, mesh, pspec)


class MappedAxisError(IndexError, ValueError):
    """A pmap ``in_axes`` / ``out_axes`` entry out of range for its value's rank.

    jax.pmap raises ``IndexError`` for an ``in_axes`` past the first mapped
    argument's rank, and ``ValueError`` for one past a later argument's: both
    catch this one (as numpy's ``AxisError`` is both).
    """


class MappedSizeError(jp.IndivisibleError):
    """pmap arguments whose mapped axes have different sizes.

    jax.pmap shards every argument over one mesh axis of the first size it
    sees, and raises ``IndivisibleError`` for an argument whose size it does
    not divide.
    """
