"""The hand plans a user tries first on a three-axis mesh, as explicit specs.

Why a module: issue 54 asks that AUTO's whole plan be matched by no plan of the ones a
user tries first, "at least as good on both XLA figures and better by more than 2% on
one". The catalogue is that list, written once, so the figure (``bench_plan.py``'s
three-axis section) and any test that holds AUTO against it use the same plans:

- replicated;
- FSDP over each axis, over each pair of axes and over all of them: every weight's
  largest dimension (the layer dimension not counted) that they divide, split over them;
- Megatron over each axis: projections into the attention's heads and the MLP's hidden
  units split on their output dimension, the ones out of them on their input dimension
  (a multi-query attention's one key/value head whole), the embedding on its vocabulary;
- FSDP x Megatron, as MaxText's ``fsdp`` + ``tensor``: Megatron over one axis, FSDP over
  another (or over the other two) on each weight's largest dimension Megatron leaves;
- Megatron attention with the MLP over two axes: the heads over one axis, the MLP's
  hidden units over that axis and another;
- a pipeline over each axis the batch is not on (``partitioner.pipeline(layer,
  axis=X, schedule=..., microbatches=k)``, gpipe and circular, k in 2, 4, 8), the stack
  laid out over it, alone or with Megatron or FSDP over another axis.

A plan says how each weight is laid out (by the role ``models.py`` gives its name: ``models.Roles``) and
whether the stack is pipelined; the layer's tensor parallelism is also written as
constraints inside it (``models.TensorSplit``), as a user writing Megatron inside a
pipeline must (NOTE [pipeline gradients]). Like ``models.py`` it imports jax only (no
partitioner, no sibling module), so the tests can import it as ``benchmarks.hand_plans``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

Axes = str | tuple[str, ...] | None
SCHEDULES = ("gpipe", "circular")
MICROBATCHES = (2, 4, 8)


def _size(axes: Axes, sizes: Mapping[str, int]) -> int:
    if axes is None:
        return 1
    return math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes))


def _named(axes: Axes) -> str:
    if isinstance(axes, tuple):
        return "(" + ", ".join(repr(a) for a in axes) + ")"
    return repr(axes)


@dataclass(frozen=True)
class Pipeline:
    """A stack run as ``partitioner.pipeline(layer, axis=axis, schedule=schedule,
    microbatches=microbatches)``, its stacked parameters laid out over ``axis``."""

    axis: str
    schedule: str
    microbatches: int


@dataclass(frozen=True)
class HandPlan:
    """One hand plan: FSDP axes, Megatron axes for the heads and for the MLP's hidden
    units, and a pipeline (None: the plain scan).

    ``spec`` lays out one weight: the tensor axes on the dimension its role names
    (``models.Roles``), the FSDP axes on its largest other dimension they divide,
    replicated where none is; a stacked weight (``lead`` leading layer dimensions, 1,
    or 3 for a circular pipeline's staged ``[stages, repeats, per_visit, ...]``) has
    the pipeline's axis on its first dimension.
    """

    name: str
    fsdp: Axes = None
    heads: Axes = None
    hidden: Axes = None
    pipeline: Pipeline | None = None

    @property
    def tensor(self) -> bool:
        """Whether the layer splits its heads or hidden units (``models.TensorSplit(
        plan.heads, plan.hidden)`` is then the constraints it writes)."""
        return self.heads is not None or self.hidden is not None

    def spec(self, role: str, shape: Sequence[int], lead: int, sizes: Mapping[str, int]) -> P:
        """The spec of a weight of ``role`` whose per-layer shape is ``shape[lead:]``."""
        dims: list[Axes] = [None] * (len(shape) - lead)
        tensor = {
            "attn_in": (-1, self.heads), "attn_out": (0, self.heads),
            "mlp_in": (-1, self.hidden), "mlp_out": (0, self.hidden),
            "vocab": (0, self.hidden or self.heads),
        }.get(role)  # fmt: skip
        if tensor is not None and tensor[1] is not None and dims:
            dim = tensor[0] % len(dims)
            if shape[lead + dim] % _size(tensor[1], sizes) == 0:
                dims[dim] = tensor[1]
        if self.fsdp is not None:
            free = [d for d in range(len(dims)) if dims[d] is None]
            for d in sorted(free, key=lambda d: -shape[lead + d]):
                if shape[lead + d] % _size(self.fsdp, sizes) == 0:
                    dims[d] = self.fsdp
                    break
        first: list[Axes] = []
        if lead:
            first = [self.pipeline.axis if self.pipeline else None] + [None] * (lead - 1)
        return P(*first, *dims)

    def specs(self, params: Any, roles: Mapping[str, str], sizes: Mapping[str, int]) -> Any:
        """The spec tree of ``params`` (``{"blocks": the stack, ...}``; the stack plain
        or staged by a circular pipeline)."""

        def one(path: Any, leaf: Any) -> P:
            keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
            name = next(k for k in reversed(keys) if isinstance(k, str) and k in roles)
            lead = 0
            if keys[0] == "blocks":
                staged = self.pipeline is not None and self.pipeline.schedule == "circular"
                lead = 3 if staged else 1
            return self.spec(roles[name], leaf.shape, lead, sizes)

        return jax.tree_util.tree_map_with_path(one, params)


def catalogue(axes: Sequence[str], batch: str) -> list[HandPlan]:
    """Every hand plan of the module's docstring on a mesh of ``axes``, the batch over
    ``batch`` (names say which axis that is)."""
    tag = {a: f"{a!r} (batch)" if a == batch else repr(a) for a in axes}
    plans = [HandPlan("replicated")]
    for n in (1, 2, len(axes)):
        for group in itertools.combinations(axes, n):
            over = group[0] if n == 1 else group
            name = f"FSDP over {tag[group[0]]}" if n == 1 else f"FSDP over {_named(over)}"
            plans.append(HandPlan(name, fsdp=over))
    for t in axes:
        plans.append(HandPlan(f"Megatron over {tag[t]}", heads=t, hidden=t))
    for t in axes:
        rest = [a for a in axes if a != t]
        for fsdp in [*rest, tuple(rest)]:
            name = f"FSDP over {_named(fsdp)} x Megatron over {tag[t]}"
            plans.append(HandPlan(name, fsdp=fsdp, heads=t, hidden=t))
    for t, u in itertools.permutations(axes, 2):
        name = f"Megatron attention over {tag[t]}, MLP over {_named((t, u))}"
        plans.append(HandPlan(name, heads=t, hidden=(t, u)))
    for p in axes:
        if p == batch:
            continue  # the batch's axis is the user's data axis
        inner: list[tuple[str, dict[str, Any]]] = [("", {})]
        for other in (a for a in axes if a != p):
            inner.append((f" + Megatron over {tag[other]}", {"heads": other, "hidden": other}))
            inner.append((f" + FSDP over {tag[other]}", {"fsdp": other}))
        for (suffix, layout), schedule, k in itertools.product(inner, SCHEDULES, MICROBATCHES):
            name = f"{schedule} over {p!r}, {k} microbatches{suffix}"
            plans.append(HandPlan(name, pipeline=Pipeline(p, schedule, k), **layout))
    return plans
