"""AUTO specs: partitioner's choice against hand layouts, judged by its own report.

Every comparison reads XLA's figures for the compiled programs (the report's
collectives and memory analysis); every numeric result is compared with jax.jit
on the same inputs.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import partitioner
from benchmarks import models
from partitioner import AUTO
from partitioner import PartitionSpec as P
from partitioner._src.auto.search import confirm
from partitioner.testing.plugin import MeshFactory

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

BATCH = (P("data"), P("data"))


# --- the programs: a 2-layer MLP and a transformer block, each a train step ---


def mlp_params(d: int = 128, f: int = 512) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "w1": jax.random.normal(k1, (d, f)) / math.sqrt(d),
        "b1": jnp.zeros((f,)),
        "w2": jax.random.normal(k2, (f, d)) / math.sqrt(f),
    }


def mlp_loss(p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return jnp.mean((models.mlp(p, x) - y) ** 2)


MLP_MEGATRON = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}


def block_params() -> dict[str, jax.Array]:
    """The parameters of bench_auto's parameter-heavy block (benchmarks/models.py).

    ``block_loss`` is that block with its own spelling of the norm and mask (-1e9), kept
    as this test's program (NOTE [three spellings of layer norm] in models.py)."""
    return models.block_params(models.Dims(model=256, ff=1024))


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * scale


def block_loss(
    p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array], heads: int = 4
) -> jax.Array:
    x, y = batch
    b, s, m = x.shape
    h = _norm(x, p["ln1"])
    q, k, v = ((h @ p[w]).reshape(b, s, heads, m // heads) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(m // heads)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(b, s, m)
    x = x + attn @ p["wo"]
    out = x + jax.nn.gelu(_norm(x, p["ln2"]) @ p["w1"]) @ p["w2"]
    return jnp.mean((out - y) ** 2)


BLOCK_MEGATRON = {
    "ln1": P(), "wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"),
    "wo": P("model", None), "ln2": P(), "w1": P(None, "model"), "w2": P("model", None),
}  # fmt: skip


def batch_of(shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    return models.batch(shape, jax.random.key(2))


def sgd_step(loss):
    def step(params, batch):
        loss_value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss_value

    return step


PROGRAMS = {
    "mlp": (mlp_loss, mlp_params, (512, 128), MLP_MEGATRON),
    "block": (block_loss, block_params, (8, 16, 256), BLOCK_MEGATRON),
}


def figures(mesh, step, params, batch, specs, **kw):
    """(collective bytes, memory, report) of ``step`` with params laid out by ``specs``."""
    f = partitioner.pjit(
        step, in_axis_resources=(specs, BATCH), out_axis_resources=(specs, P()), **kw
    )
    with jax.set_mesh(mesh):
        report = f.lower(params, batch).report()
    return (
        report.collective_bytes,
        report.memory.total,
        report,
    )


@functools.cache
def measure(name: str, mesh: Mesh) -> dict[str, Any]:
    """Program ``name``'s figures over ``mesh`` laid out by hand, replicated and by AUTO
    (once per run: the searches and compiles are most of these tests' time)."""
    loss, make, shape, hand = PROGRAMS[name]
    params, batch = make(), batch_of(shape)
    step = sgd_step(loss)
    replicated = jax.tree.map(lambda _: P(), hand)
    return {
        "step": step,
        "params": params,
        "batch": batch,
        "hand": figures(mesh, step, params, batch, hand),
        "replicated": figures(mesh, step, params, batch, replicated),
        "auto": figures(mesh, step, params, batch, AUTO),
    }


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program_name(request) -> str:
    """Module-scoped, so the tests of one program run one after another."""
    return request.param


@pytest.fixture
def program(program_name, mesh_4x2):
    return measure(program_name, mesh_4x2)


def test_auto_moves_no_more_bytes_and_uses_no_more_memory_than_megatron(program):
    hand_bytes, hand_memory, _ = program["hand"]
    auto_bytes, auto_memory, report = program["auto"]
    _, replicated_memory, _ = program["replicated"]
    assert auto_bytes <= hand_bytes, str(report)
    assert auto_memory <= hand_memory, str(report)
    assert auto_memory < replicated_memory, str(report)
    # The report's own figures for this program are what the test read.
    assert report.auto.collective_bytes == auto_bytes
    assert report.auto.memory_bytes == auto_memory


def test_auto_training_matches_jax_jit(program, mesh_4x2):
    step, params, batch = program["step"], program["params"], program["batch"]
    f = partitioner.pjit(step, in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P()))
    ref = jax.jit(step)
    ours, theirs = params, params
    with jax.set_mesh(mesh_4x2):
        for _ in range(3):
            ours, loss = f(ours, batch)
            theirs, ref_loss = ref(theirs, batch)
            np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), ours, theirs)
    # The results are laid out as the report says was chosen.
    chosen = program["auto"][2].auto.choice
    for path, spec in zip(chosen.out_paths, chosen.out_specs, strict=True):
        assert str(ours[path.split("'")[1]].sharding.spec) == spec


