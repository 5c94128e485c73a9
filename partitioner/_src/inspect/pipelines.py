"""The report's pipeline table: which layers run on which devices, and what moves.

NOTE [pipeline in the report]: a pipeline (``partitioner.pipeline``, NOTE
[pipeline]) is ordinary jax operations in the user's program, so nothing in the
call plan says it is there. It says so itself: it traces its loop under a
``jax.named_scope`` whose name (:func:`marker`) carries its plan (axis, schedule,
layers, stages, microbatches, steps, bubble, and the layers of each stage). The
name is kept in every equation's name stack, through ``jax.grad`` and ``vmap``
(``transpose(jvp(pipeline[...]))``), and in the op names XLA keeps in the
partitioned HLO; the report reads it back from the traced body (:func:`found`)
and counts the collective-permutes XLA emitted under it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from .collectives import Collective

_MARKER = re.compile(r"pipeline\[([^\]]*)\]")
_FIELDS = ("axis", "schedule", "layers", "stages", "microbatches", "steps", "bubble", "chosen")


@dataclasses.dataclass(frozen=True)
class PipelineTable:
    """One pipeline of the program (NOTE [pipeline in the report]).

    Attributes:
        axis, schedule, layers, stages, microbatches, steps, bubble_fraction: its plan.
        chosen: whether partitioner chose the microbatch count.
        stage_layers: per stage, its layers (``"0-1"``, ``"0, 4"``).
        stage_devices: per stage, the ids of the devices that run it.
        permute_bytes: collective-permute bytes per device XLA emitted for it, per run
            of the program (forward and backward); ``permute_bytes_per_step``: the same
            over its steps.
    """

    axis: str
    schedule: str
    layers: int
    stages: int
    microbatches: int
    steps: int
    bubble_fraction: float
    chosen: bool
    stage_layers: tuple[str, ...]
    stage_devices: tuple[tuple[int, ...], ...]
    permute_bytes: int
    permute_bytes_per_step: float


def marker(
    axis: str,
    schedule: str,
    layers: int,
    stages: int,
    microbatches: int,
    steps: int,
    bubble: float,
    chosen: bool,
    stage_layers: Sequence[str],
) -> str:
    """The name scope a pipeline traces its loop under."""
    values = (axis, schedule, layers, stages, microbatches, steps, f"{bubble:.6f}", int(chosen))
    fields = [f"{k}={v}" for k, v in zip(_FIELDS, values, strict=True)]
    return "pipeline[" + ";".join([*fields, "layers_of=" + "|".join(stage_layers)]) + "]"


def found(jaxpr: Any, collectives: Sequence[Collective], mesh: Mesh) -> tuple[PipelineTable, ...]:
    """Every pipeline of the traced body, with the collective-permutes XLA made for it."""
    seen: dict[str, PipelineTable] = {}
    for text in _markers(jaxpr):
        if text in seen:
            continue
        fields = dict(f.split("=", 1) for f in text.split(";"))
        axis = fields["axis"]
        if axis not in mesh.axis_names:
            continue
        permutes = [
            c for c in collectives
            if c.kind == "collective-permute" and c.op_name and f"pipeline[{text}]" in c.op_name
        ]  # fmt: skip
        moved = sum(c.bytes_per_device * c.count for c in permutes)
        steps = int(fields["steps"])
        seen[text] = PipelineTable(
            axis=axis,
            schedule=fields["schedule"],
            layers=int(fields["layers"]),
            stages=int(fields["stages"]),
            microbatches=int(fields["microbatches"]),
            steps=steps,
            bubble_fraction=float(fields["bubble"]),
            chosen=fields["chosen"] == "1",
            stage_layers=tuple(fields["layers_of"].split("|")),
            stage_devices=stage_devices(mesh, axis),
            permute_bytes=moved,
            permute_bytes_per_step=moved / steps,
        )
    return tuple(seen.values())


def lines(t: PipelineTable) -> list[str]:
    """The table as text."""
    how = "chosen by partitioner" if t.chosen else "given"
    out = [
        f"pipeline over mesh axis {t.axis!r}: {t.schedule}, {t.layers} layers on {t.stages} "
        f"stages, {t.microbatches} microbatches ({how}), {t.steps} steps, bubble fraction "
        f"{t.bubble_fraction:.3f}",
        f"  collective-permute {t.permute_bytes:,} bytes per device per run "
        f"({t.permute_bytes_per_step:,.0f} per step, forward and backward)",
    ]
    for k, (layers, devices) in enumerate(zip(t.stage_layers, t.stage_devices, strict=True)):
        out.append(f"  stage {k}: layers {layers} on devices {list(devices)}")
    return out


def stage_devices(mesh: Mesh, axis: str) -> tuple[tuple[int, ...], ...]:
    """Per position along ``axis``, the ids of the mesh's devices there."""
    k = list(mesh.axis_names).index(axis)
    rows = mesh.devices.swapaxes(0, k) if k else mesh.devices
    return tuple(tuple(int(d.id) for d in row.flat) for row in rows)


def _markers(jaxpr: Any) -> Iterator[str]:
    for eqn in jaxpr.eqns:
        for match in _MARKER.finditer(str(eqn.source_info.name_stack)):
            yield match.group(1)
    for sub in jp.subjaxprs(jaxpr):
        yield from _markers(sub)
