"""The partitioning report: values, collectives, memory and cost of one compiled program.

NOTE [partitioning report]: everything here is read from what the pipeline
already holds, nothing is recomputed: the call plan (paths, avals and the specs
asked for), the executable (the layouts XLA chose, read back as specs; its
partitioned HLO, parsed by ``collectives.py``; XLA's memory and cost analyses)
and the traced body (each ``with_sharding_constraint``). A table is a list of
frozen dataclasses, printed as fixed-width text and serialized by ``to_json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from .. import jax_private as jp
from ..compiler.executable import Executable
from ..primitives.auto_choice import AutoChoice, Candidate, WholePlan
from ..primitives.call_plan import CallPlan
from ..primitives.constraint import constraints
from ..sharding.parsed import ParsedPartitionSpec
from .collectives import Collective, collectives
from .pipelines import PipelineTable
from .pipelines import found as pipelines_in
from .visualize import ChosenLayout, visualize_choice


@dataclasses.dataclass(frozen=True)
class ValueRow:
    """One value of the program: where it lives.

    Attributes:
        kind: ``input``, ``output``, ``constraint`` or ``residual``.
        path: the pytree path (``args[0]['w']``), the output path, or for a
            constraint its index and source line.
        shape: the global value's shape.
        dtype: the global value's dtype.
        spec_asked: the layout asked for (``None``: XLA chooses).
        spec_chosen: the layout XLA settled on, read back from the executable.
        per_device_shape: one device's block (the largest, for uneven splits).
        bytes_per_device: that block's bytes.
    """

    kind: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    spec_asked: str | None
    spec_chosen: str | None
    per_device_shape: tuple[int, ...]
    bytes_per_device: int


@dataclasses.dataclass(frozen=True)
class Memory:
    """XLA's per-device memory analysis of the program, in bytes."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    generated_code: int

    @property
    def total(self) -> int:
        """What a device holds while the program runs: arguments + outputs +
        temporaries - aliased."""
        return self.arguments + self.outputs + self.temporaries - self.aliased


@dataclasses.dataclass(frozen=True)
class Cost:
    """XLA's cost analysis of one device's program."""

    flops: float
    bytes_accessed: float
    transcendentals: float


@dataclasses.dataclass(frozen=True)
class AutoTable:
    """How partitioner chose the AUTO layouts of this program, against what XLA made of it.

    Attributes:
        choice: the search's record: every AUTO leaf's chosen spec, the runners-up
            with their estimated (and, for compiled finalists, measured) costs.
        collective_bytes: this program's collective operand bytes per device: the
            report's ``collective_bytes``.
        memory_bytes: XLA's arguments + outputs + temporaries - aliased per device.
        mesh: the mesh's axis sizes, and ``device_ids`` its devices in mesh order
            (what :meth:`visualize` draws over).
    """

    choice: AutoChoice
    collective_bytes: int
    memory_bytes: int | None
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    device_ids: tuple[int, ...] = ()

    def visualize(self, png: str | None = None, show: bool = True) -> str:
        """Which mesh axes split which dimension of each AUTO input, as chosen.

        Returns one line per input (also printed unless ``show=False``); ``png=path``
        also saves a picture with a panel per input (up to 12), each block coloured
        by the devices holding it, as ``inspect.visualize`` colours an array's
        (needs matplotlib). A plan that recomputes blocks (to fit
        ``auto_memory_limit``, or a scan's element-wise work) says which, with which
        policy, in a last line and the picture's title.
        """
        c = self.choice
        inputs = [
            ChosenLayout(path, tuple(shape), layout, spec)
            for path, shape, layout, spec in zip(
                c.paths, c.shapes, c.layouts, c.chosen.specs, strict=True
            )
        ]
        note = ", ".join(f"{b} rematerialized with {p}" for b, p in c.remat)
        if note:
            note += f" (+{c.flops_added or 0:,.0f} flops)"
        text = visualize_choice(inputs, self.mesh, self.device_ids, png, note)
        if show:
            print(text)
        return text


