"""Resolve a call's AUTO leaves into specs: once per signature, cached, thread-safe.

Why a stage of its own: the front door has traced the body and knows every
other spec; the search needs that jaxpr and the stages below to confirm its
finalists (compiled through dispatch's executable cache, so the winner's
executable is the one the first call runs; read by the report), and what it
returns is ordinary specs, so everything after it (rules, lowering, dispatch)
never sees AUTO.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

from jax.sharding import AxisType, Mesh
from jax.tree_util import KeyPath, keystr

from .. import options
from ..compiler.cache import get_executable
from ..events import emit
from ..inspect.tables import build as build_report
from ..primitives.auto_choice import AutoChoice, Baseline, Candidate
from ..primitives.call_plan import CallPlan
from ..sharding.auto import AUTO
from ..sharding.parsed import ParsedPartitionSpec
from . import remat, remat_unrolled
from .confirm import Measured, NoLayoutFits, Outcome, no_fit, solve
from .cost import spec_layout
from .layouts import Layout
from .search import Problem, Scored
from .structure import family

_CACHE_SIZE = 64
_cache: collections.OrderedDict[Any, Choice] = collections.OrderedDict()
# One search at a time: a second caller of the same signature waits and reuses it.
_lock = threading.RLock()  # re-entrant: a search never waits on itself

Spec = ParsedPartitionSpec | None
#: The specs, the record, and the program rewritten to rematerialize (``None``: as traced).
Choice = tuple[tuple[Any, ...], tuple[Any, ...], AutoChoice, Any]


def to_spec(layout: Layout) -> ParsedPartitionSpec:
    """A layout as a parsed spec, spelled as users write it (``to_partition_spec``)."""
    return ParsedPartitionSpec(ParsedPartitionSpec(None, layout).to_partition_spec(), layout)


def _describe(layout: Layout) -> str:
    return str(to_spec(layout).to_partition_spec())


def ties(
    in_paths: Sequence[KeyPath],
    in_avals: Sequence[Any],
    out_paths: Sequence[KeyPath],
    out_avals: Sequence[Any],
) -> list[int | None]:
    """For each output, the input at the same path with the same shape and dtype.

    Paths match as written (``out[0]['w']`` and ``args[0]['w']``) or, failing
    that, with the argument position dropped when exactly one input matches
    (``step(params, batch) -> params``).
    """

    def same(i: int, j: int) -> bool:
        a, b = in_avals[i], out_avals[j]
        return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype

    exact = {keystr(p): i for i, p in enumerate(in_paths)}
    stripped: dict[str, list[int]] = collections.defaultdict(list)
    for k, p in enumerate(in_paths):
        stripped[keystr(p[1:])].append(k)
    found: list[int | None] = []
    for j, p in enumerate(out_paths):
        hit = exact.get(keystr(p))
        if hit is not None and same(hit, j):
            found.append(hit)
            continue
        near = [k for k in stripped.get(keystr(p), []) if same(k, j)]
        found.append(near[0] if len(near) == 1 else None)
    return found


def resolve(
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> CallPlan:
    """``plan`` with every AUTO spec chosen (NOTE [auto search] in ``search.py``).

    ``plan``'s params hold AUTO where a spec is to be chosen; ``in_paths`` are the
    dynamic arguments' key paths (after the plan's constants), ``out_paths`` the
    outputs'.

    With ``memory_limit`` below what layouts alone reach, the returned plan's body may
    be rewritten to rematerialize (NOTE [auto remat] in ``remat.py``).

    Raises:
        ValueError: no layout, rematerialized or not, fits ``memory_limit`` (the
            message names the smallest found).
    """
    params = plan.params
    problem = _problem(plan, in_paths, out_paths)
    # The program's text, not the jaxpr object: two threads tracing one signature at
    # once get two equal jaxprs, and the choice depends on the program alone.
    key = (
        str(params.jaxpr.jaxpr), tuple(params.jaxpr.in_avals), params.mesh,
        tuple(params.in_axis_resources), tuple(params.out_axis_resources), problem.out_ties,
        problem.in_families, problem.donated, memory_limit, options.use_shardy(),
        params.compiler_options,
    )  # fmt: skip
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            hit = _search(plan, problem, in_paths, out_paths, memory_limit)
            _cache[key] = hit
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(key)
    ins, outs, choice, body = hit
    new_params = dataclasses.replace(
        params, in_axis_resources=ins, out_axis_resources=outs, jaxpr=body or params.jaxpr
    )
    return dataclasses.replace(plan, params=new_params, auto=choice)


def _problem(plan: CallPlan, in_paths: Sequence[KeyPath], out_paths: Sequence[KeyPath]) -> Problem:
    """The search's view of ``plan``: fixed layouts, AUTO leaves, ties and families."""
    params = plan.params
    mesh: Mesh = params.mesh
    order = tuple(str(a) for a in mesh.axis_names)
    jaxpr = params.jaxpr
    n_consts = plan.num_consts
    in_specs, out_specs = params.in_axis_resources, params.out_axis_resources

    def fixed(spec: Any, aval: Any) -> Layout | None:
        if spec is AUTO:
            return None
        if spec is None:  # a tracer's layout, left to XLA: the model reads it as whole
            return ((),) * len(aval.shape)
        return spec_layout(spec, len(aval.shape), order)

    out_fixed = tuple(
        None if s is None or s is AUTO else spec_layout(s, len(a.shape), order)
        for s, a in zip(out_specs, jaxpr.out_avals, strict=True)
    )
    tie_of = ties(in_paths, jaxpr.in_avals[n_consts:], out_paths, jaxpr.out_avals)
    forced: list[Layout | None] = [None] * len(in_specs)
    for j, t in enumerate(tie_of):
        if t is not None and out_fixed[j] is not None:
            forced[t + n_consts] = out_fixed[j]
    return Problem(
        jaxpr=jaxpr,
        mesh_shape={str(a): int(n) for a, n in mesh.shape.items()},
        free_axes=tuple(
            str(a)
            for a, t in zip(mesh.axis_names, mesh.axis_types, strict=True)
            if t == AxisType.Auto
        ),
        in_layouts=tuple(fixed(s, a) for s, a in zip(in_specs, jaxpr.in_avals, strict=True)),
        out_layouts=out_fixed,
        out_ties=tuple(
            None if (s is not AUTO or t is None) else t + n_consts
            for s, t in zip(out_specs, tie_of, strict=True)
        ),
        donated=tuple(params.donated_invars),
        in_families=(None,) * n_consts + tuple(family(p) for p in in_paths),
        in_forced=tuple(forced),
    )


