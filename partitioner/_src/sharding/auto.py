"""``AUTO``: a spec leaf partitioner resolves itself.

Why in the spec layer: ``AUTO`` is a spec-tree leaf like ``UNSPECIFIED`` (parsed,
broadcast over subtrees and checked by the same code). The search itself is
``_src/auto/`` (NOTE [auto search] there); the record of its choice is
``primitives/auto_choice.py``.
"""

from __future__ import annotations

from collections.abc import Iterable


class _Auto:
    """A spec leaf (or a whole subtree) whose layout partitioner chooses at lower time.

    A singleton, compared by identity like ``None``; its repr is the public name.
    """

    def __repr__(self) -> str:
        return "AUTO"

    def __reduce__(self) -> str:
        return "AUTO"  # pickles as the module-level singleton


#: Let partitioner choose this leaf's layout (``in_axis_resources=(AUTO, P("data"))``).
AUTO: _Auto = _Auto()


def has_auto(specs: Iterable[object]) -> bool:
    """Whether any of ``specs`` is AUTO (the plan then goes through the AUTO stage)."""
    return any(s is AUTO for s in specs)