@dataclasses.dataclass(frozen=True)
class Report:
    """What partitioning did to one program (NOTE [partitioning report])."""

    name: str
    partitioner: str
    mesh: dict[str, int]
    values: tuple[ValueRow, ...]
    collectives: tuple[Collective, ...]
    memory: Memory | None
    cost: Cost | None
    auto: AutoTable | None = None
    pipelines: tuple[PipelineTable, ...] = ()

    @property
    def collective_bytes(self) -> int:
        """The bytes each device sends per run: every collective's ``bytes_per_device``
        times its ``count`` (loop trip counts included), summed.

        The one figure of communication the AUTO search, the benchmarks and the tests
        compare layouts by; here so that each reads it the same way instead of adding
        up the table by hand. Equals ``auto.collective_bytes`` when the program has
        AUTO inputs.
        """
        return sum(c.bytes_per_run for c in self.collectives)

    def with_values(self, extra: Sequence[ValueRow]) -> Report:
        return dataclasses.replace(self, values=(*self.values, *extra))

    def to_json(self) -> str:
        """The whole report as JSON (dataclasses as objects, tuples as lists)."""
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)

    def __str__(self) -> str:
        lines = [
            f"== {self.name}: {self.partitioner} over mesh "
            + " x ".join(f"{a}={n}" for a, n in self.mesh.items())
            + " =="
        ]
        lines += ["", "values"]
        lines += _table(
            ("kind", "path", "global", "asked", "chosen", "per device", "bytes/device"),
            [
                (
                    v.kind,
                    v.path,
                    f"{v.dtype}{list(v.shape)}",
                    v.spec_asked or "XLA chooses",
                    v.spec_chosen or "-",
                    str(list(v.per_device_shape)),
                    f"{v.bytes_per_device:,}",
                )
                for v in self.values
            ],
        )
        lines += ["", "collectives"]
        if self.collectives:
            lines += _table(
                ("kind", "operand", "bytes/device", "count", "axes", "from"),
                [
                    (
                        c.kind,
                        f"{c.dtype}{list(c.shape)}",
                        f"{c.bytes_per_device:,}",
                        str(c.count),
                        c.describe_axes(),
                        c.source or c.op_name or "-",
                    )
                    for c in self.collectives
                ],
            )
        else:
            lines.append("  none: every device computes on its own data")
        if self.memory is not None:
            m = self.memory
            lines += [
                "",
                "memory per device (bytes): "
                f"arguments {m.arguments:,}, outputs {m.outputs:,}, temporaries "
                f"{m.temporaries:,}, aliased {m.aliased:,}, code {m.generated_code:,}",
            ]
        if self.cost is not None:
            c = self.cost
            lines.append(
                f"cost per device: {c.flops:,.0f} flops, {c.bytes_accessed:,.0f} bytes accessed, "
                f"{c.transcendentals:,.0f} transcendentals"
            )
        for p in self.pipelines:
            lines += ["", *p.text()]
        if self.auto is not None:
            lines += ["", *_auto_lines(self.auto)]
        return "\n".join(lines)


