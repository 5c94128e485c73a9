"""An AUTO search says what it is doing: records on the "partitioner" logger as it goes, a
line of summary at the end, and a live line on a terminal when it runs long."""

from __future__ import annotations

import io
import logging

import jax
import jax.numpy as jnp
import numpy as np

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.auto.search import progress


def step(params, x):
    grads = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(params)
    return jax.tree.map(lambda a, b: a - 0.1 * b, params, grads)


def arguments():
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(64, 256)).astype(np.float32),
        "w2": rng.normal(size=(256, 64)).astype(np.float32),
    }
    return params, rng.normal(size=(32, 64)).astype(np.float32)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def search(mesh_4x2) -> partitioner.inspect.Report:
    partitioner.clear_caches()  # a search, not a choice kept from another test
    f = partitioner.pjit(lambda p, x: step(p, x), (AUTO, P("data")), AUTO)
    with jax.set_mesh(mesh_4x2):
        return f.lower(*arguments()).report()


def test_a_search_logs_what_it_measures_and_what_it_chose(mesh_4x2, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="partitioner"):
        report = search(mesh_4x2)
    messages = [r.getMessage() for r in caplog.records if r.name == "partitioner"]
    assert messages, "the search said nothing"
    assert "choosing the layouts of 2 AUTO leaves" in messages[0]
    assert any("the cost model scored" in m for m in messages)
    compiles = report.auto.choice.compiles
    measuring = [m for m in messages if "to measure it" in m]
    assert len(measuring) == compiles
    assert f"compiling {compiles} of {compiles}" in measuring[-1]
    assert all("s so far)" in m for m in messages[:-1])
    summary = messages[-1]
    assert "chose args[0]['w1']: P(" in summary and "args[0]['w2']: P(" in summary
    assert f"{compiles} compiles" in summary and "bytes per device" in summary


def test_a_long_search_draws_a_live_line_on_a_terminal_only(mesh_4x2, monkeypatch) -> None:
    monkeypatch.setattr(progress, "LIVE_AFTER_S", 0.0)
    terminal = Terminal()
    monkeypatch.setattr(progress, "STREAM", terminal)
    search(mesh_4x2)
    drawn = terminal.getvalue()
    assert "partitioner AUTO" in drawn and "\r" in drawn
    assert drawn.endswith("\r") and drawn.split("\r")[-2].strip() == ""  # cleared at the end

    quiet = Terminal()
    monkeypatch.setattr(progress, "STREAM", quiet)
    with partitioner.options.auto_progress(False):
        search(mesh_4x2)
    assert quiet.getvalue() == ""

    not_a_terminal = io.StringIO()
    monkeypatch.setattr(progress, "STREAM", not_a_terminal)
    search(mesh_4x2)
    assert not_a_terminal.getvalue() == ""


def test_outside_a_search_the_reporter_says_nothing() -> None:
    assert progress.current().api == ""
    progress.current().note("nothing %d", 1)  # says nothing, raises nothing
