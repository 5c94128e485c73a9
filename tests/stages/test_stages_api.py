"""The stages API with jax.jit's names and answers, side by side with jax.jit.

Each test builds the same program with ``pjit`` and ``jax.jit`` (same mesh,
same shardings) and compares what the two stages report: argument info and
trees, output info, the dialects of ``as_text``/``compiler_ir``, cost
analyses, compiler options, runtime executables and formats. Then the
observability jax users rely on: ``jax_log_compiles``,
``jax_explain_cache_misses``, ``jax.monitoring`` durations, ``cache_size``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit
from tests.helpers import MESH_2D, arange, assert_close, mesh_ctx, named


def _step(params: dict[str, Any], x: Any, scale: Any) -> dict[str, Any]:
    h = jnp.tanh(x @ params["w1"]) * scale
    return {"y": h @ params["w2"], "h": h, "x": x * 0.5}


PARAMS = {"w1": arange(4, 8, start=-0.4), "w2": arange(8, 2, start=-0.2)}
X = arange(8, 4)
IN_SPECS = ({"w1": None, "w2": P("b")}, P("a"), None)
OUT_SPECS = {"y": P("a"), "h": P("a", "b"), "x": P("a")}


def _pair(mesh: Mesh, **jit_kwargs: Any) -> tuple[Any, Any]:
    """The same program as a pjit and as a jax.jit over ``mesh``."""
    ours = pjit(_step, IN_SPECS, OUT_SPECS, **jit_kwargs)
    theirs = jax.jit(
        _step,
        in_shardings=jax.tree.map(
            lambda s: named(mesh, s), IN_SPECS, is_leaf=lambda s: s is None or isinstance(s, P)
        ),
        out_shardings={k: named(mesh, s) for k, s in OUT_SPECS.items()},
        **jit_kwargs,
    )
    return ours, theirs


@pytest.fixture
def lowered_pair() -> Iterator[tuple[Any, Any, Mesh]]:
    with mesh_ctx(*MESH_2D) as mesh:
        ours, theirs = _pair(mesh, donate_argnums=1)
        yield ours.lower(PARAMS, X, 2.0), theirs.lower(PARAMS, X, 2.0), mesh


def test_lowered_describes_its_arguments_as_jax_jit(lowered_pair: Any) -> None:
    ours, theirs, _ = lowered_pair
    assert ours.in_tree == theirs.in_tree and ours.out_tree == theirs.out_tree
    assert ours.args_info == theirs.args_info  # jax.stages.ArgInfo: aval and donation
    assert ours.donate_argnums == theirs.donate_argnums == (2,)
    described = lambda avals: [(a.shape, a.dtype, a.weak_type) for a in jax.tree.leaves(avals)]  # noqa: E731
    assert described(ours.in_avals) == described(theirs.in_avals)
    ours_out = jax.tree.leaves(ours.out_info)
    theirs_out = jax.tree.leaves(theirs.out_info)
    assert [(o.shape, o.dtype) for o in ours_out] == [(t.shape, t.dtype) for t in theirs_out]


def test_lowered_text_and_ir_in_both_dialects(lowered_pair: Any) -> None:
    ours, theirs, _ = lowered_pair
    for dialect in (None, "stablehlo"):
        assert "stablehlo.dot_general" in ours.as_text(dialect)
        assert type(ours.compiler_ir(dialect)) is type(theirs.compiler_ir(dialect))
    hlo = ours.as_text("hlo")
    assert hlo.startswith("HloModule pjit__step") and "dot(" in hlo
    assert type(ours.compiler_ir("hlo")) is type(theirs.compiler_ir("hlo"))
    assert "loc(" in ours.as_text(debug_info=True) and "loc(" not in ours.as_text()
    for bad in ("mhlo", "HLO"):
        with pytest.raises(ValueError, match="'stablehlo' or 'hlo'"):
            ours.as_text(bad)
        with pytest.raises(ValueError, match="'stablehlo' or 'hlo'"):
            ours.compiler_ir(bad)


def test_lowered_names_arguments_and_results_by_pytree_path(lowered_pair: Any) -> None:
    ours, theirs, _ = lowered_pair
    text = ours.as_text()
    for name in ("params['w1']", "params['w2']", "x", "scale"):
        assert f'jax.arg_info = "{name}"' in text  # beyond jax.jit: visible without debug info
    for name in ("result['h']", "result['x']", "result['y']"):
        assert f'jax.result_info = "{name}"' in text
        assert f'jax.result_info = "{name}"' in theirs.as_text()  # jax.jit's own result names
    assert "params__w1__" in ours.as_text("hlo")  # XLA names the parameter after it


def test_lowered_cost_analysis_is_jax_jits(lowered_pair: Any) -> None:
    ours, theirs, _ = lowered_pair
    got, want = ours.cost_analysis(), theirs.cost_analysis()
    assert isinstance(got, dict) and got["flops"] == want["flops"] > 0


def test_compiled_describes_itself_as_jax_jit(lowered_pair: Any) -> None:
    ours_l, theirs_l, mesh = lowered_pair
    ours, theirs = ours_l.compile(), theirs_l.compile()
    assert ours.in_tree == theirs.in_tree and ours.out_tree == theirs.out_tree
    assert ours.args_info == theirs.args_info
    assert type(ours.runtime_executable()) is type(theirs.runtime_executable())
    assert jax.tree.structure(ours.input_formats) == jax.tree.structure(theirs.input_formats)
    for got, want in zip(
        jax.tree.leaves(ours.input_formats), jax.tree.leaves(theirs.input_formats), strict=True
    ):
        assert got.layout == want.layout
        assert got.sharding.is_equivalent_to(want.sharding, len(got.layout.major_to_minor))
    for got, want in zip(
        jax.tree.leaves(ours.output_formats), jax.tree.leaves(theirs.output_formats), strict=True
    ):
        assert got.layout == want.layout
    flops = ours.cost_analysis()["flops"]
    assert flops == pytest.approx(theirs.cost_analysis()["flops"], rel=0.05)
    x = jax.device_put(X, named(mesh, P("a")))
    assert_close(ours(PARAMS, x, 2.0), theirs(PARAMS, jnp.array(X), 2.0))


def test_compiler_options_as_jax_jit(lowered_pair: Any) -> None:
    ours, theirs, mesh = lowered_pair
    partitioner.clear_caches()  # an earlier test's compile of the same program is shared
    with partitioner.recording() as events:
        first, again = ours.compile(), ours.compile()  # kept, as jax.jit's Lowered keeps it
        assert first.runtime_executable() is again.runtime_executable()
        ours.compile({"xla_embed_ir_in_executable": False})  # options: compiled anew
    assert events["compile"] == 2
    compiled = ours.compile(compiler_options={"xla_embed_ir_in_executable": True})
    x = jax.device_put(X, named(mesh, P("a")))
    assert_close(compiled(PARAMS, x, 2.0), theirs.compile()(PARAMS, X, 2.0))
    effort = ours.compile({"exec_time_optimization_effort": 0.5})  # a build option
    assert effort.runtime_executable() is not None
    for bad in ({"no_such_xla_option": 1}, {"xla_cpu_enable_fast_math": "maybe"}):
        with pytest.raises(jax.errors.JaxRuntimeError) as ours_error:
            ours.compile(compiler_options=bad)
        with pytest.raises(jax.errors.JaxRuntimeError) as theirs_error:
            theirs.compile(compiler_options=bad)
        assert str(ours_error.value) == str(theirs_error.value)
    with pytest.raises(TypeError, match="compiler_options must be a dict"):
        ours.compile(compiler_options=[("xla_embed_ir_in_executable", True)])
    with pytest.raises(ValueError, match="device_assignment must match"):
        ours.compile(device_assignment=jax.devices()[:2])
    assert ours.compile(device_assignment=list(mesh.devices.flat)).runtime_executable()


def test_trace_gives_jax_jits_traced_stage() -> None:
    with mesh_ctx(*MESH_2D) as mesh:
        ours, theirs = _pair(mesh)
        traced, reference = ours.trace(PARAMS, X, 2.0), theirs.trace(PARAMS, X, 2.0)
        assert str(traced.jaxpr) == str(reference.jaxpr)
        assert traced.args_info == reference.args_info
        assert traced.in_tree == reference.in_tree and traced.out_tree == reference.out_tree
        assert traced.out_avals == reference.out_avals
        assert traced.fun_name == reference.fun_name == "_step"
        assert traced.lower().as_text() == ours.lower(PARAMS, X, 2.0).as_text()


def test_pmap_stages_answer_the_same() -> None:
    f = partitioner.pmap(lambda x: jax.lax.psum(x * 2.0, "i"), "i")
    xs = arange(8, 3)
    lowered = f.lower(xs)
    reference = jax.pmap(lambda x: jax.lax.psum(x * 2.0, "i"), "i").lower(xs)
    assert lowered.in_tree == reference.in_tree and lowered.out_tree == reference.out_tree
    assert [a.shape for a in jax.tree.leaves(lowered.args_info)] == [(8, 3)]
    assert "all-reduce" in lowered.as_text("hlo")
    assert f.trace(xs).jaxpr is not None
    compiled = lowered.compile()
    assert type(compiled.runtime_executable()) is type(reference.compile().runtime_executable())
    assert jax.tree.leaves(compiled.input_formats)[0].layout.major_to_minor == (0, 1)
    assert_close(compiled(xs), jax.pmap(lambda x: jax.lax.psum(x * 2.0, "i"), "i")(xs))


# --- observability ---


def test_log_compiles_logs_each_compile_with_name_shapes_and_call_site(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with mesh_ctx(*MESH_2D), jax.log_compiles(True):
        f = pjit(lambda v: v * 3.0, P("a"), P("a"))
        with caplog.at_level(logging.WARNING):
            f(np.ones((8, 2), np.float32))
            f(np.ones((8, 2), np.float32))  # cached: no second compile
    compiling = [r.getMessage() for r in caplog.records if "Compiling pjit_" in r.getMessage()]
    assert len(compiling) == 1
    (line,) = compiling
    assert "pjit_<lambda>" in line and "float32[8,2]" in line
    assert f"test_stages_api.py:{_line_of('f(np.ones((8, 2), np.float32))')}" in line
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "Finished XLA compilation of pjit_<lambda>" in messages
    assert "Finished jaxpr to MLIR module conversion pjit_<lambda>" in messages


def _line_of(code: str) -> int:
    """The first line of this file holding ``code`` (the call site the log must name)."""
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if code in line and "(" in line)


def test_explain_cache_misses_names_what_changed(caplog: pytest.LogCaptureFixture) -> None:
    def body(params: Any, n: int, x: Any) -> Any:
        return x * n + params["b"]

    params = {"b": np.ones((), np.float32)}
    with mesh_ctx(*MESH_2D) as mesh, jax.explain_cache_misses(True):
        f = pjit(body, static_argnums=1)  # omitted specs: a committed layout is kept
        with caplog.at_level(logging.WARNING):
            f(params, 1, np.ones((8,), np.float32))
            f(params, 1, np.ones((4,), np.float32))
            f(params, 2, np.ones((4,), np.float32))
            f(params, 2, np.ones((4,), np.int32))
            f(params, 2, jax.device_put(np.ones((4,), np.int32), named(mesh, P())))
            f(params, 2, jax.device_put(np.ones((4,), np.int32), named(mesh, P("a"))))
            f(params, 2, np.ones((4,), np.int32))  # a hit: nothing to explain
            with jax.numpy_rank_promotion("raise"):
                f(params, 2, np.ones((4,), np.int32))
    misses = [r.getMessage() for r in caplog.records if "TRACING CACHE MISS" in r.getMessage()]
    assert len(misses) == 7
    assert "never seen function" in misses[0] and "body defined at" in misses[0]
    assert "at x, shape now (4,) and before (8,)" in misses[1]
    assert "at static argument n, now 2 and before 1" in misses[2]
    assert "at x, dtype now int32 and before float32" in misses[3]
    assert "at x," in misses[5]  # against the closest key seen: its type or its sharding
    assert "jax_numpy_rank_promotion differs: now raise and before allow" in misses[6]


def test_monitoring_sees_trace_lower_and_compile_durations() -> None:
    seen: collections.Counter[str] = collections.Counter()

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if kwargs.get("fun_name", "").endswith("scaled"):
            seen[event] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:

        def scaled(v: Any) -> Any:
            return v * 5.0

        with mesh_ctx(*MESH_2D):
            pjit(scaled, P("a"), P("a"))(np.ones((8,), np.float32))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert seen["/jax/core/compile/jaxpr_trace_duration"] == 1
    assert seen["/jax/core/compile/jaxpr_to_mlir_module_duration"] == 1
    assert seen["/jax/core/compile/backend_compile_duration"] == 1


def test_cache_size_and_clear_cache() -> None:
    with mesh_ctx(*MESH_2D):
        f = pjit(lambda v: v + 1.0, None, None)
        assert f.cache_size() == 0
        f(np.ones((2,), np.float32))
        f(np.ones((2,), np.float32))
        assert f.cache_size() == 1
        f(np.ones((3,), np.float32))
        assert f.cache_size() == 2
        f.clear_cache()
        assert f.cache_size() == 0
        assert_close(f(np.ones((3,), np.float32)), np.full((3,), 2.0, np.float32))
    g = partitioner.pmap(lambda v: v * 2.0)
    g(np.ones((8, 2), np.float32))
    assert g.cache_size() == 1
