"""Tensor parallelism inside an AUTO pipeline's stages: the layer's column-split matmuls
constrained over the axes its call's whole plan keeps for the weights.

NOTE [tensor parallel in the stages]: where an AUTO call's whole plan pipelines over
one axis and keeps another for the weights (its plain program used that axis for the
weights alone: ``PipelineDecision.batch_axes`` leaves it out), the weights' layouts
are the search's, and the search judges them by the cost model: without a constraint
in the stage's layer, the model keeps the stage's hidden activations whole whatever
the weights (a split of a weight's output features is not carried through the
pipeline's loop), so it prices tensor parallelism inside the stages as no saving and
lays the weights out FSDP's way. On the SwiGLU + MQA stack of ``bench_plan.py`` with
AdamW on a 2x2x2 mesh, batch over 'b', AUTO's gpipe pipeline over 'a' then moved 4.2 MB
and held 17.7 MB, the plain program's 13.6 / 16.0 MB won, and 32 hand plans (gpipe or
circular over 'a' with Megatron over 'c') beat it on both figures. So the pipeline
writes the constraints a Megatron layer writes for itself, reading the layer's
program (one shard's, ``shards.per_shard``); the model then sees each stage compute
and keep its share of the hidden units (the pipeline: 8.4 MB moved, 11.0 MB held,
chosen; 8 hand plans still beat it, each a circular pipeline staged once outside the
step, until the cost model read the staging constraints' UNCONSTRAINED dimensions as
open, ``cost/rules.py``: 8.9 MB moved, 10.4 MB held, none beats it):

- a matmul of an activation by a weight (an input the layer derives from its
  parameters alone) whose kept dimension is at least its contracted one and divides
  over the axes (an MLP's up projection, attention's query projection) is
  *column-split*: its result's last dimension is constrained over the axes;
- what a column-split result feeds is split too (the heads' scores and values, an
  activation function), and a matmul of such a value by a weight is *row-split*: it
  contracts the split dimension, its result whole (XLA reduces the partial sums);
- a weight that shrinks its input (multi-query attention's one key head) is left
  whole: its result is read by every head.

The values are the layer's (constraints change layouts, not values); the AUTO search
then lays the weights out with these constraints in the program, as for a layer that
wrote them itself. A layer that constrains those axes itself is left as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import jax_private as jp
from ..auto.remat.interpret import Env, as_traced, evaluate, read
from ..primitives.constraint import with_sharding_constraint


def tensor_split(
    jaxpr: Any, consts: Sequence[Any], weights: int, mesh: Mesh, axes: Sequence[str]
) -> Callable[[Sequence[Any]], list[Any]]:
    """``jaxpr`` (a layer's program, its first ``weights`` inputs derived from its
    parameters alone) as a function of its inputs, its column-split matmuls' results
    constrained over ``axes`` of ``mesh`` (NOTE [tensor parallel in the stages])."""
    size = math.prod(int(mesh.shape[axis]) for axis in axes)
    weight_vars = set(jaxpr.invars[:weights])
    spec_axes = tuple(axes) if len(axes) > 1 else axes[0]

    def run(args: Sequence[Any]) -> list[Any]:
        split: set[Any] = set()

        def step(index: int, eqn: Any, env: Env) -> list[Any]:
            outs = as_traced(index, eqn, env)
            operands = [v for v in eqn.invars if not isinstance(v, jp.Literal)]
            fed = any(v in split for v in operands)
            if eqn.primitive is jax.lax.dot_general_p:
                kind = _matmul(eqn, weight_vars, split, size)
                if kind == "column":
                    spec = PartitionSpec(
                        *[PartitionSpec.UNCONSTRAINED] * (outs[0].ndim - 1), spec_axes
                    )
                    outs = [with_sharding_constraint(outs[0], NamedSharding(mesh, spec))]
                    split.update(eqn.outvars)
                elif kind is None and fed:
                    split.update(eqn.outvars)
            elif fed:
                split.update(eqn.outvars)
            return outs

        env = evaluate(jaxpr, consts, args, step)
        return [read(env, v) for v in jaxpr.outvars]

    return run


def _matmul(eqn: Any, weights: set[Any], split: set[Any], size: int) -> str | None:
    """``"column"``, ``"row"`` or ``"whole"`` for an activation times a weight (NOTE
    [tensor parallel in the stages]); None for any other ``dot_general``."""
    lhs, rhs = eqn.invars
    (_, contract_r), (batch_l, _) = eqn.params["dimension_numbers"]
    if any(isinstance(v, jp.Literal) for v in (lhs, rhs)):
        return None
    if rhs not in weights or lhs in weights or batch_l:
        return None
    shape = rhs.aval.shape
    if len(shape) != 2 or tuple(contract_r) != (0,):
        return None
    if lhs in split:
        return "row"
    if shape[1] >= shape[0] and shape[1] % size == 0:
        return "column"
    return "whole"