def clear() -> None:
    """Forget every resolved signature."""
    with _lock:
        _cache.clear()


def _search(
    plan: CallPlan,
    problem: Problem,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int | None,
) -> Choice:
    """Search, confirm with XLA (NOTE [auto floor]); the specs and the record."""
    n_consts = plan.num_consts
    auto_in = [i for i, lay in enumerate(problem.in_layouts) if lay is None]
    names = [f"args{keystr(in_paths[i - n_consts])}" for i in auto_in]

    def describe(s: Scored) -> str:
        return ", ".join(
            f"{n}: {_describe(s.in_layouts[i])}" for n, i in zip(names, auto_in, strict=True)
        )

    try:
        outcome = solve(
            problem, functools.partial(_measure, plan), memory_limit, describe, plan.api
        )
        chosen: _Rematerialized | None = None
    except NoLayoutFits as failed:
        if memory_limit is None or n_consts:
            raise
        chosen = _rematerialize(plan, in_paths, out_paths, memory_limit, describe, failed)
        outcome = chosen.outcome
    if chosen is None and not n_consts:  # NOTE [auto scan residuals] in remat.py
        chosen = _trimmed(plan, outcome)
        outcome = outcome if chosen is None else chosen.outcome
    compiles = 0 if n_consts else outcome.compiles  # the model stood in for XLA
    measured = outcome.chosen_measured
    emit(
        "auto_search",
        name=plan.params.name,
        leaves=len(auto_in),
        evaluations=outcome.evaluations,
        compiles=compiles,
        search_s=outcome.search_s,
        confirm_s=outcome.confirm_s,
        collective_bytes=measured.collective_bytes,
        memory_bytes=measured.memory_bytes,
    )
    record = _record(plan, outcome, names, out_paths, compiles, memory_limit)
    if chosen is None:
        return (*_specs_of(plan, outcome.chosen), record, None)
    record = dataclasses.replace(
        record,
        remat=chosen.plan.rematerialized(),
        flops_added=chosen.outcome.chosen_measured.flops - chosen.layout_only_flops,
        remat_to_fit=chosen.to_fit,
    )
    return (*_specs_of(plan, outcome.chosen), record, chosen.body)


@dataclasses.dataclass(frozen=True)
class _Rematerialized:
    plan: remat.Plan
    body: Any  # the program rewritten as ``plan`` says
    outcome: Outcome
    layout_only_flops: float  # XLA's flops for the same layouts, nothing recomputed
    to_fit: bool = True  # chosen to meet the limit (not NOTE [auto scan residuals])


