"""One compile per program across ``Lowered.compile()`` and calls, keyed on jax's settings.

``f.lower(x).compile()`` then ``f(x)`` (and the reverse) compile once, counted by
partitioner's ``compile`` event and by jax.monitoring's backend-compile event; a jax
setting that changes what is built (the optimization level, the default matmul
precision, a compile effort) compiles again, changing it back reuses the first
executable, and changing nothing never compiles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest

import partitioner
from partitioner import PartitionSpec as P
from tests.helpers import MESH_2D, arange, assert_close, mesh_ctx, named

pytestmark = pytest.mark.usefixtures("partitioner_mode")

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_backend_compiles = [0]


def _count_backend_compiles(event: str, duration: float, **_: Any) -> None:
    _backend_compiles[0] += event == BACKEND_COMPILE


jax.monitoring.register_event_duration_secs_listener(_count_backend_compiles)


@contextlib.contextmanager
def compiles() -> Iterator[dict[str, int]]:
    """Counts partitioner's compiles and jax's backend compiles inside the block."""
    out: dict[str, int] = {}
    before = _backend_compiles[0]
    with partitioner.recording() as events:
        yield out
    out["ours"] = events["compile"]
    out["jax"] = _backend_compiles[0] - before


def _body(x: Any, w: Any) -> Any:
    return jax.numpy.tanh(x @ w) * 2.0


X, W = arange(8, 8), arange(8, 4, start=-0.5)


def _doors() -> dict[str, Callable[[], Callable[[], Any]]]:
    """Each front door's function of (x, w) and how to call it, under MESH_2D."""

    def pjit_door() -> Callable[..., Any]:
        return partitioner.pjit(_body, (P("a", None), P(None, "b")), P("a"))

    def jit_door() -> Callable[..., Any]:
        mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
        return partitioner.jit(
            _body,
            in_shardings=(named(mesh, P("a", None)), named(mesh, P(None, "b"))),
            out_shardings=named(mesh, P("a")),
            compiler_options={"xla_embed_ir_in_executable": False},
        )

    def pmap_door() -> Callable[..., Any]:
        return partitioner.pmap(lambda x, w: jax.lax.psum(_body(x, w), "i"), "i", in_axes=(0, None))

    return {"pjit": pjit_door, "jit": jit_door, "pmap": pmap_door}


def _args(door: str) -> tuple[Any, Any]:
    return (arange(8, 2, 8), W) if door == "pmap" else (X, W)


@pytest.mark.parametrize("door", ["pjit", "jit", "pmap"])
@pytest.mark.parametrize(
    "aot_first", [True, False], ids=["lower-compile then call", "call then lower-compile"]
)
def test_aot_and_calls_compile_a_program_once(door: str, aot_first: bool) -> None:
    args = _args(door)
    want = jax.jit(_body)(*args) if door != "pmap" else None
    partitioner.clear_caches()
    with mesh_ctx(*MESH_2D), compiles() as n:
        f = _doors()[door]()
        if aot_first:
            compiled = f.lower(*args).compile()
            called = f(*args)
        else:
            called = f(*args)
            compiled = f.lower(*args).compile()
        from_aot = compiled(*args)
    assert n == {"ours": 1, "jax": 1}, n
    assert_close(from_aot, called)
    if want is not None:
        assert_close(called, want)


def test_explicit_options_equal_to_the_functions_share_its_executable() -> None:
    """``jit(..., compiler_options=o)`` and ``.compile(o)`` name the same program; other
    options are another one."""
    f = _doors()["jit"]()
    partitioner.clear_caches()
    with compiles() as n:
        f(X, W)
        f.lower(X, W).compile({"xla_embed_ir_in_executable": False})
    assert n["ours"] == 1, n
    with compiles() as n:
        f.lower(X, W).compile({"xla_embed_ir_in_executable": True})
    assert n["ours"] == 1, n
    with pytest.raises(TypeError, match="xla_embed_ir_in_executable"):
        f.lower(X, W).compile({"xla_embed_ir_in_executable": [True]})


@contextlib.contextmanager
def setting(name: str, value: Any) -> Iterator[None]:
    old = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, old)


#: Settings that change what is built; the first two are in jax's jit key, so a cached
#: call sees them too (docs/api.md, "One compile per program").
SETTINGS = [
    ("jax_optimization_level", "O1", True),
    ("jax_default_matmul_precision", "highest", True),
    ("jax_exec_time_optimization_effort", 0.5, False),
    ("jax_compiler_enable_remat_pass", False, False),
]


