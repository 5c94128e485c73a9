"""One typed view of a primitive's keyword params, shared by every primitive of ours.

Why: jax hands rules, lowerings and impls an equation's params as a flat keyword
dict. String lookups (``params["transforms"]``) spread the knowledge of what a
primitive carries over every file that touches it, and each file re-checks (or
forgets to check) how the fields fit together. Each primitive instead declares a
frozen dataclass subclass of :class:`PrimitiveParams`: its fields name and type
what the primitive carries, its :meth:`PrimitiveParams.check` states the
invariants once, and every rule goes through ``of`` / ``replace`` / ``bind``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from .. import jax_private as jp


@dataclasses.dataclass(frozen=True)
class PrimitiveParams:
    """Base of every primitive's typed params (subclasses are frozen dataclasses).

    Class attributes a subclass sets:
        primitive: the primitive these are the params of (``bind`` binds it).
        tuple_fields: fields normalized to tuples at construction (so equal
            params hash equal whether a rule built a list or a tuple).

    Invariant: every instance passed :meth:`check` (construction, ``of`` and
    ``replace`` all run it), so a rule never sees inconsistent params.
    """

    primitive: ClassVar[jp.Primitive]
    tuple_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for field in self.tuple_fields:
            object.__setattr__(self, field, tuple(getattr(self, field)))
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` (an internal error) if the fields do not fit together."""

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Self:
        """The typed view of an equation's (or a rule's) keyword params."""
        return cls(**params)

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields replaced (the invariants are checked again)."""
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict[str, Any]:
        """The flat keyword params ``primitive.bind`` and jax's machinery take."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def bind(self, *args: Any) -> Any:
        """``primitive.bind(*args)`` with these params: staged, or run by the impl."""
        return self.primitive.bind(*args, **self.as_kwargs())
