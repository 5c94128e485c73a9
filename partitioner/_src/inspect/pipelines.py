"""The report's pipeline table: which layers run on which devices, and what moves.

NOTE [pipeline in the report]: a pipeline (``partitioner.pipeline``, NOTE
[pipeline]) is ordinary jax operations in the user's program, so nothing in the
call plan says it is there. It says so itself: it traces its loop under a
``jax.named_scope`` whose name (:meth:`PipelineSummary.marker`) carries its plan (axis, schedule,
layers, stages, microbatches, steps, bubble, and the layers of each stage). The
name is kept in every equation's name stack, through ``jax.grad`` and ``vmap``
(``transpose(jvp(pipeline[...]))``), and in the op names XLA keeps in the
partitioned HLO; the report reads it back from the traced body (:func:`found`)
and counts the collective-permutes XLA emitted under it. One record,
:class:`PipelineSummary`, is written, read back and printed, so the plan and the
report cannot disagree on what a pipeline is.
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


@dataclasses.dataclass(frozen=True)
class PipelineSummary:
    """What one pipeline is (NOTE [pipeline in the report]): the one record a pipeline
    writes into its program (:meth:`marker`), the report reads back
    (:meth:`from_marker`), and the plan and the report print (:meth:`lines`).

    Attributes:
        axis, schedule, layers, stages, microbatches, steps, bubble_fraction: its plan.
        chosen: whether partitioner chose the microbatch count.
        stage_layers: per stage, its layers (``"0-1"``, ``"0, 4"``).
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

    def marker(self) -> str:
        """The name scope the pipeline traces its loop under."""
        values = {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(PipelineSummary)},
            "bubble_fraction": f"{self.bubble_fraction:.6f}",
            "chosen": int(self.chosen),
            "stage_layers": "|".join(self.stage_layers),
        }
        return "pipeline[" + ";".join(f"{k}={v}" for k, v in values.items()) + "]"

    @classmethod
    def from_marker(cls, text: str) -> PipelineSummary:
        """The summary a :meth:`marker`'s text (inside ``pipeline[...]``) carries."""
        fields = dict(f.split("=", 1) for f in text.split(";"))
        return cls(
            axis=fields["axis"],
            schedule=fields["schedule"],
            layers=int(fields["layers"]),
            stages=int(fields["stages"]),
            microbatches=int(fields["microbatches"]),
            steps=int(fields["steps"]),
            bubble_fraction=float(fields["bubble_fraction"]),
            chosen=fields["chosen"] == "1",
            stage_layers=tuple(fields["stage_layers"].split("|")),
        )

    def lines(self, stage_devices: Sequence[Sequence[int]], traffic: str) -> list[str]:
        """The pipeline as text: what it is, ``traffic`` (what it moves, as the plan
        expects it or as XLA emitted it), and each stage's layers and devices."""
        how = "chosen by partitioner" if self.chosen else "given"
        out = [
            f"pipeline over mesh axis {self.axis!r}: {self.schedule}, {self.layers} layers on "
            f"{self.stages} stages, {self.microbatches} microbatches ({how}), {self.steps} "
            f"steps, bubble fraction {self.bubble_fraction:.3f}",
            f"  {traffic}",
        ]
        for k, (layers, devices) in enumerate(zip(self.stage_layers, stage_devices, strict=True)):
            out.append(f"  stage {k}: layers {layers} on devices {list(devices)}")
        return out


@dataclasses.dataclass(frozen=True)
class PipelineTable(PipelineSummary):
    """One pipeline of the program, as the report shows it (NOTE [pipeline in the report]).

    Attributes:
        stage_devices: per stage, the ids of the devices that run it.
        permute_bytes: collective-permute bytes per device XLA emitted for it, per run
            of the program (forward and backward); ``permute_bytes_per_step``: the same
            over its steps.
    """

    stage_devices: tuple[tuple[int, ...], ...] = ()
    permute_bytes: int = 0
    permute_bytes_per_step: float = 0.0

    def text(self) -> list[str]:
        """The table as text."""
        traffic = (
            f"collective-permute {self.permute_bytes:,} bytes per device per run "
            f"({self.permute_bytes_per_step:,.0f} per step, forward and backward)"
        )
        return self.lines(self.stage_devices, traffic)


def found(jaxpr: Any, collectives: Sequence[Collective], mesh: Mesh) -> tuple[PipelineTable, ...]:
    """Every pipeline of the traced body, with the collective-permutes XLA made for it."""
    seen: dict[str, PipelineTable] = {}
    for text in _markers(jaxpr):
        if text in seen:
            continue
        summary = PipelineSummary.from_marker(text)
        if summary.axis not in mesh.axis_names:
            continue
        permutes = [
            c for c in collectives
            if c.kind == "collective-permute" and c.op_name and f"pipeline[{text}]" in c.op_name
        ]  # fmt: skip
        moved = sum(c.bytes_per_device * c.count for c in permutes)
        seen[text] = PipelineTable(
            **{f.name: getattr(summary, f.name) for f in dataclasses.fields(PipelineSummary)},
            stage_devices=stage_devices(mesh, summary.axis),
            permute_bytes=moved,
            permute_bytes_per_step=moved / summary.steps,
        )
    return tuple(seen.values())


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