def test_auto_fits_a_memory_limit_below_megatron(program, mesh_4x2):
    step, params, batch = program["step"], program["params"], program["batch"]
    _, hand_memory, _ = program["hand"]
    limit = int(hand_memory * 0.9)
    _, memory, report = figures(mesh_4x2, step, params, batch, AUTO, auto_memory_limit=limit)
    assert memory <= limit, str(report)
    assert report.auto.choice.memory_limit == limit


def test_a_limit_nothing_fits_names_the_smallest_layout(mesh_4x2):
    params, batch = mlp_params(), batch_of((512, 128))
    f = partitioner.pjit(
        sgd_step(mlp_loss), in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P()),
        auto_memory_limit=1000,
    )  # fmt: skip
    with jax.set_mesh(mesh_4x2), pytest.raises(ValueError, match="auto_memory_limit=1,000") as e:
        f.lower(params, batch)
    assert "the smallest found" in str(e.value) and "args[0]['w1']" in str(e.value)


def test_the_report_has_the_auto_table(mesh_4x2):
    params, batch = mlp_params(), batch_of((512, 128))
    _, _, report = figures(mesh_4x2, sgd_step(mlp_loss), params, batch, AUTO)
    choice = report.auto.choice
    assert choice.paths == ("args[0]['b1']", "args[0]['w1']", "args[0]['w2']")
    assert (
        len(choice.runners_up) >= 1
        and choice.compiles >= 1
        and choice.evaluations > choice.compiles
    )
    assert choice.chosen.measured_collective_bytes == report.auto.collective_bytes
    text = str(report)
    assert (
        "auto: 3 AUTO inputs chosen" in text and "runner-up 1" in text and "XLA coll. bytes" in text
    )
    assert '"auto"' in report.to_json()


def test_one_search_per_signature_across_threads(mesh_4x2):
    params, batch = mlp_params(), batch_of((512, 128))
    f = partitioner.pjit(
        sgd_step(mlp_loss), in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P())
    )
    errors: list[BaseException] = []

    def lower() -> None:
        try:
            with jax.set_mesh(mesh_4x2):
                f.lower(params, batch)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    partitioner.clear_caches()
    with partitioner.recording() as events:
        threads = [threading.Thread(target=lower) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with jax.set_mesh(mesh_4x2):
            f(params, batch)[1].block_until_ready()
    assert not errors
    assert events["auto_search"] == 1


def test_auto_leaves_mix_with_given_specs_and_the_jit_spelling(mesh_4x2):
    params, batch = mlp_params(), batch_of((512, 128))
    step = sgd_step(mlp_loss)
    specs = {"w1": AUTO, "b1": P(), "w2": AUTO}
    f = partitioner.jit(
        step,
        in_shardings=(specs, tuple(NamedSharding(mesh_4x2, s) for s in BATCH)),
        out_shardings=(AUTO, None),
    )
    with jax.set_mesh(mesh_4x2):
        lowered = f.lower(params, batch)
        new, loss = f(params, batch)
    choice = lowered.report().auto.choice
    assert choice.paths == ("args[0]['w1']", "args[0]['w2']")
    assert choice.out_paths == ("out[0]['b1']", "out[0]['w1']", "out[0]['w2']")
    for path, spec in zip(choice.out_paths, choice.out_specs, strict=True):
        assert str(new[path.split("'")[1]].sharding.spec) == spec
    # An AUTO output takes the layout of the input at its path, given or chosen.
    assert new["b1"].sharding.spec in (P(), P(None))
    assert choice.out_specs[1:] == choice.chosen.specs
    ref_new, ref_loss = jax.jit(step)(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), new, ref_new)