def _auto_lines(t: AutoTable) -> list[str]:
    """The auto table: chosen specs beside the runners-up and the baselines, then their
    costs (NOTE [auto floor]), the whole plans weighed and what is recomputed."""
    c = t.choice
    limit = "" if c.memory_limit is None else f", memory limit {c.memory_limit:,} bytes"
    lines = [
        f"auto: {len(c.paths)} AUTO inputs chosen ({c.evaluations} assignments scored by the "
        f"cost model, {c.compiles} compiled by XLA in {c.confirm_s:.2f} s, {c.search_s:.2f} s in "
        f"all{limit})"
    ]
    same = [b.name for b in c.baselines if b.candidate.specs == c.chosen.specs]
    chosen = "chosen" + (f" (= {same[0]})" if same else "")
    named = [(chosen, c.chosen)]
    named += [(f"runner-up {k}", r) for k, r in enumerate(c.runners_up, start=1)]
    named += [(b.name, b.candidate) for b in c.baselines]
    lines += _table(
        ("input", *(n for n, _ in named)),
        [(path, *(cand.specs[i] for _, cand in named)) for i, path in enumerate(c.paths)],
    )
    if c.out_paths:
        lines += ["", "  AUTO outputs"]
        lines += _table(("output", "chosen"), list(zip(c.out_paths, c.out_specs, strict=True)))
    lines += ["", "  cost per device (estimated by the cost model; XLA where compiled)"]
    lines += _cost_lines(named)
    memory = "-" if t.memory_bytes is None else f"{t.memory_bytes:,}"
    lines.append(
        f"  this program (XLA): {t.collective_bytes:,} collective bytes, {memory} bytes of memory "
        "per device"
    )
    return lines + _axes_lines(c) + _whole_plan_lines(c) + _remat_lines(c)


def _axes_lines(c: AutoChoice) -> list[str]:
    """Per mesh axis: what the chosen plan uses it for, and the nearest plan weighed that
    uses it otherwise, with its step time over the chosen one's."""
    if not c.axes:
        return []
    rows = [
        (
            repr(a.axis),
            a.role,
            a.runner_up or "-",
            a.runner_up_role or "-",
            f"{a.slower:.2f}x" if a.runner_up else "-",
        )
        for a in c.axes
    ]
    header = ("axis", "chosen: used for", "nearest other plan", "uses it for", "its time")
    return ["", "  per mesh axis"] + _table(header, rows)


def _cost_lines(named: Sequence[tuple[str, Candidate]]) -> list[str]:
    """Each candidate's figures, the model's beside XLA's."""

    def row(name: str, cand: Candidate) -> tuple[str, ...]:
        e = cand.estimate
        return (
            name,
            f"{e.time_s * 1e6:,.1f}",
            f"{e.collective_bytes:,.0f}",
            _opt(cand.measured_collective_bytes),
            f"{e.memory_bytes:,.0f}",
            _opt(cand.measured_memory_bytes),
        )

    header = (
        "candidate", "est. us", "est. coll. bytes", "XLA coll. bytes", "est. memory", "XLA memory"
    )  # fmt: skip
    return _table(header, [row(n, cand) for n, cand in named])


def _whole_plan_lines(c: AutoChoice) -> list[str]:
    """The whole plans weighed (NOTE [whole plan]), the chosen first, and why not the others."""
    if c.whole_plan is None:
        return []

    def row(plan: WholePlan) -> tuple[str, ...]:
        cand = plan.candidate
        if cand is None:
            return (plan.name, "-", "-", "-", plan.note)
        return (
            plan.name,
            f"{cand.estimate.time_s * 1e6:,.1f}",
            _opt(cand.measured_collective_bytes),
            _opt(cand.measured_memory_bytes),
            plan.note or ("chosen" if plan is c.whole_plan else ""),
        )

    header = ("plan", "est. us", "XLA coll. bytes", "XLA memory", "why not")
    lines = ["", f"  whole plan (pipeline or not): {c.whole_plan.name}"]
    return lines + _table(header, [row(plan) for plan in c.whole_plans])


def _remat_lines(c: AutoChoice) -> list[str]:
    """The blocks the chosen program recomputes, and what that costs."""
    if not c.remat:
        return []
    why = "to fit the memory limit" if c.remat_to_fit else "(element-wise work, as if unrolled)"
    lines = ["", f"  rematerialized {why}: {c.flops_added or 0:,.0f} flops added"]
    return lines + _table(("block", "policy"), list(c.remat))


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    return [line.rstrip() for line in lines + [fmt.format(*r) for r in rows]]


def _describe(spec: ParsedPartitionSpec | None) -> str | None:
    return None if spec is None else str(spec.to_partition_spec())