def _rematerialize(
    plan: CallPlan,
    in_paths: Sequence[KeyPath],
    out_paths: Sequence[KeyPath],
    memory_limit: int,
    describe: Any,
    failed: NoLayoutFits,
) -> _Rematerialized:
    """The plan that recomputes the fewest flops (XLA's cost analysis) and fits, its
    layouts searched and confirmed as any program's (NOTE [auto remat])."""
    smallest = (failed.memory_bytes, failed.smallest)
    best: tuple[tuple[float, float], remat.Plan, Any, Outcome] | None = None
    seen: set[str] = set()
    fitting: list[remat.Plan] = []
    found: list[remat.Recomputable] = list(remat.blocks(plan.params.jaxpr))
    if not found:  # perhaps differentiated inside jit calls (NOTE [auto remat])
        inlined = remat.inlined(plan.params.jaxpr)
        found = list(remat.blocks(inlined))
        plan = _with_program(plan, inlined)
    rewrite = remat.rewrite
    if not found:  # perhaps an unrolled stack (NOTE [auto remat unrolled])
        found = list(remat_unrolled.layers(plan.params.jaxpr, in_paths))
        rewrite = remat_unrolled.rewrite
    if not found:  # nothing differentiated to recompute: the layouts were all there was
        raise failed
    for rp in remat.plans(found):
        if any(rp.recomputes_more_than(f) for f in fitting):
            continue  # no cheaper than a plan that fits
        body = rewrite(plan.params.jaxpr, rp)
        if str(body.jaxpr) in seen or not _same_types(body, plan.params.jaxpr):
            continue  # two policies that keep the same values; or types retracing cannot keep
        seen.add(str(body.jaxpr))
        trial = _with_program(plan, body)
        what = ", ".join(f"{b} with {p}" for b, p in rp.rematerialized())
        o, kept = _keeping_layouts(trial, failed.unconstrained, memory_limit)
        if kept is not None and o is None:
            where = describe(failed.unconstrained)
            smallest = min(smallest, (kept.memory_bytes, f"{where}, {what} rematerialized"))
        if o is None:  # the layouts too must change: searched under the limit
            problem = _problem(trial, in_paths, out_paths)
            try:
                measure = functools.partial(_measure, trial)
                o = solve(problem, measure, memory_limit, describe, plan.api, "flops")
            except NoLayoutFits as e:
                smallest = min(smallest, (e.memory_bytes, f"{e.smallest}, {what} rematerialized"))
                continue
        fitting.append(rp)
        price = (o.chosen_measured.flops, o.chosen_measured.memory_bytes)
        if best is None or price < best[0]:
            best = (price, rp, body, o)
    if best is None:
        raise no_fit(
            plan.api, memory_limit, smallest[1], smallest[0], "layout or rematerialization"
        )
    _, rp, body, o = best
    return _Rematerialized(rp, body, o, _measure(plan, o.chosen, True).flops)


def _trimmed(plan: CallPlan, outcome: Outcome) -> _Rematerialized | None:
    """The chosen layouts with every differentiated scan's body under
    :data:`remat.TRIM`, where XLA's figures say it costs nothing worth counting
    (NOTE [auto scan residuals]); ``None`` where there is no such scan or it does not."""
    found = remat.blocks(plan.params.jaxpr)
    if not found:
        return None
    rp = remat.Plan(tuple(found), (remat.TRIM,) * len(found))
    body = remat.rewrite(plan.params.jaxpr, rp)
    if not _same_types(body, plan.params.jaxpr):
        return None
    t0 = time.perf_counter()
    m = _measure(_with_program(plan, body), outcome.chosen, True)
    spent = time.perf_counter() - t0
    base = outcome.chosen_measured
    cheap = m.flops <= base.flops * (1 + remat.TRIM_FLOPS)
    if not (m.memory_bytes < base.memory_bytes and cheap):
        return None
    if m.collective_bytes > base.collective_bytes:
        return None  # collectives in the body, run again: not free
    trimmed = dataclasses.replace(
        outcome,
        chosen_measured=m,
        compiles=outcome.compiles + 1,
        search_s=outcome.search_s + spent,
        confirm_s=outcome.confirm_s + spent,
    )
    return _Rematerialized(rp, body, trimmed, base.flops, to_fit=False)


def _same_types(body: Any, traced: Any) -> bool:
    """Whether the rewritten ``body`` kept ``traced``'s input and output types (a plan
    whose retracing does not keep them is not tried)."""
    return (body.in_avals, body.out_avals) == (traced.in_avals, traced.out_avals)


