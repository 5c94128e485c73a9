"""Warnings that point at the user's line, not at the library frame that noticed.

Why: a warning raised deep in lowering (an unusable donation, say) is reached
through the front door, the dispatcher, jaxlib's C++ dispatch and often jax's own
tracing; a fixed ``stacklevel`` lands on one of those frames, so Python's warning
filter and the printed location name partitioner or jax instead of the call
that asked for it. :func:`warn` counts the frames to skip instead, as jax skips
its own files in tracebacks.
"""

from __future__ import annotations

import inspect
import os
import warnings

import jax

_LIBRARY_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # partitioner/
    os.path.dirname(os.path.abspath(jax.__file__)) + os.sep,
)
_STDLIB_HELPERS = ("contextlib.py", "functools.py", "threading.py")


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS) or filename.endswith(_STDLIB_HELPERS)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside partitioner and jax."""
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    level = 2  # warnings.warn's count: 1 is this function, 2 its caller
    while frame is not None and _is_library(os.path.abspath(frame.f_code.co_filename)):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
