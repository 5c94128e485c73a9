"""``partitioner.pipeline(layer, axis=...)``: the function it returns, its plan, its staging.

The program is NOTE [pipeline] (``program.py``); the schedule's arithmetic is
NOTE [pipeline schedule]; the weights' copies per shard NOTE [pipeline gradients]
(``shards.py``); the choice of microbatches and of what a step saves NOTE
[pipeline microbatches]; the order circular needs ``staged.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..inspect.pipelines import PipelineSummary, remember_chart, stage_devices
from ..inspect.visualize import schedule_png
from ..primitives.auto_choice import Estimate
from ..primitives.auto_pipeline import AutoPipelineSite, mark
from ..primitives.constraint import with_sharding_constraint
from ..sharding.auto import AUTO, _Auto
from ..sharding.mesh_env import maybe_current_mesh
from ..trace.decision import PipelineDecision
from ..trace.tracing import enclosing_body, enclosing_settings
from . import checks
from .actions import ActionKind, Table
from .checks import API
from .loss import by_actions, head_mean
from .microbatches import MicrobatchOption, kept, layer_costs, pick, tree_bytes
from .microbatches import options as microbatch_options
from .program import Placement, Saves, plain_scan
from .program import run as run_program
from .schedule import SCHEDULES, Schedule, ScheduleKind
from .shards import batch_axes, free_axes
from .staged import StagedParams, stage_order

_SAVES = tuple(kind.value for kind in Saves)


def pipeline(
    layer: Callable[[Any, Any], Any],
    *,
    axis: str | _Auto,
    microbatches: int | None = None,
    schedule: str | None = None,
    mesh: Mesh | None = None,
    saves: str | None = None,
    loss: Callable[[Any, Any, Any], Any] | None = None,
) -> Pipelined | AutoPipelined:
    """A function ``run(stacked_params, x)`` whose value is the plain scan's,
    ``lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)[0]``, run as a
    pipeline over the mesh axis ``axis`` inside the enclosing program (NOTE [pipeline]);
    with ``loss=head``, ``run(stacked_params, x, head_params, targets)``, the batch's
    mean loss of ``head`` after the plain scan (NOTE [pipeline loss]).

    Args:
        layer: ``layer(params, h) -> h``, one layer: the same structure, shapes and
            dtypes out as in. It acts on each example of the batch on its own (a
            layer mixing examples, as batch norm does, would see microbatches).
        axis: the mesh axis whose devices are the stages; ``partitioner.AUTO``: the
            enclosing jit/pjit call chooses whether to pipeline at all, over which
            axis and with which schedule, with its layouts (NOTE [pipeline decision];
            outside such a call, the plain scan runs).
        microbatches: how many pieces the batch (``x``'s leading dimension) is cut
            into; None: chosen by partitioner (NOTE [pipeline microbatches]).
        schedule: ``"gpipe"`` (each stage holds ``L / S`` contiguous layers),
            ``"circular"`` (layer ``i`` on stage ``i mod S``, ``L / S`` visits: a
            smaller bubble; give it parameters staged once, :meth:`Pipelined.stage`),
            or, with ``loss=``, ``"1f1b"`` (gpipe's stages, each backward as soon as
            it can run: at most ``S`` microbatches in flight), ``"interleaved-1f1b"``
            (1F1B over circular's stages) or ``"zero-bubble"`` (ZB-H1: the weight
            gradients fill the bubble) (NOTE [pipeline actions]); None: gpipe, or
            with ``axis=AUTO`` any schedule the body can run, as chosen (with
            ``loss=``, the three that run by actions too).
        mesh: the mesh (as ``jax.shard_map`` takes one); None: the mesh in context,
            else the mesh of the enclosing ``jit``/``pjit`` call.
        saves: what each step keeps for the backward pass: ``"activations"`` (what it
            reads), ``"inputs"`` (each visit's input, the rest recomputed); None:
            chosen with the microbatches (NOTE [pipeline residuals]).
        loss: ``head(head_params, h, targets) -> loss``: one microbatch's mean loss (a
            scalar), ``h`` the last layer's output on it. The pipeline then returns the
            batch's mean loss, and ``jax.grad`` of it gives the gradients of the
            parameters, the head's parameters, ``x`` and ``targets``.

    Returns:
        A :class:`Pipelined`, or for ``axis=AUTO`` an :class:`AutoPipelined` (which,
        traced under its call's decision, runs as the :class:`Pipelined` decided).

    Raises:
        TypeError: ``layer`` not callable, ``axis`` not a string, ``microbatches``
            not an int, ``mesh`` not a ``jax.sharding.Mesh``.
        ValueError: ``microbatches`` below 1, an unknown ``schedule`` or ``saves``,
            a schedule that runs by actions without ``loss``. At the call: see
            :meth:`Pipelined.plan`.
    """
    if not callable(layer):
        raise TypeError(f"{API}: layer must be callable, got {type(layer).__name__}")
    if not isinstance(axis, str) and axis is not AUTO:
        raise TypeError(
            f"{API}: axis must be a mesh axis name (a str) or partitioner.AUTO, got {axis!r}"
        )
    if microbatches is not None:
        if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)):
            raise TypeError(
                f"{API}: microbatches must be an int or None, got {type(microbatches).__name__}"
            )
        if microbatches < 1:
            raise ValueError(f"{API}: microbatches must be >= 1, got {microbatches}")
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"{API}: schedule must be one of {SCHEDULES} or None, got {schedule!r}")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"{API}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if saves is not None and saves not in _SAVES:
        raise ValueError(f"{API}: saves must be one of {_SAVES} or None, got {saves!r}")
    if loss is not None and not callable(loss):
        raise TypeError(
            f"{API}: loss must be callable, head(head_params, h, targets) -> the mean loss "
            f"of one microbatch; got {type(loss).__name__}"
        )
    count = None if microbatches is None else int(microbatches)
    kind = None if schedule is None else ScheduleKind(schedule)
    checks.needs_loss(kind, loss)
    keeps = None if saves is None else Saves(saves)
    if isinstance(axis, str):
        return Pipelined(layer, axis, count, kind or ScheduleKind.GPIPE, mesh, keeps, loss)
    # AUTO weighs every schedule the stack can run: those by actions need the loss.
    allowed = (kind,) if kind else tuple(k for k in ScheduleKind if loss or not k.by_actions)
    return AutoPipelined(layer, count, allowed, mesh, keeps, loss)


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """What a pipelined call does (``Pipelined.plan``), for the report and the docs.

    Attributes:
        schedule: the shape (layers, stages, microbatches) and its arithmetic.
        placement: the stages' axis and the axes each stage's batch is split over
            (NOTE [pipeline gradients]).
        stage_devices: per stage, the ids of the devices that run it.
        chosen: whether partitioner chose the microbatch count.
        saves: what each step keeps for the backward pass (:class:`Saves`, a string:
            ``"activations"`` or ``"inputs"``).
        rest_layers: layers after the stages' that run outside them (a layer count
            the stages do not divide).
        estimates: the model's figures per option (microbatches, saves) it weighed.
        estimate: the chosen option's figures per device: the bytes the pipeline is
            expected to move and the memory it is expected to hold in a training step.
        permute_bytes: bytes one device sends its neighbour per step (its shard of a
            microbatch's activations).
    """

    schedule: Schedule
    placement: Placement
    stage_devices: tuple[tuple[int, ...], ...]
    chosen: bool
    saves: Saves
    rest_layers: int
    estimates: tuple[MicrobatchOption, ...]
    estimate: Estimate
    permute_bytes: int

    @property
    def axis(self) -> str:
        return self.placement.axis

    def summary(self) -> PipelineSummary:
        """The record the program carries and the report reads back (NOTE [pipeline in
        the report])."""
        schedule = self.schedule
        return PipelineSummary(
            axis=self.axis,
            schedule=schedule.kind,
            layers=schedule.layers,
            stages=schedule.stages,
            microbatches=schedule.microbatches,
            steps=schedule.steps,
            bubble_fraction=schedule.bubble_fraction,
            chosen=self.chosen,
            stage_layers=tuple(
                _ranges(schedule.layers_of(stage)) for stage in range(schedule.stages)
            ),
            batch_axes=self.placement.batch,
            saves=self.saves.value,
            rest_layers=self.rest_layers,
            in_flight=schedule.in_flight,
        )

    def __str__(self) -> str:
        expected = self.estimate
        traffic = (
            f"expected per device: collective-permute {self.permute_bytes:,} bytes per step, "
            f"{expected.collective_bytes:,.0f} bytes moved and {expected.memory_bytes:,.0f} "
            "bytes held in a training step (the model's figures)"
        )
        return "\n".join(self.summary().lines(self.stage_devices, traffic))

    @property
    def actions(self) -> Table:
        """The schedule as data (NOTE [pipeline actions]): one row per stage, one column
        per step of one forward's time, each cell an ``Action`` (``kind``: forward,
        backward, input-gradient, weight-gradient or idle; ``microbatch``, ``visit``)."""
        return self.schedule.actions

    def chart(self, *, png: str | None = None) -> str:
        """The schedule's table (:attr:`actions`) as text: a row per stage, a column per
        step of one forward's time, each cell ``F``, ``B`` (a whole backward over two
        columns, or zero bubble's input gradient over one) or ``W`` (a weight gradient)
        with its microbatch (and visit where there are several: ``F3b`` is microbatch
        3's forward on its second visit), or ``.`` where the stage waits (the bubble);
        ``png=path`` also draws it as a picture (needs matplotlib)."""
        schedule = self.schedule
        if png is not None:
            title = (
                f"{schedule.kind}: {schedule.layers} layers on {schedule.stages} stages, "
                f"{schedule.microbatches} microbatches, bubble {schedule.bubble_fraction:.0%}"
            )
            cells = [[(a.letter, a.microbatch, a.visit) for a in row] for row in self.actions]
            schedule_png(cells, png, title)
        return chart_text(self.actions, schedule.repeats > 1)


def chart_text(table: Table, visits: bool) -> str:
    """``table`` as :meth:`PipelinePlan.chart` prints it."""
    texts = [
        [
            "."
            if a.kind is ActionKind.IDLE
            else a.letter + str(a.microbatch) + (chr(ord("a") + a.visit) if visits else "")
            for a in row
        ]
        for row in table
    ]
    width = max(len(t) for row in texts for t in row)
    return "\n".join(
        f"stage {stage} | " + " ".join(t.rjust(width) for t in row)
        for stage, row in enumerate(texts)
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Pipelined:
    """The function :func:`pipeline` returns for a given axis: ``run(params, x)``.

    Attributes:
        layer, axis, microbatches, mesh, loss: as :func:`pipeline` took them.
        schedule: the schedule (gpipe where none was given).
        saves: what each step keeps (None: chosen with the microbatches).
        batch_over: the mesh axes a stage's microbatch may be split over (None: every
            one the layer leaves free); an AUTO pipeline's decision may keep one for
            the weights (tensor parallel inside the stages).
    """

    layer: Callable[[Any, Any], Any]
    axis: str
    microbatches: int | None
    schedule: ScheduleKind
    mesh: Mesh | None = None
    saves: Saves | None = None
    loss: Callable[[Any, Any, Any], Any] | None = None
    batch_over: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _wraps(self, self.layer)

    def __call__(self, params: Any, x: Any, *head: Any) -> Any:
        """The plain scan's value on ``x``; ``params`` stacked (every leaf ``[layers,
        ...]``) or staged once (:meth:`stage`). With ``loss=``: ``run(params, x,
        head_params, targets)``, the batch's mean loss (NOTE [pipeline loss])."""
        checks.call_arguments(self.loss, head)
        return self.run(self.plan(params, x, *head), params, x, *head)

    def run(self, plan: PipelinePlan, params: Any, x: Any, *head: Any) -> Any:
        """The call, as ``plan`` (this pipeline's :meth:`plan` of the arguments) says."""
        checks.call_arguments(self.loss, head)
        staged = params if isinstance(params, StagedParams) else stage_order(params, plan.schedule)
        summary = plan.summary()
        remember_chart(summary, plan.chart())  # NOTE [pipeline in the report]
        with jax.named_scope(summary.marker()):
            if self.loss is not None and plan.schedule.kind.by_actions:
                head_params, targets = head
                return self._by_actions(plan, staged, x, head_params, targets)
            out = run_program(
                self.layer, plan.schedule, plan.placement, plan.saves, staged.staged, x
            )
        if staged.rest is not None:
            # The layers the stages do not divide: after them, outside them (as MaxText runs them).
            out = plain_scan(self.layer, staged.rest, out)
        if self.loss is None:
            return out
        head_params, targets = head
        return head_mean(self.loss, head_params, out, targets, plan.schedule.microbatches)

    def _by_actions(
        self, plan: PipelinePlan, staged: StagedParams, x: Any, head_params: Any, targets: Any
    ) -> Any:
        """NOTE [pipeline loss]: the layers the stages do not divide run in the head."""
        loss = self.loss
        assert loss is not None
        head, given = loss, head_params
        if staged.rest is not None:

            def head(both: Any, h: Any, t: Any) -> Any:
                return loss(both[0], plain_scan(self.layer, both[1], h), t)

            given = (head_params, staged.rest)
        return by_actions(
            self.layer, head, plan.schedule, plan.placement, plan.saves, staged.staged, x,
            given, targets,
        )  # fmt: skip

    def stage(self, stacked_params: Any) -> StagedParams:
        """``stacked_params`` (every leaf ``[layers, ...]``) in the order this pipeline's
        stages hold them, to lay out once (``P(axis)`` on every leaf's first dimension:
        ``jax.tree.map(lambda _: P(axis), staged)``) and train in that form: a circular
        pipeline given a stack moves every parameter to that order and back at every
        call. :meth:`StagedParams.unstage` gives the stack back."""
        mesh = self._mesh()
        stages = self._stages(mesh)
        layers = checks.layer_count(stacked_params)
        pipelined = checks.pipelined(layers, stages, self.axis)
        staged = stage_order(stacked_params, Schedule(self.schedule, pipelined, stages, 1))
        stage_first = NamedSharding(mesh, PartitionSpec(self.axis))
        laid = jax.tree.map(lambda leaf: with_sharding_constraint(leaf, stage_first), staged.staged)
        return dataclasses.replace(staged, staged=laid)

    def plan(
        self, params: Any, x: Any, head_params: Any = None, targets: Any = None
    ) -> PipelinePlan:
        """The stages, microbatches, schedule and what each step saves for a call with
        these arguments (arrays or ``jax.ShapeDtypeStruct``s), under the mesh it runs
        over; with ``loss=``, ``head_params`` and ``targets`` (if given) are checked too.

        Raises:
            RuntimeError: no mesh given, in context or of an enclosing call.
            ValueError: ``axis`` not in the mesh; parameters without a common
                leading (layer) dimension, or fewer layers than stages; staged
                parameters for another schedule or stage count; a batch not divisible
                by ``microbatches``; fewer microbatches than the schedule needs; a
                layer whose output differs from its input in structure, shape or
                dtype; targets whose batch is not ``x``'s; a head that does not
                return a scalar.
        """
        mesh = self._mesh()
        stages = self._stages(mesh)
        one_layer, layers = self._layers(params, stages)
        pipelined = checks.pipelined(layers, stages, self.axis)
        batch = checks.batch_size(x)
        h_aval = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype), x)
        checks.layer_keeps_its_input(self.layer, one_layer, h_aval)
        if self.microbatches is not None:
            checks.microbatch_count(self.microbatches, batch)
            checks.enough_microbatches(self.schedule, self.microbatches, stages, self.axis)
        if self.schedule.by_actions:
            checks.one_dtype(self.schedule, x)
        if self.loss is not None and targets is not None:
            checks.targets_batch(targets, batch, self.microbatches)
            count = self.microbatches or 1
            checks.head_gives_a_scalar(self.loss, head_params, h_aval, targets, count)
        limit = enclosing_settings().memory_limit
        key = (
            self.layer, self.schedule, self.microbatches, self.saves, layers, stages,
            str(jax.tree.structure((one_layer, h_aval))),
            tuple((leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves((one_layer, h_aval))),
            tuple(mesh.shape.items()), tuple(mesh.axis_types), self.axis, limit, self.batch_over,
        )  # fmt: skip
        best, table, placement = kept(
            key, lambda: self._weigh(mesh, one_layer, h_aval, pipelined, batch, limit)
        )
        schedule = Schedule(self.schedule, pipelined, stages, best.microbatches)
        return PipelinePlan(
            schedule=schedule,
            placement=placement,
            stage_devices=stage_devices(mesh, self.axis),
            chosen=self.microbatches is None,
            saves=best.saves,
            rest_layers=layers - pipelined,
            estimates=table,
            estimate=best.estimate,
            permute_bytes=tree_bytes(x) // (best.microbatches * placement.shards),
        )

    def _mesh(self) -> Mesh:
        mesh = self.mesh or maybe_current_mesh()
        if mesh is None:
            enclosing = enclosing_body()
            mesh = None if enclosing is None else enclosing[0]
        if mesh is None:
            raise RuntimeError(
                f"{API}: no mesh; pass mesh=..., call the pipelined function under "
                "`jax.set_mesh(...)` (or `partitioner.mesh(...)`), or inside a jit/pjit whose "
                "shardings name one"
            )
        return mesh

    def _stages(self, mesh: Mesh) -> int:
        if self.axis not in mesh.axis_names:
            raise ValueError(
                f"{API}: axis {self.axis!r} is not an axis of the mesh {dict(mesh.shape)}"
            )
        return int(mesh.shape[self.axis])

    def _layers(self, params: Any, stages: int) -> tuple[Any, int]:
        """One layer's parameters (as ``jax.ShapeDtypeStruct``s) and the layer count."""
        if isinstance(params, StagedParams):
            staged_stages = np.shape(jax.tree.leaves(params.staged)[0])[0]
            if params.schedule.layout is not self.schedule.layout or staged_stages != stages:
                raise ValueError(
                    f"{API}: the parameters were staged for a {params.schedule} pipeline of "
                    f"{staged_stages} stages, not this {self.schedule} one of {stages} stages "
                    f"over {self.axis!r}; stage them with this pipeline's stage()"
                )
            one = jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[3:], leaf.dtype), params.staged
            )
            return one, params.layers
        one = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], leaf.dtype), params
        )
        return one, checks.layer_count(params)

    def _tensor_axes(self, mesh: Mesh, batch: tuple[str, ...]) -> tuple[str, ...]:
        """The axes an AUTO call's whole plan keeps for the weights inside the stages
        (``batch_over`` leaves them out): the layer's column-split matmuls are
        constrained over them (NOTE [tensor parallel in the stages]). Empty for a
        pipeline the user placed (``batch_over`` None: the layer's own constraints say
        what is tensor parallel), nor for the schedules by actions (their manual
        region keeps to the layer's own constraints)."""
        if self.batch_over is None or self.schedule.by_actions:
            return ()
        return tuple(name for name in free_axes(mesh, self.axis) if name not in batch)

    def _weigh(
        self, mesh: Mesh, one_layer: Any, h_aval: Any, pipelined: int, batch: int, limit: Any
    ) -> tuple[MicrobatchOption, tuple[MicrobatchOption, ...], Placement]:
        """NOTE [pipeline microbatches]: every option's figures, the one picked and its
        placement."""
        program = jax.make_jaxpr(self.layer)(one_layer, h_aval)

        def placement(count: int) -> Placement:
            axes = batch_axes(mesh, self.axis, program, batch // count, self.batch_over)
            shards = math.prod(int(mesh.shape[a]) for a in axes)
            return Placement(mesh, self.axis, axes, shards, self._tensor_axes(mesh, axes))

        stages = int(mesh.shape[self.axis])
        counts = (
            [self.microbatches]
            if self.microbatches is not None
            else [
                d
                for d in range(1, batch + 1)
                if batch % d == 0 and checks.runs(self.schedule, d, stages)
            ]
        )
        if not counts:
            checks.enough_microbatches(self.schedule, batch, stages, self.axis)
        saves = [self.saves] if self.saves is not None else list(Saves)
        costs = layer_costs(self.layer, one_layer, h_aval)
        table = microbatch_options(
            self.schedule, pipelined, stages, counts,
            lambda count: placement(count).shards, costs, saves,
        )  # fmt: skip
        best = pick(table, limit)
        return best, table, placement(best.microbatches)


@dataclasses.dataclass(frozen=True, eq=False)
class AutoPipelined:
    """The function :func:`pipeline` returns for ``axis=AUTO``: ``run(params, x)``,
    whose call decides whether and how it is pipelined (NOTE [pipeline decision]).
    Outside such a call it runs the plain scan; its ``plan`` and ``stage`` are those of
    the :class:`Pipelined` its call's decision runs (a ``ValueError`` where none does).

    Attributes:
        layer, microbatches, mesh, loss: as :func:`pipeline` took them.
        schedules: the schedules the call may choose among (without a given
            ``schedule``: gpipe and circular, with ``loss=`` every schedule).
        saves: what each step keeps (None: chosen with the microbatches).
    """

    layer: Callable[[Any, Any], Any]
    microbatches: int | None
    schedules: tuple[ScheduleKind, ...]
    mesh: Mesh | None = None
    saves: Saves | None = None
    loss: Callable[[Any, Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        _wraps(self, self.layer)

    def decided(self, decision: PipelineDecision) -> Pipelined | None:
        """This pipeline as ``decision`` runs it; None for the plain scan."""
        if decision.axis is None:
            return None
        kind = ScheduleKind(decision.schedule)
        return Pipelined(
            self.layer, decision.axis, self.microbatches, kind, self.mesh, self.saves, self.loss,
            decision.batch_axes,
        )  # fmt: skip

    def __call__(self, params: Any, x: Any, *head: Any) -> Any:
        """The plain scan's value on ``x`` (``params`` stacked: every leaf ``[layers,
        ...]``), pipelined as the enclosing call decided (outside one: the plain scan);
        with ``loss=``: ``run(params, x, head_params, targets)``, the batch's mean loss."""
        checks.call_arguments(self.loss, head)
        if isinstance(params, StagedParams):
            raise ValueError(
                f"{API}: axis=AUTO takes the stacked parameters (every leaf [layers, "
                "...]): staged ones are staged for one schedule and stage count, which "
                "the search chooses"
            )
        schedules = tuple(kind.value for kind in self.schedules)
        concrete = self.decided(enclosing_settings().pipeline)
        if concrete is None:
            mark(AutoPipelineSite(schedules))
            out = plain_scan(self.layer, params, x)
            return out if self.loss is None else self.loss(head[0], out, head[1])
        plan = concrete.plan(params, x, *head)
        mark(AutoPipelineSite(schedules, plan.schedule.microbatches))
        return concrete.run(plan, params, x, *head)

    def plan(
        self, params: Any, x: Any, head_params: Any = None, targets: Any = None
    ) -> PipelinePlan:
        """The plan of the pipeline the enclosing call's decision runs.

        Raises:
            ValueError: the body is traced under no decision to pipeline (outside a
                call, or the call chose the plain scan).
        """
        concrete = self.decided(enclosing_settings().pipeline)
        if concrete is None:
            raise ValueError(
                f"{API}: axis=AUTO: whether and how this stack is pipelined is chosen by "
                "the enclosing jit/pjit call, and here it runs the plain scan; the call's "
                "report says what it chose (Lowered.report().auto.choice.whole_plan)"
            )
        return concrete.plan(params, x, head_params, targets)

    def stage(self, stacked_params: Any) -> StagedParams:
        """Raises ``ValueError``: the stages are the enclosing call's choice."""
        del stacked_params
        raise ValueError(
            f"{API}: axis=AUTO: the stages are chosen by the enclosing call, so there is "
            "no one order to stage the parameters in; pass the stacked parameters"
        )


def _wraps(pipelined: Any, layer: Callable[..., Any]) -> None:
    """Give a (frozen) pipelined function its layer's name and docstring, as
    ``functools.wraps`` would."""
    for name in functools.WRAPPER_ASSIGNMENTS:
        if hasattr(layer, name):
            pipelined.__dict__[name] = getattr(layer, name)
    pipelined.__dict__["__wrapped__"] = layer


def _ranges(layers: Sequence[int]) -> str:
    if len(layers) > 1 and all(after - before == 1 for before, after in zip(layers, layers[1:])):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers))
