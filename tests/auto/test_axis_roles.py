"""The report and the search's log name, per mesh axis, what the chosen plan uses it for
and the nearest plan weighed that uses it otherwise (issue 54)."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.primitives.auto_choice import Candidate, Estimate, axis_choices
from partitioner._testing import Figures
from tests.auto.test_loop_safe import _state, _step

ROLES = {"data", "FSDP", "tensor parallel", "pipeline stages", "unused"}


def _candidate(time_s: float, **roles: str) -> Candidate:
    estimate = Estimate(time_s, time_s, 0.0, 0.0, 0.0, 0.0)
    return Candidate((), estimate, Figures(0.0, 0.0, time_s), tuple(roles.items()))


def test_the_nearest_other_plan_per_axis_is_the_fastest_that_uses_it_otherwise() -> None:
    chosen = _candidate(1.0, a="data", b="tensor parallel")
    others = [
        ("slow FSDP", _candidate(3.0, a="FSDP", b="tensor parallel")),
        ("fast FSDP", _candidate(1.5, a="FSDP", b="unused")),
        ("same", _candidate(1.1, a="data", b="tensor parallel")),
    ]
    a, b = axis_choices(chosen, others)
    assert (a.axis, a.role, a.runner_up, a.runner_up_role, a.slower) == (
        "a",
        "data",
        "fast FSDP",
        "FSDP",
        1.5,
    )
    assert (b.runner_up, b.runner_up_role) == ("fast FSDP", "unused")


def test_a_three_axis_choice_names_each_axis_in_the_report_and_the_log(mesh, caplog) -> None:
    mesh_3 = mesh((2, 2, 2), ("a", "b", "c"))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (16, 8)))
    partitioner.clear_caches()
    step = partitioner.jit(_step, in_shardings=(AUTO, NamedSharding(mesh_3, P("a"))))
    with caplog.at_level(logging.INFO, logger="partitioner"):
        report = step.lower(_state(), tokens).compile().report()
    choice = report.auto.choice
    assert [a.axis for a in choice.axes] == ["a", "b", "c"]
    assert choice.axes[0].role in {"data", "FSDP"}  # the batch is given over 'a'
    for a in choice.axes:
        assert a.role in ROLES and (not a.runner_up or a.runner_up_role != a.role), a
    assert "per mesh axis" in str(report) and "per mesh axis: 'a'" in caplog.text
