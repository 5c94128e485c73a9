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
report cannot disagree on what a pipeline is. Its chart (the schedule's table of
actions, NOTE [pipeline actions]) is too long for a name: the pipeline leaves it here
as it traces (:func:`remember_chart`), keyed by the marker, and the report reads it
back with the marker.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
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
        batch_axes: the mesh axes each stage's microbatch is split over, each shard
            with its copy of the stage's weights (NOTE [pipeline gradients]).
        saves: what each step keeps for the backward pass (``"activations"`` or
            ``"inputs"``).
        rest_layers: layers run after the stages, outside them.
        in_flight: the most microbatch visits a stage holds at once.
        chart: the schedule's table as text (not in the marker: :func:`remember_chart`).
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
    batch_axes: tuple[str, ...] = ()
    saves: str = "activations"
    rest_layers: int = 0
    in_flight: int = 0
    chart: str = dataclasses.field(default="", compare=False)

    def marker(self) -> str:
        """The name scope the pipeline traces its loop under."""
        values = {
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(PipelineSummary)
                if f.name != "chart"
            },
            "bubble_fraction": f"{self.bubble_fraction:.6f}",
            "chosen": int(self.chosen),
            "stage_layers": "|".join(self.stage_layers),
            "batch_axes": ",".join(self.batch_axes),
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
            batch_axes=tuple(a for a in fields["batch_axes"].split(",") if a),
            saves=fields["saves"],
            rest_layers=int(fields["rest_layers"]),
            in_flight=int(fields["in_flight"]),
            chart=_CHARTS.get(text, ""),
        )

    def lines(self, stage_devices: Sequence[Sequence[int]], traffic: str) -> list[str]:
        """The pipeline as text: what it is, ``traffic`` (what it moves, as the plan
        expects it or as XLA emitted it), and each stage's layers and devices."""
        how = "chosen by partitioner" if self.chosen else "given"
        shards = " over " + ", ".join(repr(a) for a in self.batch_axes) if self.batch_axes else ""
        rest = f"; {self.rest_layers} more layers after the stages" if self.rest_layers else ""
        out = [
            f"pipeline over mesh axis {self.axis!r}: {self.schedule}, {self.layers} layers on "
            f"{self.stages} stages, {self.microbatches} microbatches ({how}), {self.steps} "
            f"steps, bubble fraction {self.bubble_fraction:.3f}",
            f"  each stage's microbatch split{shards or ' nowhere'}; each step saves its "
            f"{self.saves}{rest}; at most {self.in_flight} microbatch visits in flight a stage",
            f"  {traffic}",
        ]
        for k, (layers, devices) in enumerate(zip(self.stage_layers, stage_devices, strict=True)):
            out.append(f"  stage {k}: layers {layers} on devices {list(devices)}")
        if self.chart:
            out.append("  the schedule (F forward, B backward, W weight gradient, . idle):")
            out += [f"    {row}" for row in self.chart.splitlines()]
        return out


@dataclasses.dataclass(frozen=True)
class PipelineTable(PipelineSummary):
    """One pipeline of the program, as the report shows it (NOTE [pipeline in the report]).

    Attributes:
        stage_devices: per stage, the ids of the devices that run it.
        permute_bytes: collective-permute bytes per device XLA emitted for it, per run
            of the program (forward and backward); ``permute_bytes_per_step``: the same
            over its steps.
        loop_reductions: the other collectives XLA runs inside its loops, per run (a
            weight gradient reduced at every step: none, NOTE [pipeline gradients]),
            and ``loop_reduction_bytes`` their bytes per device.
        reduction_bytes: the bytes per device of its other collectives outside its
            loops (the one reduction of the stages' weight gradients, the outputs
            leaving the last stage).
    """

    stage_devices: tuple[tuple[int, ...], ...] = ()
    permute_bytes: int = 0
    permute_bytes_per_step: float = 0.0
    loop_reductions: int = 0
    loop_reduction_bytes: int = 0
    reduction_bytes: int = 0

    def text(self) -> list[str]:
        """The table as text."""
        traffic = (
            f"collective-permute {self.permute_bytes:,} bytes per device per run "
            f"({self.permute_bytes_per_step:,.0f} per step, forward and backward); inside "
            f"its loops {self.loop_reductions} other collectives, "
            f"{self.loop_reduction_bytes:,} bytes; outside them {self.reduction_bytes:,} bytes"
        )
        return self.lines(self.stage_devices, traffic)


