"""Which output of which program a result's sharding object belongs to: for the message
that tells where a committed argument laid out otherwise came from.

Why: a training loop feeds a call's outputs back as its arguments. When one arrives
laid out otherwise than the call's spec for it (an AUTO layout, NOTE [loop-safe
layouts] in ``auto/search/problem.py``, or a spec given by hand), the error is only
useful if it names the output that laid it out, so the user knows which spec to
change. Every result of an executable shares the sharding object of its output
(jaxlib's results handler hands each array the one it was given), so the object's
identity names the output. Only the most recent :data:`SIZE` executables' outputs
are remembered (the objects are held, so an id is never reused while remembered).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

#: Outputs remembered, the oldest forgotten first.
SIZE = 4096

_by_id: collections.OrderedDict[int, tuple[Any, str]] = collections.OrderedDict()
_lock = threading.Lock()


def note(shardings: Sequence[Any], names: Sequence[str], program: str) -> None:
    """Remember that output ``k`` of ``program`` (``"jit step"``) is laid out by
    ``shardings[k]``, named ``names[k]`` (``"result[0]['w']"``)."""
    with _lock:
        for sharding, name in zip(shardings, names, strict=False):
            _by_id[id(sharding)] = (sharding, f"{name} of {program}")
            _by_id.move_to_end(id(sharding))
        while len(_by_id) > SIZE:
            _by_id.popitem(last=False)


def produced_by(sharding: Any) -> str | None:
    """The output (``"result[0]['w'] of jit step"``) whose results carry ``sharding``, if
    a recent executable made it."""
    with _lock:
        found = _by_id.get(id(sharding))
    return found[1] if found is not None and found[0] is sharding else None