def _with_program(plan: CallPlan, jaxpr: Any) -> CallPlan:
    """``plan`` running ``jaxpr`` (the same inputs and outputs) instead of its own body."""
    return dataclasses.replace(plan, params=dataclasses.replace(plan.params, jaxpr=jaxpr))


def _keeping_layouts(
    trial: CallPlan, unconstrained: Scored | None, memory_limit: int
) -> tuple[Outcome | None, Measured | None]:
    """The layouts chosen without the limit, with ``trial``'s rematerialized program:
    the outcome where they fit (one compile, no search), and XLA's figures."""
    if unconstrained is None:
        return None, None
    t0 = time.perf_counter()
    kept = _measure(trial, unconstrained, True)
    if kept.memory_bytes > memory_limit:
        return None, kept
    seconds = time.perf_counter() - t0
    return Outcome(unconstrained, kept, [], [], 0, 1, seconds, seconds), kept


def _specs_of(plan: CallPlan, s: Scored) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The call's specs with its AUTO leaves laid out as ``s`` says."""
    params = plan.params
    ins = tuple(
        to_spec(s.in_layouts[i]) if spec is AUTO else spec
        for i, spec in enumerate(params.in_axis_resources)
    )
    outs = tuple(
        to_spec(s.out_layouts[j]) if spec is AUTO else spec
        for j, spec in enumerate(params.out_axis_resources)
    )
    return ins, outs


#: Compiler options of a quick trial compile (NOTE [auto floor] in ``confirm.py``).
QUICK = {"xla_backend_optimization_level": 0}


def _measure(plan: CallPlan, s: Scored, quick: bool) -> Measured:
    """XLA's figures for ``plan`` laid out as ``s`` says, from its report; ``quick``:
    compiled without optimizing the machine code (the figures are the same)."""
    if plan.num_consts:  # a body closing over tracers cannot be lowered alone
        return Measured(
            s.estimate.collective_bytes, s.estimate.memory_bytes, s.estimate.collectives
        )
    ins, outs = _specs_of(plan, s)
    compiler = plan.params.compiler_options
    if quick:
        compiler = tuple(sorted({**dict(compiler), **QUICK}.items()))
    new_params = dataclasses.replace(
        plan.params, in_axis_resources=ins, out_axis_resources=outs, compiler_options=compiler
    )
    trial = dataclasses.replace(plan, params=new_params)
    # Through the executable cache: the winner's is the one its first call runs.
    report = build_report(trial, get_executable(trial.params)[0], options.use_shardy())
    collective = sum(c.bytes_per_device * c.count for c in report.collectives)
    memory = s.estimate.memory_bytes if report.memory is None else report.memory.total
    count = sum(c.count for c in report.collectives)
    flops = 0.0 if report.cost is None else report.cost.flops
    return Measured(float(collective), float(memory), float(count), flops)


def _record(
    plan: CallPlan,
    outcome: Outcome,
    names: Sequence[str],
    out_paths: Sequence[KeyPath],
    compiles: int,
    memory_limit: int | None,
) -> AutoChoice:
    """The report's record of the choice (``AutoChoice``)."""
    auto_in = [i for i, s in enumerate(plan.params.in_axis_resources) if s is AUTO]
    auto_out = [j for j, s in enumerate(plan.params.out_axis_resources) if s is AUTO]

    def candidate(s: Scored, m: Measured | None) -> Candidate:
        return Candidate(
            specs=tuple(_describe(s.in_layouts[i]) for i in auto_in),
            estimate=s.estimate,
            measured_collective_bytes=None if m is None else m.collective_bytes,
            measured_memory_bytes=None if m is None else m.memory_bytes,
        )

    chosen = outcome.chosen
    return AutoChoice(
        paths=tuple(names),
        out_paths=tuple(f"out{keystr(out_paths[j])}" for j in auto_out),
        out_specs=tuple(_describe(chosen.out_layouts[j]) for j in auto_out),
        chosen=candidate(chosen, outcome.chosen_measured),
        runners_up=tuple(candidate(s, m) for s, m in outcome.others),
        memory_limit=memory_limit,
        evaluations=outcome.evaluations,
        compiles=compiles,
        search_s=outcome.search_s,
        confirm_s=outcome.confirm_s,
        baselines=tuple(Baseline(n, candidate(s, m)) for n, s, m in outcome.baselines),
        shapes=tuple(tuple(plan.params.jaxpr.in_avals[i].shape) for i in auto_in),
        layouts=tuple(chosen.in_layouts[i] for i in auto_in),
    )