def test_grad_and_vmap_compose_with_auto(mesh_4x2):
    w = jax.random.normal(jax.random.key(3), (64, 32))
    x = jax.random.normal(jax.random.key(4), (16, 64))
    f = partitioner.pjit(
        lambda w, x: jnp.tanh(x @ w), in_axis_resources=(AUTO, P("data")), out_axis_resources=AUTO
    )
    g = lambda w, x: jnp.sum(f(w, x) ** 2)  # noqa: E731
    with jax.set_mesh(mesh_4x2):
        ours = jax.grad(g)(w, x)
        batched = jax.vmap(f, in_axes=(None, 0))(w, jnp.stack([x, 2 * x]))
    ref = jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2))(w, x)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batched[1], jnp.tanh(2 * x @ w), rtol=1e-5, atol=1e-5)


def test_a_committed_argument_laid_out_otherwise_is_an_error_as_for_any_spec(mesh_4x2):
    params, batch = mlp_params(), batch_of((512, 128))
    f = partitioner.pjit(
        sgd_step(mlp_loss), in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P())
    )
    with jax.set_mesh(mesh_4x2):
        chosen = f.lower(params, batch).report().auto.choice.chosen.specs
    assert chosen[1] != "P()"  # w1 is split, so a replicated committed w1 is laid out otherwise
    committed = dict(params, w1=jax.device_put(params["w1"], NamedSharding(mesh_4x2, P())))
    with jax.set_mesh(mesh_4x2), pytest.raises(ValueError, match=r"argument params\['w1'\]"):
        f(committed, batch)


def test_bad_auto_input_is_a_clear_error(mesh_4x2):
    with pytest.raises(TypeError, match="auto_memory_limit must be a positive int"):
        partitioner.pjit(lambda x: x, in_axis_resources=AUTO, auto_memory_limit=1.5)
    with pytest.raises(TypeError, match="auto_memory_limit must be a positive int"):
        partitioner.jit(lambda x: x, auto_memory_limit=-1)
    with (
        jax.set_mesh(mesh_4x2),
        pytest.raises(TypeError, match="AUTO is a layout partitioner chooses"),
    ):
        partitioner.with_sharding_constraint(jnp.ones(8), AUTO)
    f = partitioner.pjit(lambda x: x * 2, in_axis_resources=AUTO, out_axis_resources=AUTO)
    with pytest.raises(
        RuntimeError, match="requires a non-empty mesh in context"
    ):  # as for any spec
        f(jnp.ones(8))