def value_row(
    kind: str, path: str, aval: Any, asked: ParsedPartitionSpec | None,
    chosen: ParsedPartitionSpec | None, mesh: Mesh,
) -> ValueRow:  # fmt: skip
    """A value's row; its block is laid out by the chosen spec (else the asked one)."""
    physical = jp.physical_aval(aval)
    layout = chosen if chosen is not None else asked
    block = (
        tuple(physical.shape) if layout is None else layout.shard_shape(tuple(physical.shape), mesh)
    )
    return ValueRow(
        kind=kind,
        path=path,
        shape=tuple(aval.shape),
        dtype=str(aval.dtype),
        spec_asked=_describe(asked),
        spec_chosen=_describe(chosen),
        per_device_shape=block,
        bytes_per_device=math.prod(block) * physical.dtype.itemsize,
    )


def _paths(tree: Any) -> list[str]:
    """The key paths of a pytree's leaves, in flat order."""
    leaves, _ = tree_flatten_with_path(tree_unflatten(tree, list(range(tree.num_leaves))))
    return [keystr(path) for path, _ in leaves]


def build(plan: CallPlan, executable: Executable, shardy: bool) -> Report:
    """The report of one compiled plan (NOTE [partitioning report])."""
    params, mesh = plan.params, plan.params.mesh
    values: list[ValueRow] = []
    n_consts = plan.num_consts
    arg_paths = _paths(plan.in_tree)
    # None for an input the program does not take (pruned: keep_unused=False)
    chosen_in = executable.per_input(executable.in_specs, n_consts + len(arg_paths))
    for i, path in enumerate(arg_paths):
        k = n_consts + i
        values.append(
            value_row(
                "input",
                "args" + path[3:] if path.startswith("[0]") else "kwargs" + path[3:],
                params.jaxpr.in_avals[k],
                params.in_axis_resources[k],
                chosen_in[k],
                mesh,
            )
        )
    for i, path in enumerate(_paths(plan.out_tree)):
        values.append(
            value_row(
                "output",
                "out" + path,
                params.jaxpr.out_avals[i],
                params.out_axis_resources[i],
                executable.out_specs[i],
                mesh,
            )
        )
    for k, (eqn, spec) in enumerate(constraints(params.jaxpr.jaxpr), start=1):
        where = jp.summarize_source_info(eqn.source_info)
        values.append(
            value_row("constraint", f"#{k} {where}", eqn.invars[0].aval, spec, spec, mesh)
        )
    loaded = executable.loaded
    found = tuple(collectives((m.to_string() for m in loaded.hlo_modules()), mesh))
    report = Report(
        name=params.name,
        partitioner="Shardy" if shardy else "GSPMD",
        mesh=dict(mesh.shape),
        values=tuple(values),
        collectives=found,
        memory=_memory(loaded),
        cost=_cost(loaded),
        pipelines=pipelines_in(params.jaxpr.jaxpr, found, mesh),
    )
    if plan.auto is None:
        return report
    auto = AutoTable(
        choice=plan.auto,
        collective_bytes=report.collective_bytes,
        memory_bytes=None if report.memory is None else report.memory.total,
        mesh={str(a): int(n) for a, n in mesh.shape.items()},
        device_ids=tuple(int(d.id) for d in mesh.devices.flat),
    )
    return dataclasses.replace(report, auto=auto)


def _memory(loaded: Any) -> Memory | None:
    stats = loaded.get_compiled_memory_stats()
    if stats is None:
        return None
    return Memory(
        arguments=int(stats.argument_size_in_bytes),
        outputs=int(stats.output_size_in_bytes),
        temporaries=int(stats.temp_size_in_bytes),
        aliased=int(stats.alias_size_in_bytes),
        generated_code=int(stats.generated_code_size_in_bytes),
    )


def _cost(loaded: Any) -> Cost | None:
    analysis = loaded.cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if not analysis:
        return None
    return Cost(
        flops=float(analysis.get("flops", 0.0)),
        bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
        transcendentals=float(analysis.get("transcendentals", 0.0)),
    )
