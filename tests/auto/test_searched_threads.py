"""Choices made in several threads at once (NOTE [choices in flight]): a caller waits only
for the same key's choice, never for another key's, however long that one takes.

Every wait here is bounded: a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.auto import resolve, searched
from partitioner.testing.plugin import MeshFactory

from ..pipeline.test_pipeline import STACK, batch, layer, stacked_params

#: Seconds a thread that should finish at once is given (a whole suite may share the CPUs).
PROMPT = 30.0


class Caller(threading.Thread):
    """``fn()`` in a thread: its value or its error kept for the test to read."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as error:  # noqa: BLE001  # read by the test
            self.error = error

    def finished(self, timeout: float = PROMPT) -> bool:
        self.join(timeout)
        return not self.is_alive()


class Blocking:
    """A ``choose`` that says it started and returns ``value`` (or raises ``error``) only
    once released; its calls counted."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.calls = value, error, 0
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> Any:
        self.calls += 1
        self.started.set()
        assert self.release.wait(PROMPT), "never released"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture(autouse=True)
def _fresh_choices():
    searched.clear()
    yield
    searched.clear()


def test_another_keys_choice_does_not_wait_on_a_choice_in_flight() -> None:
    """One lock held through every choose() made a second thread's unrelated choice wait
    out the first's whole search."""
    slow = Blocking(value="a")
    first = Caller(lambda: searched.once(("a",), slow))
    first.start()
    try:
        assert slow.started.wait(PROMPT)
        other = Caller(lambda: searched.once(("b",), lambda: "b"))
        other.start()
        assert other.finished(), "a choice of another key waited on the one in flight"
        assert other.value == "b" and first.is_alive()
    finally:
        slow.release.set()
    assert first.finished() and first.value == "a"
    assert searched.size() == 2


def test_a_second_caller_of_the_same_key_waits_and_takes_the_same_value() -> None:
    slow = Blocking(value=object())
    first = Caller(lambda: searched.once(("a",), slow))
    first.start()
    assert slow.started.wait(PROMPT)
    second = Caller(lambda: searched.once(("a",), lambda: pytest.fail("chosen twice")))
    second.start()
    assert not second.finished(timeout=0.2), "it did not wait for the choice in flight"
    slow.release.set()
    assert first.finished() and second.finished()
    assert first.value is slow.value and second.value is slow.value and second.error is None
    assert slow.calls == 1


def test_an_error_in_choose_is_not_kept_and_its_waiters_choose_again() -> None:
    failing = Blocking(error=ValueError("no layout fits"))
    first = Caller(lambda: searched.once(("a",), failing))
    first.start()
    assert failing.started.wait(PROMPT)
    second = Caller(lambda: searched.once(("a",), lambda: "made by the waiter"))
    second.start()
    assert not second.finished(timeout=0.2)
    failing.release.set()
    assert first.finished() and second.finished(), "a waiter hung on a choice that raised"
    assert isinstance(first.error, ValueError)
    assert second.error is None and second.value == "made by the waiter"
    assert searched.once(("a",), lambda: "again") == "made by the waiter"


def test_a_choice_may_make_another_and_ask_for_its_own_key_in_the_same_thread() -> None:
    """A search tracing a pipeline makes the pipeline's choice inside its own."""

    def outer() -> tuple[str, str]:
        inner = searched.once(("inner",), lambda: "inner")
        again = searched.once(("outer",), lambda: "computed in place")
        return inner, again

    done = Caller(lambda: searched.once(("outer",), outer))
    done.start()
    assert done.finished(), "a thread waited on its own choice"
    assert done.value == ("inner", "computed in place")
    assert searched.once(("inner",), lambda: "not kept") == "inner"


def test_two_threads_whose_choices_need_each_others_do_not_deadlock() -> None:
    """Thread 1 making A asks for B while thread 2 making B asks for A: the one that
    would close the circle makes the other's choice itself instead of waiting."""
    started = {"a": threading.Event(), "b": threading.Event()}

    def making(mine: str, theirs: str) -> Callable[[], str]:
        def choose() -> str:
            started[mine].set()
            assert started[theirs].wait(PROMPT), "the other choice never started"
            searched.once((theirs,), lambda: f"{theirs} made by {mine}'s thread")
            return mine

        return lambda: searched.once((mine,), choose)

    one, two = Caller(making("a", "b")), Caller(making("b", "a"))
    one.start()
    two.start()
    assert one.finished() and two.finished(), "deadlock"
    assert (one.error, two.error) == (None, None)
    assert (one.value, two.value) == ("a", "b")
    assert searched.once(("a",), str) == "a" and searched.once(("b",), str) == "b"


def test_clear_during_a_choice_in_flight_forgets_it_without_waiting() -> None:
    slow = Blocking(value="old")
    first = Caller(lambda: searched.once(("a",), slow))
    first.start()
    try:
        assert slow.started.wait(PROMPT)
        clearing = Caller(searched.clear)
        clearing.start()
        assert clearing.finished(), "clear() waited on a choice in flight"
        # the key is forgotten: a caller now makes it anew instead of waiting
        anew = Caller(lambda: searched.once(("a",), lambda: "new"))
        anew.start()
        assert anew.finished() and anew.value == "new"
    finally:
        slow.release.set()
    assert first.finished() and first.value == "old"  # its caller still gets it
    assert searched.size() == 1 and searched.once(("a",), str) == "new"  # not kept


def test_a_pipelines_choice_is_made_while_another_threads_auto_search_runs(
    mesh: MeshFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53: a thread lowering a small pipeline whose microbatches are chosen waited
    out another thread's whole AUTO search (3.5 s against 0.08 s alone)."""
    search = resolve._search
    in_search, release = threading.Event(), threading.Event()

    def held_search(*args: Any) -> Any:
        in_search.set()
        assert release.wait(PROMPT * 4), "never released"
        return search(*args)

    monkeypatch.setattr(resolve, "_search", held_search)
    partitioner.clear_caches()
    w, x = jnp.ones((64, 32)), jnp.ones((16, 64))
    auto = partitioner.pjit(
        lambda w, x: jnp.tanh(x @ w), in_axis_resources=(AUTO, P("data")), out_axis_resources=AUTO
    )
    params, (h, _) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage")  # microbatches chosen
    piped = partitioner.pjit(run, in_axis_resources=(STACK, P("data")), out_axis_resources=None)

    def searching() -> Any:
        with jax.set_mesh(mesh((4, 2), ("data", "model"))):
            return auto.lower(w, x).report().auto

    def pipelining() -> Any:
        with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
            piped.lower(params, h)
            return run.plan(params, h)

    one = Caller(searching)
    one.start()
    try:
        assert in_search.wait(PROMPT * 4)
        two = Caller(pipelining)
        two.start()
        assert two.finished(PROMPT * 4), "the pipeline's choice waited on the AUTO search"
        assert two.error is None and two.value.chosen
        assert one.is_alive()  # still searching
    finally:
        release.set()
    assert one.finished(PROMPT * 4) and one.error is None and one.value is not None
