"""What an AUTO search says while it runs: records on the ``"partitioner"`` logger, and a
live line on a terminal.

Why: a search can take minutes (its compiles of finalists dominate), and a first call
that says nothing for that long looks hung. Every search reports at INFO on the
``"partitioner"`` logger what it is doing (what it measures, ``n of m``, the time so
far) and, at its end, one line summing up the choice. Where stderr is a terminal and
the search has run past :data:`LIVE_AFTER_S`, the same news also rewrites one live line
there (``partitioner.options.auto_progress(False)`` stops it), cleared at the end.

The reporter of the search in progress is found through a context variable
(:func:`current`): the search, XLA's confirmation and rematerialization report through
it without passing it down every call, and a search that runs nowhere in particular
reports to a reporter that says nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from ... import options

LOGGER = logging.getLogger("partitioner")
#: A search running longer than this (seconds) draws its live line on a terminal.
LIVE_AFTER_S = 2.0
#: The characters of a layout's description a record keeps.
WHAT = 120
#: Where the live line goes (a terminal's stderr).
STREAM: TextIO = sys.stderr


class Progress:
    """The reporter of one search (the module's docstring)."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.start = time.perf_counter()
        self._drawn = 0  # the width of the live line on the terminal, 0: none

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def note(self, message: str, *args: Any) -> None:
        """A step of the search: logged, and drawn on the live line."""
        text = message % args if args else message
        LOGGER.info("%s: %s (%.1f s so far)", self.api, text, self.elapsed())
        self._draw(text)

    def measuring(self, what: str, number: int, total: int) -> None:
        """XLA is about to compile and measure ``what`` (its layouts, shortened), the
        ``number``-th of ``total``."""
        shown = what if len(what) <= WHAT else what[: WHAT - 3] + "..."
        self.note("compiling %d of %d to measure it: %s", number, total, shown)

    def done(self, summary: str) -> None:
        """The search's one line of summary; the live line cleared."""
        LOGGER.info("%s: %s (%.1f s)", self.api, summary, self.elapsed())
        if self._drawn:
            STREAM.write("\r" + " " * self._drawn + "\r")
            STREAM.flush()
            self._drawn = 0

    def _draw(self, text: str) -> None:
        if not (options.auto_progress_enabled() and self.elapsed() > LIVE_AFTER_S):
            return
        if not getattr(STREAM, "isatty", lambda: False)():
            return
        line = f"partitioner AUTO {self.api}: {text} [{self.elapsed():.0f} s]"[:150]
        STREAM.write("\r" + line.ljust(self._drawn))
        STREAM.flush()
        self._drawn = max(self._drawn, len(line))


class _Silent(Progress):
    """The reporter outside any search: says nothing."""

    def note(self, message: str, *args: Any) -> None:
        pass

    def done(self, summary: str) -> None:
        pass


_SILENT = _Silent("")
_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "auto_progress", default=None
)


def current() -> Progress:
    """The reporter of the search this thread is running (one that says nothing, outside)."""
    return _current.get() or _SILENT


@contextlib.contextmanager
def reporting(api: str) -> Iterator[Progress]:
    """A search of ``api``'s AUTO leaves, reporting for the block."""
    reporter = Progress(api)
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)
