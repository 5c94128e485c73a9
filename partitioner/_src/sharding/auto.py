"""``AUTO``: a spec leaf partitioner resolves itself, and the record of how it chose.

Why in the spec layer: ``AUTO`` is a spec-tree leaf like ``UNSPECIFIED`` (parsed,
broadcast over subtrees and checked by the same code), and the record of a choice
travels with the call plan down to the report, so both live below every stage
that reads them. The search itself is ``_src/auto/`` (NOTE [auto search] there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class _Auto:
    """A spec leaf (or a whole subtree) whose layout partitioner chooses at lower time.

    A singleton, compared by identity like ``None``; its repr is the public name.
    """

    def __repr__(self) -> str:
        return "AUTO"

    def __reduce__(self) -> str:
        return "AUTO"  # pickles as the module-level singleton


#: Let partitioner choose this leaf's layout (``in_axis_resources=(AUTO, P("data"))``).
AUTO: _Auto = _Auto()


def is_auto(x: object) -> bool:
    return x is AUTO


def has_auto(specs: Iterable[object]) -> bool:
    """Whether any of ``specs`` is AUTO (the plan then goes through the AUTO stage)."""
    return any(s is AUTO for s in specs)


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
    """A layout XLA always measures beside the choice (NOTE [auto floor]).

    Attributes:
        name: ``"replicated"``, ``"data-parallel"``, or ``"replicated =
            data-parallel"`` where the two are one program (the batch is given).
        candidate: its specs and figures, XLA's included.
    """

    name: str
    candidate: Candidate


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
        baselines: the replicated and data-parallel layouts, as XLA measured them;
            the chosen layout is never beaten by one of them on both collective
            bytes and memory.
        shapes: each AUTO input's shape, and ``layouts`` its chosen layout (per
            dimension, the mesh axes splitting it): what the report's picture draws.
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