#: Charts by marker text, the latest first kept (NOTE [pipeline in the report]).
_CHARTS: collections.OrderedDict[str, str] = collections.OrderedDict()
_CHARTS_LOCK = threading.Lock()
_CHARTS_KEPT = 64


def remember_chart(summary: PipelineSummary, chart: str) -> None:
    """Keep ``chart`` for the report of a program traced with ``summary``'s marker."""
    text = summary.marker()[len("pipeline[") : -1]
    with _CHARTS_LOCK:
        _CHARTS[text] = chart
        _CHARTS.move_to_end(text)
        while len(_CHARTS) > _CHARTS_KEPT:
            _CHARTS.popitem(last=False)


def found(jaxpr: Any, collectives: Sequence[Collective], mesh: Mesh) -> tuple[PipelineTable, ...]:
    """Every pipeline of the traced body, with the collective-permutes XLA made for it."""
    seen: dict[str, PipelineTable] = {}
    for text in _markers(jaxpr):
        if text in seen:
            continue
        summary = PipelineSummary.from_marker(text)
        if summary.axis not in mesh.axis_names:
            continue
        mine = [c for c in collectives if c.op_name and f"pipeline[{text}]" in c.op_name]
        permutes = [c for c in mine if c.kind == "collective-permute"]
        looped = [c for c in mine if c.kind != "collective-permute" and _in_its_loop(c, text)]
        after = [c for c in mine if c.kind != "collective-permute" and c not in looped]
        moved = sum(c.bytes_per_run for c in permutes)
        seen[text] = PipelineTable(
            **{f.name: getattr(summary, f.name) for f in dataclasses.fields(PipelineSummary)},
            stage_devices=stage_devices(mesh, summary.axis),
            permute_bytes=moved,
            permute_bytes_per_step=moved / summary.steps,
            loop_reductions=sum(c.count for c in looped),
            loop_reduction_bytes=sum(c.bytes_per_run for c in looped),
            reduction_bytes=sum(c.bytes_per_run for c in after),
        )
    return tuple(seen.values())


def _in_its_loop(collective: Collective, text: str) -> bool:
    """Whether ``collective`` runs inside the loop of the pipeline marked ``text`` (its
    op name goes on into a ``while`` body after the marker)."""
    op_name = collective.op_name or ""
    return "/while/body" in op_name[op_name.index(f"pipeline[{text}]") :]


def stage_devices(mesh: Mesh, axis: str) -> tuple[tuple[int, ...], ...]:
    """Per position along ``axis``, the ids of the mesh's devices there."""
    k = list(mesh.axis_names).index(axis)
    rows = mesh.devices.swapaxes(0, k) if k else mesh.devices
    return tuple(tuple(int(d.id) for d in row.flat) for row in rows)


def summaries(jaxpr: Any) -> tuple[PipelineSummary, ...]:
    """The pipelines a traced program runs, as their markers say (one per pipeline)."""
    return tuple(PipelineSummary.from_marker(text) for text in dict.fromkeys(_markers(jaxpr)))


def _markers(jaxpr: Any) -> Iterator[str]:
    for eqn in jaxpr.eqns:
        for match in _MARKER.finditer(str(eqn.source_info.name_stack)):
            yield match.group(1)
    for sub in jp.subjaxprs(jaxpr):
        yield from _markers(sub)
