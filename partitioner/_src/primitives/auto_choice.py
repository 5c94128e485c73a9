"""The record of how the AUTO stage chose a signature's layouts, and the cost model's figures.

Why here and not beside the cost model (``auto/cost/``): the record travels
with the call plan (``CallPlan.auto``) down to the report's tables, and both sit
below the AUTO stage; the stage fills it in (``auto/resolve.py``), the report
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.decision import PipelineDecision


@dataclass(frozen=True)
class Estimate:
    """What the cost model predicts for one assignment of layouts, per device.

    Attributes:
        time_s: ``compute_s + comm_s``, the objective.
        compute_s: floating-point work over the modelled FLOP rate.
        comm_s: collective bytes over the modelled bandwidth, plus a fixed
            latency per collective.
        collective_bytes: collective operand bytes, loop trip counts included
            (what the report's collectives table adds up).
        collectives: collectives run, loop trip counts included.
        memory_bytes: arguments + outputs + peak temporaries - aliased.
    """

    time_s: float
    compute_s: float
    comm_s: float
    collective_bytes: float
    collectives: float
    memory_bytes: float


@dataclass(frozen=True)
class Figures:
    """What a plan costs per device, as AUTO's decisions judge it (NOTE [auto floor]).

    Attributes:
        collective_bytes: XLA's where the plan was compiled (``measured``), else the
            cost model's.
        memory_bytes: likewise (XLA's memory analysis).
        time_s: the step time: the model's compute, and the collective bytes and
            count (XLA's where measured) at the model's bandwidth and latency.
        flops: XLA's flops where measured (the price of recomputing), else 0.
        measured: whether the figures are XLA's.
    """

    collective_bytes: float
    memory_bytes: float
    time_s: float
    flops: float = 0.0
    measured: bool = False

    def dominates(self, other: Figures, *, with_flops: bool = False, by: float = 0.0) -> bool:
        """At least as good as ``other`` on collective bytes and memory (and flops,
        ``with_flops``: where recomputing is the price), and better on one of them by
        more than the share ``by``: a plan no one should pick over this one."""
        pairs = [
            (self.collective_bytes, other.collective_bytes),
            (self.memory_bytes, other.memory_bytes),
        ]
        if with_flops:
            pairs.append((self.flops, other.flops))
        return all(mine <= theirs for mine, theirs in pairs) and any(
            mine < theirs * (1 - by) for mine, theirs in pairs
        )


@dataclass(frozen=True)
class Candidate:
    """One assignment of layouts the search scored (a row of the auto table).

    Attributes:
        specs: one spec string per AUTO input leaf, in :attr:`AutoChoice.paths` order.
        estimate: the cost model's figures.
        figures: what the decision judged it by (XLA's where it was compiled).
        roles: per mesh axis of more than one device, what the layouts use it for
            (:func:`~partitioner._src.auto.search.measure.axis_roles`): ``"data"``,
            ``"FSDP"``, ``"tensor parallel"``, ``"pipeline stages"`` or ``"unused"``.
    """

    specs: tuple[str, ...]
    estimate: Estimate
    figures: Figures
    roles: tuple[tuple[str, str], ...] = ()

    @property
    def measured_collective_bytes(self) -> float | None:
        """XLA's collective bytes, where this candidate was compiled to confirm it
        (``None``: scored by the model only)."""
        return self.figures.collective_bytes if self.figures.measured else None

    @property
    def measured_memory_bytes(self) -> float | None:
        """XLA's memory analysis, likewise."""
        return self.figures.memory_bytes if self.figures.measured else None


@dataclass(frozen=True)
class Baseline:
    """A layout XLA measures beside the choice (NOTE [auto floor]).

    Attributes:
        name: ``"replicated"``, ``"data-parallel"``, or ``"replicated =
            data-parallel"`` where the two are one program (the batch is given).
        candidate: its specs and figures, XLA's included (none where a large
            program's baseline was ruled out by the model and not compiled).
    """

    name: str
    candidate: Candidate


@dataclass(frozen=True)
class AxisChoice:
    """What the chosen plan uses one mesh axis for, and the nearest plan weighed that uses
    it otherwise (the report names both per axis).

    Attributes:
        axis: the mesh axis.
        role: what the chosen plan uses it for (``Candidate.roles``).
        runner_up: the fastest other plan weighed that uses it otherwise (its name in
            the report: ``"runner-up 2"``, ``"replicated"``, a whole plan's name), ``""``
            where none does; ``runner_up_role`` what that plan uses it for.
        slower: that plan's step time over the chosen one's (the figures each was
            judged by).
    """

    axis: str
    role: str
    runner_up: str = ""
    runner_up_role: str = ""
    slower: float = 0.0


@dataclass(frozen=True)
class WholePlan:
    """One whole plan weighed for a call whose body has AUTO pipelines: a pipeline
    decision and its program's layouts (NOTE [whole plan] in ``auto/whole_plan.py``).

    Attributes:
        decision: how the body's AUTO pipelines run (the plain scan, or a schedule over
            an axis; NOTE [pipeline decision] in ``trace/decision.py``).
        microbatches: the microbatch counts its pipelines took (none for the plain scan,
            or where the program could not be built).
        candidate: its best layouts' specs and figures, the model's and XLA's; None
            where the program could not be built (``note`` says why).
        note: why it was not built, or was not chosen where it was measured.
    """

    decision: PipelineDecision
    microbatches: tuple[int, ...] = ()
    candidate: Candidate | None = None
    note: str = ""

    @property
    def name(self) -> str:
        """``"no pipeline"``, or the pipeline it runs (``"gpipe pipeline over 'model',
        4 microbatches"``)."""
        if not self.microbatches:
            return self.decision.describe()
        counts = "/".join(map(str, self.microbatches))
        return f"{self.decision.describe()}, {counts} microbatches"


@dataclass(frozen=True)
class AutoChoice:
    """How the AUTO leaves of one signature were resolved.

    Attributes:
        paths: the AUTO input leaves (``args[0]['w1']``).
        out_paths: the AUTO output leaves, and ``out_specs`` their chosen specs.
        chosen: the winner; ``runners_up``: the next best candidates scored.
        memory_limit: ``auto_memory_limit`` (bytes per device) or ``None``.
        evaluations: assignments the cost model scored; ``compiles``: XLA compiles
            spent confirming finalists.
        search_s: wall time of the whole search, confirmations included;
            ``confirm_s`` the part of it XLA spent compiling finalists and baselines.
        baselines: the replicated and data-parallel layouts, as XLA measured them
            (a large program's baseline the model rules out: as the model scored it);
            the chosen layout is never beaten by one of them on both collective
            bytes and memory.
        shapes: each AUTO input's shape, and ``layouts`` its chosen layout (per
            dimension, the mesh axes splitting it): what the report's picture draws.
        remat: ``(block, policy)`` for each block the chosen program recomputes in its
            backward pass (``("scan #1 (8 steps)", "dots_saveable")``): to fit
            ``memory_limit`` where no layout alone does (``remat_to_fit``), or, for a
            differentiated scan, the element-wise work XLA recomputes in an unrolled
            stack (``dots_saveable``, kept only where it costs at most 2% more flops);
            ``flops_added`` what that costs, XLA's flops (cost analysis) of the chosen
            program minus those of the same layouts recomputing nothing (``None``
            without rematerialization).
        whole_plans: for a body with AUTO pipelines, every whole plan weighed, the
            chosen first (:attr:`whole_plan`); ``()`` otherwise.
        axes: per mesh axis, what the chosen plan uses it for and the nearest plan
            weighed that uses it otherwise (:class:`AxisChoice`).
    """

    paths: tuple[str, ...]
    out_paths: tuple[str, ...]
    out_specs: tuple[str, ...]
    chosen: Candidate
    runners_up: tuple[Candidate, ...]
    memory_limit: int | None
    evaluations: int
    compiles: int
    search_s: float
    baselines: tuple[Baseline, ...] = ()
    confirm_s: float = 0.0
    shapes: tuple[tuple[int, ...], ...] = ()
    layouts: tuple[tuple[tuple[str, ...], ...], ...] = ()
    remat: tuple[tuple[str, str], ...] = ()
    flops_added: float | None = None
    remat_to_fit: bool = False
    whole_plans: tuple[WholePlan, ...] = ()
    axes: tuple[AxisChoice, ...] = ()

    @property
    def whole_plan(self) -> WholePlan | None:
        """The whole plan chosen (None: the body has no AUTO pipeline)."""
        return self.whole_plans[0] if self.whole_plans else None

    def axes_text(self) -> str:
        """Per mesh axis, the chosen use and the nearest other plan's: one line for logs
        (``'a' data (runner-up 1: FSDP, 1.02x)``)."""
        return "; ".join(
            f"{a.axis!r} {a.role}"
            + (f" (nearest other: {a.runner_up}, {a.runner_up_role}, {a.slower:.2f}x)"
               if a.runner_up else "")
            for a in self.axes
        )  # fmt: skip

    def named_candidates(self) -> list[tuple[str, Candidate]]:
        """Every plan weighed that has figures, as the report names it, the chosen first."""
        named = [("chosen", self.chosen)]
        named += [(f"runner-up {k}", c) for k, c in enumerate(self.runners_up, start=1)]
        named += [(b.name, b.candidate) for b in self.baselines]
        named += [(w.name, w.candidate) for w in self.whole_plans[1:] if w.candidate is not None]
        return named


def axis_choices(chosen: Candidate, others: list[tuple[str, Candidate]]) -> tuple[AxisChoice, ...]:
    """Per mesh axis of ``chosen``: its role, and the fastest of ``others`` (named as the
    report names them) whose role for the axis differs."""
    out = []
    for axis, role in chosen.roles:
        rivals = [
            (candidate.figures.time_s, name, dict(candidate.roles).get(axis, ""))
            for name, candidate in others
            if dict(candidate.roles).get(axis, role) != role
        ]
        if not rivals:
            out.append(AxisChoice(axis, role))
            continue
        time_s, name, theirs = min(rivals, key=lambda rival: rival[0])
        ratio = time_s / chosen.figures.time_s if chosen.figures.time_s else 0.0
        out.append(AxisChoice(axis, role, name, theirs, ratio))
    return tuple(out)