def test_on_explicit_axes_auto_splits_only_over_auto_axes(mesh: MeshFactory):
    """An Explicit axis is part of the traced types: AUTO leaves are split over the
    Auto axes only, and the results are the types' layouts."""
    from jax.sharding import AxisType

    m = mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    w = jax.random.normal(jax.random.key(0), (64, 32))
    x = jax.random.normal(jax.random.key(1), (16, 64))
    f = partitioner.pjit(
        lambda w, x: jnp.tanh(x @ w), in_axis_resources=(AUTO, P("data")), out_axis_resources=AUTO
    )
    with jax.set_mesh(m):
        xs = jax.device_put(x, NamedSharding(m, P("data")))
        choice = f.lower(w, xs).report().auto.choice
        y = f(w, xs)
    assert "data" not in choice.chosen.specs[0]
    np.testing.assert_allclose(y, jnp.tanh(x @ w), rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_command_line_takes_auto(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "mymodel.py").write_text(
        "import jax.numpy as jnp\n\ndef step(x, w):\n    return jnp.tanh(x @ w)\n"
    )
    env = dict(
        os.environ, PYTHONPATH=str(tmp_path), XLA_FLAGS="--xla_force_host_platform_device_count=8"
    )
    command = [
        sys.executable, "-m", "partitioner.inspect", "mymodel:step", "--mesh", "data=4,model=2",
        "--arg", "f32[64,256]", "--in", "P('data')", "--arg", "f32[256,512]", "--in", "AUTO",
        "--out", "AUTO",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "auto: 1 AUTO inputs chosen" in done.stdout and "args[1]" in done.stdout


def test_both_partitioners_choose_and_run(partitioner_mode, mesh_4x2):
    """The search compiles its finalists with the partitioner in effect, and keys its
    cache on it: each partitioner gets its own choice, checked against XLA's figures."""
    params, batch = mlp_params(), batch_of((512, 128))
    hand_bytes, hand_memory, _ = figures(mesh_4x2, sgd_step(mlp_loss), params, batch, MLP_MEGATRON)
    auto_bytes, auto_memory, report = figures(mesh_4x2, sgd_step(mlp_loss), params, batch, AUTO)
    assert report.partitioner == {"gspmd": "GSPMD", "shardy": "Shardy"}[partitioner_mode]
    assert auto_bytes <= hand_bytes and auto_memory <= hand_memory, str(report)
    f = partitioner.pjit(
        sgd_step(mlp_loss), in_axis_resources=(AUTO, BATCH), out_axis_resources=(AUTO, P())
    )
    with jax.set_mesh(mesh_4x2):
        _, loss = f(params, batch)
    np.testing.assert_allclose(loss, jax.jit(sgd_step(mlp_loss))(params, batch)[1], rtol=1e-5)


def test_a_body_closing_over_an_outer_tracer_is_chosen_by_the_model_alone(mesh_4x2):
    """Under jax.grad of an enclosing function the body closes over a tracer: it cannot
    be lowered alone, so the model's estimates decide (no XLA compile during the search)."""
    w = jax.random.normal(jax.random.key(0), (64, 32))
    x = jax.random.normal(jax.random.key(1), (16, 64))

    def outer(s):
        f = partitioner.pjit(
            lambda w, x: jnp.tanh(x @ (w * s)),
            in_axis_resources=(AUTO, P("data")),
            out_axis_resources=AUTO,
        )
        return f(w, x).sum()

    searches: list[dict] = []
    remove = partitioner.add_listener(
        lambda event, info: searches.append(info) if event == "auto_search" else None
    )
    try:
        with jax.set_mesh(mesh_4x2):
            ours = jax.grad(outer)(2.0)
    finally:
        remove()
    assert searches and all(info["compiles"] == 0 for info in searches)
    assert all(info["evaluations"] >= 1 for info in searches)
    ref = jax.grad(lambda s: jnp.tanh(x @ (w * s)).sum())(2.0)
    np.testing.assert_allclose(ours, ref, rtol=1e-4)


def test_a_pjit_with_auto_inside_another(mesh_4x2):
    """The inner call's search runs while the outer body is traced; the outer's after."""
    w = jax.random.normal(jax.random.key(0), (64, 32))
    x = jax.random.normal(jax.random.key(1), (16, 64))
    inner = partitioner.pjit(
        lambda w, x: jnp.tanh(x @ w), in_axis_resources=(AUTO, P("data")), out_axis_resources=AUTO
    )
    outer = partitioner.pjit(
        lambda w, x: inner(w, x) * 2, in_axis_resources=(AUTO, P("data")), out_axis_resources=AUTO
    )
    partitioner.clear_caches()  # the inner body's choice may be cached by an earlier test
    with jax.set_mesh(mesh_4x2), partitioner.recording() as events:
        y = outer(w, x)
    assert events["auto_search"] == 2
    np.testing.assert_allclose(y, 2 * jnp.tanh(x @ w), rtol=1e-5, atol=1e-5)


def test_with_an_auto_batch_data_parallelism_is_a_baseline_of_its_own(mesh_4x2):
    """NOTE [auto floor]: the batch chosen too, plain data parallelism (parameters
    replicated, the batch split along its leading dimension over every axis it takes)
    is a program of its own beside the replicated one; XLA measures both and neither
    beats the choice on both figures."""
    params, batch = mlp_params(), batch_of((512, 128))
    f = partitioner.pjit(
        sgd_step(mlp_loss), in_axis_resources=(AUTO, AUTO), out_axis_resources=(AUTO, P())
    )
    with jax.set_mesh(mesh_4x2):
        report = f.lower(params, batch).report()
    choice = report.auto.choice
    by_name = {b.name: b.candidate for b in choice.baselines}
    assert set(by_name) == {"replicated", "data-parallel"}
    paths = dict(zip(choice.paths, by_name["data-parallel"].specs, strict=True))
    assert paths["args[1][0]"] == "P(('data', 'model'),)" and paths["args[0]['w1']"] == "P()"
    assert all(s == "P()" for s in by_name["replicated"].specs)
    mine = (report.auto.collective_bytes, report.auto.memory_bytes)
    for b in by_name.values():
        theirs = (b.measured_collective_bytes, b.measured_memory_bytes)
        assert not (theirs[0] <= mine[0] and theirs[1] <= mine[1] and theirs != mine), str(report)


def test_a_large_programs_baseline_the_model_rules_out_is_not_compiled(monkeypatch, mesh_4x2):
    """NOTE [auto floor]: in a large program (every program, here) without a memory
    limit, a baseline whose compute alone exceeds the finalist's time on XLA's figures
    and whose estimated memory is MARGIN above the finalist's is not compiled; the
    choice is the one measuring it gives, and XLA's figures for it agree with the model."""
    monkeypatch.setattr(confirm, "LARGE_PROGRAM", 0)
    params, batch = mlp_params(), batch_of((512, 128))

    def choose() -> partitioner.inspect.Report:
        partitioner.clear_caches()
        f = partitioner.pjit(sgd_step(mlp_loss), (AUTO, (P("data"), P("data"))), (AUTO, P()))
        with jax.set_mesh(mesh_4x2):
            return f.lower(params, batch).report()

    ruled = choose()
    ((name, skipped),) = [(b.name, b.candidate) for b in ruled.auto.choice.baselines]
    assert name == "replicated = data-parallel"
    assert ruled.auto.choice.compiles == 1 and skipped.measured_memory_bytes is None
    monkeypatch.setattr(confirm, "MARGIN", math.inf)  # no memory is that far above
    measured = choose()
    ((_, compiled),) = [(b.name, b.candidate) for b in measured.auto.choice.baselines]
    assert measured.auto.choice.compiles == 2 and compiled.measured_memory_bytes is not None
    assert ruled.auto.choice.chosen.specs == measured.auto.choice.chosen.specs
    assert compiled.measured_memory_bytes > measured.auto.memory_bytes
    assert compiled.estimate.compute_s > measured.auto.choice.chosen.estimate.time_s
    (row,) = [r for r in str(ruled).splitlines() if r.lstrip().startswith(name) and " - " in r]
    assert f"{skipped.estimate.memory_bytes:,.0f}" in row


def test_the_choice_is_drawn(tmp_path, mesh_4x2):
    """``report.auto.visualize``: a line per AUTO input naming the mesh axes that split
    each dimension, and a picture with a panel per input."""
    params, batch = mlp_params(), batch_of((512, 128))
    _, _, report = figures(mesh_4x2, sgd_step(mlp_loss), params, batch, AUTO)
    choice = report.auto.choice
    picture = tmp_path / "auto.png"
    text = report.auto.visualize(png=str(picture), show=False)
    lines = text.splitlines()
    assert [line.split(" ")[0] for line in lines] == list(choice.paths)
    for line, spec, shape, layout in zip(
        lines, choice.chosen.specs, choice.shapes, choice.layouts, strict=True
    ):
        assert f"{list(shape)} {spec}:" in line
        for d, axes in enumerate(layout):
            said = "split over " + " x ".join(f"'{a}' ({report.mesh[a]})" for a in axes)
            assert f"dim {d} ({shape[d]}): {said if axes else 'not split'}" in line
    assert picture.stat().st_size > 0
