"""The record of how the AUTO stage chose a signature's layouts, and the cost model's figures.

Why here and not beside the cost model (``auto/cost/``): the record travels
with the call plan (``CallPlan.auto``) down to the report's tables, and both sit
below the AUTO stage; the stage fills it in (``auto/resolve.py``), the report
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
class Candidate:
    """One assignment of layouts the search scored (a row of the auto table).

    Attributes:
        specs: one spec string per AUTO input leaf, in :attr:`AutoChoice.paths` order.
        estimate: the cost model's figures.
        measured_collective_bytes: XLA's, where this candidate was compiled to
            confirm it (``None``: scored by the model only).
        measured_memory_bytes: XLA's memory analysis, likewise.
    """

    specs: tuple[str, ...]
    estimate: Estimate
    measured_collective_bytes: float | None = None
    measured_memory_bytes: float | None = None


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
class PlanOption:
    """One whole plan weighed for a call whose body has AUTO pipelines (NOTE [pipeline
    decision] in ``trace/decision.py``).

    Attributes:
        name: ``"no pipeline"``, or the pipeline it runs (``"gpipe pipeline over
            'model', 4 microbatches"``).
        candidate: its best layouts' specs and figures, the model's and XLA's; None
            where the program could not be built (``note`` says why).
        note: why it was not built, or was not chosen where it was measured.
    """

    name: str
    candidate: Candidate | None
    note: str = ""


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
        plan: for a body with AUTO pipelines, the plan chosen (a :class:`PlanOption`'s
            ``name``), and ``plans`` every one weighed, the chosen first; ``""`` and
            ``()`` otherwise.
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
    plan: str = ""
    plans: tuple[PlanOption, ...] = ()
