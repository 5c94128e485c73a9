"""``auto_pipeline_p``: the mark an AUTO pipeline leaves in the program it is traced into.

Why a primitive: ``partitioner.pipeline(layer, axis=AUTO)`` leaves to the enclosing
call whether and how its stack is pipelined (NOTE [pipeline decision] in
``trace/decision.py``). The call learns that from the trace of its body alone: that
the body holds such a pipeline, which schedules it allows, and, traced under a
decision, the microbatches the pipeline took. The pipeline may sit in a nested jit
call, under ``jax.grad``, ``vmap`` or ``jax.checkpoint``, and a trace served from the
cache runs none of the Python that could say so; an equation in the jaxpr comes back
with the trace, nested calls' included, as a typed record. The mark has no operands
and no results, so every jax transformation hands it to the trace below untouched (a
JVP, a batch or a partial evaluation finds no tracer of its own in it); its DCE rule
keeps it, its partial evaluation for ``jax.checkpoint`` keeps it on the known side
only, and it lowers to nothing, so the program XLA compiles is the same with or
without it.

Every rule of ``auto_pipeline_p`` is here; ``registry.py`` wires them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import jax_private as jp

auto_pipeline_p = jp.Primitive("auto_pipeline")
auto_pipeline_p.multiple_results = True


@dataclass(frozen=True)
class AutoPipelineSite:
    """One AUTO pipeline of a traced body.

    Attributes:
        schedules: the schedules it allows (the enclosing call chooses among them).
        microbatches: traced under a decision to pipeline, the microbatch count it
            took; None where it ran the plain scan.
    """

    schedules: tuple[str, ...]
    microbatches: int | None = None


def mark(site: AutoPipelineSite) -> None:
    """Leave ``site`` in the program being traced (outside any trace: nothing to mark)."""
    auto_pipeline_p.bind(site=site)


def sites(jaxpr: Any) -> tuple[AutoPipelineSite, ...]:
    """The AUTO pipelines of a traced program (its nested bodies included), each once,
    in the order first met."""
    return tuple(dict.fromkeys(_marks(getattr(jaxpr, "jaxpr", jaxpr))))


def _marks(jaxpr: Any) -> Iterator[AutoPipelineSite]:
    for eqn in jaxpr.eqns:
        if eqn.primitive is auto_pipeline_p:
            yield eqn.params["site"]
    for sub in jp.subjaxprs(jaxpr):
        yield from _marks(sub)


def impl(*, site: AutoPipelineSite) -> list[Any]:
    del site
    return []


def abstract_eval(*, site: AutoPipelineSite) -> list[Any]:
    """No results, no effects: the mark changes nothing the program computes."""
    del site
    return []


# --- DCE and partial eval: the mark stays, on the known side ---


def dce(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    """Kept though nothing reads it (it has no results): the planner reads it."""
    del used_outputs
    return [], eqn


def partial_eval_custom(
    saveable: Any, unks_in: Any, inst_in: Any, eqn: Any
) -> tuple[Any, None, list[bool], list[bool], list[Any]]:
    """``jax.checkpoint``'s split: the mark is known, never staged (nor recomputed)."""
    del saveable, unks_in, inst_in
    return eqn, None, [], [], []


# --- lowering ---


def lowering(ctx: Any, *, site: AutoPipelineSite) -> list[Any]:
    del ctx, site
    return []
