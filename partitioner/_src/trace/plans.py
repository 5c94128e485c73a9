"""The whole plan a body is traced under: whether (and how) its AUTO pipelines run as stages.

NOTE [pipeline decision]: ``partitioner.pipeline(layer, axis=AUTO)`` leaves to the
enclosing call whether the stack runs as pipeline stages, over which axis and with
which schedule, or as the plain scan. That changes the program, so it is decided
before the body's layouts are searched, by tracing the body once per option: the
planner (``planner/plan_choice.py``) traces it under each :class:`PipelineDecision`
(:func:`deciding`), the AUTO stage (``auto/plans.py``) weighs the programs, and the
call runs the one chosen. While a body is traced, an AUTO pipeline reads the
decision (:func:`decision`; none: the plain scan) and says it was met
(``tracing.note_auto_pipeline``), so the planner knows the body has a plan to choose.
The decision is part of the trace cache key (``tracing.py``); every AUTO pipeline of
one body takes the same decision.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineDecision:
    """How a body's AUTO pipelines run: as stages over ``axis`` with ``schedule``, or,
    ``axis`` None, as the plain scan."""

    axis: str | None
    schedule: str = "gpipe"

    def describe(self) -> str:
        if self.axis is None:
            return "no pipeline"
        return f"{self.schedule} pipeline over {self.axis!r}"


_decision: contextvars.ContextVar[PipelineDecision | None] = contextvars.ContextVar(
    "pipeline_decision", default=None
)


def decision() -> PipelineDecision | None:
    """The decision the body being traced is traced under (None: none given)."""
    return _decision.get()


@contextlib.contextmanager
def deciding(chosen: PipelineDecision | None) -> Iterator[None]:
    """Trace under ``chosen`` for the block (NOTE [pipeline decision])."""
    token = _decision.set(chosen)
    try:
        yield
    finally:
        _decision.reset(token)
