"""The pipeline decision a body is traced under: whether (and how) its AUTO pipelines run as stages.

NOTE [pipeline decision]: ``partitioner.pipeline(layer, axis=AUTO)`` leaves to the
enclosing call whether the stack runs as pipeline stages, over which axis and with
which schedule, or as the plain scan. That changes the program, so it is decided
before the body's layouts are searched, by tracing the body once per decision. The
decision travels as a value, one way: the planner (``planner/decisions.py``) calls
``retrace(decision)``, the trace (``tracing.trace_body``) keeps it in the frame of the
body being traced, beside the call's memory limit, in one record
(:class:`~partitioner._src.trace.tracing.BodySettings`, part of the trace cache key
by construction), and an AUTO pipeline reads it there (``tracing.enclosing_settings``;
:data:`NO_PIPELINE` unless a call decides otherwise: the plain scan). What the body met comes back the same way, with its trace:
each AUTO pipeline leaves a mark in the program (``primitives/auto_pipeline.py``), typed,
nested calls' included, which the planner reads from the traced jaxpr. A call traced
inside another body takes the enclosing body's decision: the outermost call decides
for the whole program, and every AUTO pipeline of one body takes the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineDecision:
    """How a body's AUTO pipelines run: as stages over ``axis`` with ``schedule``, or,
    ``axis`` None, as the plain scan; ``batch_axes``: the mesh axes a stage's
    microbatch is split over (None: every one the layer leaves free; the others are
    the weights', tensor parallel inside the stages)."""

    axis: str | None
    schedule: str = "gpipe"
    batch_axes: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.axis is None:
            return "no pipeline"
        batch = "" if self.batch_axes is None else f", batch over {self.batch_axes}"
        return f"{self.schedule} pipeline over {self.axis!r}{batch}"


#: The plain scan: what a body is traced under unless a call decides otherwise.
NO_PIPELINE = PipelineDecision(None)