@pytest.mark.parametrize("name, value, calls_see_it", SETTINGS, ids=[s[0] for s in SETTINGS])
@pytest.mark.slow
def test_a_compile_affecting_setting_compiles_again(
    name: str, value: Any, calls_see_it: bool
) -> None:
    f = _doors()["jit"]()
    partitioner.clear_caches()
    with compiles() as first:
        before = f(X, W)
    assert first["ours"] == 1
    with compiles() as same:  # nothing changed: nothing compiled, either way in
        f(X, W)
        f.lower(X, W).compile()
    assert same == {"ours": 0, "jax": 0}, same
    with setting(name, value):
        with compiles() as changed:
            f.lower(X, W).compile()
        assert changed == {"ours": 1, "jax": 1}, changed
        with compiles() as call:  # that executable is the call's, if the call looks again
            after = f(X, W)
            f.lower(X, W).compile()
        assert call["ours"] == 0, call
    with compiles() as back:  # the setting restored: the first executable again
        f(X, W)
        f.lower(X, W).compile()
    assert back["ours"] == 0, back
    assert_close(after, before)
    if calls_see_it:  # a cached call re-dispatches on it (jax's jit key)
        partitioner.clear_caches()
        f(X, W)
        with setting(name, value), compiles() as call:
            f(X, W)
        assert call["ours"] == 1, call


def test_a_lowering_setting_the_jaxpr_does_not_show_compiles_again() -> None:
    """``jax_threefry_partitionable`` changes how ``random_bits`` lowers, not the jaxpr:
    an executable of the other setting would return other bits than jax.jit's."""
    f = partitioner.jit(lambda k: jax.random.bits(k, (16,)))
    key = jax.random.key(3)
    current = jax.config.jax_threefry_partitionable
    outs = []
    for flag in (current, not current, current):
        with setting("jax_threefry_partitionable", flag):
            want = np.asarray(jax.jit(lambda k: jax.random.bits(k, (16,)))(key))
            np.testing.assert_array_equal(np.asarray(f(key)), want)
            np.testing.assert_array_equal(np.asarray(f.lower(key).compile()(key)), want)
            outs.append(want)
    assert not np.array_equal(outs[0], outs[1])  # the setting does change the program


# --- one compile per signature through every front door, across re-plans ---


def _pjit_call(fresh: bool) -> tuple[object, object]:
    def body(v):
        return v * 2.0

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("i",))
    make = lambda: partitioner.pjit(body, P("i"), P("i"))  # noqa: E731
    f = make()

    def call(x: np.ndarray) -> object:
        with jax.set_mesh(mesh):
            return (make() if fresh else f)(x)

    return f, call


def _pmap_call(fresh: bool) -> tuple[object, object]:
    def body(v):
        return jax.lax.psum(v, "i") * 2.0

    make = lambda: partitioner.pmap(body, "i")  # noqa: E731
    f = make()
    return f, lambda x: (make() if fresh else f)(x)


def _nested_pmap_call(fresh: bool) -> tuple[object, object]:
    def inner(v):
        return jax.lax.psum(v, "j")

    def outer(v):
        return partitioner.pmap(inner, "j")(v) + jax.lax.psum(v, "i")

    make = lambda: partitioner.pmap(outer, "i")  # noqa: E731
    f = make()
    return f, lambda x: (make() if fresh else f)(x.reshape(4, 2, 3))


def _unnamed_pmap_call(fresh: bool) -> tuple[object, object]:
    def body(v):
        return v * 2.0

    # Classic jax.pmap's global cache: a fresh pmap of the same function traces it once.
    make = lambda: partitioner.pmap(body)  # noqa: E731
    f = make()
    return f, lambda x: (make() if fresh else f)(x)


def _jit_call(fresh: bool) -> tuple[object, object]:
    def body(v):
        return v * 2.0

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("i",))
    sharding = jax.sharding.NamedSharding(mesh, P("i"))
    make = lambda: partitioner.jit(body, in_shardings=sharding, out_shardings=sharding)  # noqa: E731
    f = make()
    return f, lambda x: (make() if fresh else f)(x)


FRONT_DOORS = {
    "pjit": _pjit_call,
    "jit": _jit_call,
    "pmap": _pmap_call,
    "unnamed pmap": _unnamed_pmap_call,
    "nested pmap": _nested_pmap_call,
}


@pytest.mark.parametrize("door", FRONT_DOORS)
@pytest.mark.parametrize("fresh", [False, True], ids=["same wrapper", "fresh wrapper"])
def test_one_compile_per_signature_across_replans(door: str, fresh: bool) -> None:
    """Re-planning a call (fast paths cleared by an options change, or a new wrapper)
    reuses its executable.

    The derived programs a front door builds (the pjit around a pmap region) are
    memoized on the traced body, so the executable cache, which holds programs
    weakly, sees the same program every time.
    """
    f, call = FRONT_DOORS[door](fresh)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    partitioner.clear_caches()
    with partitioner.recording() as counts:
        outs = []
        for _ in range(3):
            outs.append(np.asarray(call(x)))
            # Any options change clears every function's fast paths (not its traces).
            partitioner.options.set_fast_path(partitioner.options.fast_path_enabled())
    assert counts["compile"] == 1, dict(counts)
    assert counts["trace"] <= 1 + (door == "nested pmap"), dict(counts)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
