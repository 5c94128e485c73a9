"""partitioner.inspect.report: tables of values, collectives, memory and cost.

The collective tests use programs whose communication is known by hand, under
both of XLA's partitioners; the value tests compare shapes, layouts and bytes
with what the arrays themselves report after running the same call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from benchmarks import models
from partitioner import PartitionSpec as P
from partitioner import inspect, pjit, pmap, with_sharding_constraint
from partitioner._testing import hlo_replica_groups

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

X = np.linspace(-1, 1, 32 * 16, dtype=np.float32).reshape(32, 16)
W = np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8)


@pytest.mark.usefixtures("partitioner_mode", "in_mesh_4x2")
def test_a_matmul_split_on_its_contracting_dim_is_one_all_reduce_over_model() -> None:
    f = pjit(lambda x, w: x @ w, (P(None, "model"), P("model", None)), P())
    (c,) = inspect.report(f, X, W).collectives
    assert (c.kind, c.axes, c.count) == ("all-reduce", ("model",), 1)
    assert c.shape == (32, 8) and c.bytes_per_device == 32 * 8 * 4  # the output, per device
    assert "dot_general" in (c.op_name or "")
    assert c.source is not None and "test_report.py" in c.source  # the user's line


@pytest.mark.usefixtures("partitioner_mode", "in_mesh_4x2")
def test_a_data_parallel_gradient_all_reduces_the_parameters_over_data() -> None:
    def grad(w: Any, x: Any) -> Any:
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    f = pjit(grad, (None, P("data")), None)
    report = inspect.report(f, W, X)
    found = report.collectives
    assert found and all(c.kind == "all-reduce" and c.axes == ("data",) for c in found)
    assert report.collective_bytes == W.nbytes  # the parameters


@pytest.mark.usefixtures("partitioner_mode", "in_mesh_4x2")
def test_collectives_in_a_loop_count_once_per_iteration() -> None:
    def steps(w: Any, x: Any) -> Any:
        def body(i: Any, w: Any) -> Any:
            return w - 0.1 * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)

        return jax.lax.fori_loop(0, 3, body, w)

    (c,) = inspect.report(pjit(steps, (None, P("data")), None), W, X).collectives
    assert (c.kind, c.axes, c.count) == ("all-reduce", ("data",), 3)


# --- loops against their unrolled twins: XLA marks each loop's trip count ---

LAYERS = 3
_LAYER_SPECS = {"w1": P(None, None, "model"), "b1": P(None, "model"), "w2": P(None, "model", None)}


def _layer(p: Any, x: Any) -> Any:
    return jnp.tanh(jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"])


def _scanned(ps: Any, x: Any) -> Any:
    return jnp.sum(models.plain_scan(_layer)(ps, x) ** 2)


def _unrolled(ps: Any, x: Any, repeat: int = 1) -> Any:
    for i in range(LAYERS):
        layer = {k: a[i] for k, a in ps.items()}
        for _ in range(repeat):
            x = _layer(layer, x)
    return jnp.sum(x**2)


def _nested(ps: Any, x: Any) -> Any:  # a fori_loop of 2 inside a scan: loops multiply
    def outer(x: Any, p: Any) -> Any:
        return jax.lax.fori_loop(0, 2, lambda i, x: _layer(p, x), x), None

    return jnp.sum(jax.lax.scan(outer, x, ps)[0] ** 2)


def _while(ps: Any, x: Any) -> Any:  # forward only: a while loop has no reverse mode
    def body(c: Any) -> Any:
        i, x = c
        return i + 1, _layer({k: a[i] for k, a in ps.items()}, x)

    return jnp.sum(jax.lax.while_loop(lambda c: c[0] < LAYERS, body, (0, x))[1] ** 2)


def _loop_report(fun: Any, grad: bool) -> inspect.Report:
    """The report of ``fun`` (its gradient with ``grad``) over the stacked layers."""
    k = jax.random.split(jax.random.key(0), 3)
    ps = {
        "w1": jax.random.normal(k[0], (LAYERS, 16, 32)),
        "b1": jnp.zeros((LAYERS, 32)),
        "w2": jax.random.normal(k[1], (LAYERS, 32, 16)),
    }
    x = jax.random.normal(k[2], (32, 16))
    if grad:  # both arguments differentiated: neither twin can drop a cotangent
        f = pjit(
            jax.grad(fun, argnums=(0, 1)), (_LAYER_SPECS, P("data")), (_LAYER_SPECS, P("data"))
        )
    else:
        f = pjit(fun, (_LAYER_SPECS, P("data")), P())
    return inspect.report(f, ps, x)


@pytest.mark.usefixtures("in_mesh_4x2")
@pytest.mark.parametrize(
    ("looped", "twin", "grad", "trips"),
    [
        (_scanned, _unrolled, True, LAYERS),
        (_nested, lambda ps, x: _unrolled(ps, x, repeat=2), True, 2 * LAYERS),
        (_while, _unrolled, False, LAYERS),
    ],
    ids=["scan", "fori-in-scan", "while"],
)
def test_collectives_in_loops_total_as_their_unrolled_twin(
    looped: Any, twin: Any, grad: bool, trips: int
) -> None:
    """Loop bodies whose parameters are tuples (headers with ``/*index=5*/`` comments)
    are read as computations, so their collectives count once per trip, nested loops
    multiplying: the same layers looped and unrolled move the same bytes.

    Under Shardy (the default) XLA partitions both twins alike; GSPMD's propagation
    lays out the scan's stacked residuals otherwise and reshards them (collective
    permutes the unrolled twin does not have), so the twins differ there for real.
    """
    report = _loop_report(looped, grad)
    assert max(c.count for c in report.collectives) == trips
    assert report.collective_bytes == _loop_report(twin, grad).collective_bytes


@pytest.mark.usefixtures("in_mesh_4x2")
def test_collective_bytes_is_the_table_summed_loop_trips_included() -> None:
    """``Report.collective_bytes`` adds up the collectives table, each row's bytes times
    its count: a scan's collectives weigh once per trip, not once."""
    report = _loop_report(_scanned, grad=True)
    rows = report.collectives
    assert max(c.count for c in rows) == LAYERS
    assert report.collective_bytes == sum(c.bytes_per_device * c.count for c in rows)
    assert report.collective_bytes > sum(c.bytes_per_device for c in rows)


@pytest.mark.usefixtures("partitioner_mode", "in_mesh_4x2")
def test_a_reshard_is_an_all_to_all_or_an_all_gather_over_the_moved_axis() -> None:
    f = pjit(lambda x: x * 2, P("data", None), P(None, "data"))
    found = inspect.report(f, X).collectives
    assert found and {c.kind for c in found} <= {"all-to-all", "all-gather"}
    assert all(c.axes == ("data",) for c in found)
    g = pjit(lambda x: x + 1, P("data", "model"), P())
    gathers = inspect.report(g, X).collectives
    assert gathers and all(c.kind == "all-gather" for c in gathers)
    assert {a for c in gathers for a in (c.axes or ())} == {"data", "model"}


def test_no_communication_reports_none(in_mesh_4x2: Mesh) -> None:
    report = inspect.report(pjit(lambda x: x * 2, P("data"), P("data")), X)
    assert report.collectives == ()
    assert "none: every device computes on its own data" in str(report)


def test_the_values_table_matches_the_arrays(in_mesh_4x2: Mesh) -> None:
    def f(x: Any, params: dict[str, Any]) -> Any:
        h = with_sharding_constraint(jnp.tanh(x @ params["w"]), P("data", "model"))
        return {"h": h, "total": jnp.sum(h)}

    g = pjit(f, (P("data"), {"w": P(None, "model")}), {"h": P("data"), "total": None})
    report = inspect.report(g, X, {"w": W})
    rows = {(v.kind, v.path): v for v in report.values}
    x_row = rows[("input", "args[0]")]
    assert (x_row.shape, x_row.spec_asked, x_row.per_device_shape) == (
        (32, 16),
        "P('data',)",
        (8, 16),
    )
    assert x_row.bytes_per_device == 8 * 16 * 4
    w_row = rows[("input", "args[1]['w']")]
    assert w_row.spec_chosen == "P(None, 'model')" and w_row.per_device_shape == (16, 4)
    out = g(X, {"w": W})
    h_row = rows[("output", "out['h']")]
    assert h_row.per_device_shape == out["h"].addressable_shards[0].data.shape
    constraint = next(v for v in report.values if v.kind == "constraint")
    assert constraint.spec_asked == "P('data', 'model')" and constraint.per_device_shape == (8, 4)
    assert "test_report.py" in constraint.path
    assert any(v.kind == "residual" for v in report.values)  # float arguments: vjp residuals


def test_memory_cost_printing_and_json(in_mesh_4x2: Mesh) -> None:
    f = pjit(lambda x, w: jnp.tanh(x @ w), (P("data"), None), P("data"))
    report = f.lower(X, W).compile().report()
    assert report.memory is not None and report.memory.arguments == (8 * 16 + 16 * 8) * 4
    assert report.cost is not None and report.cost.flops > 0
    text = str(report)
    for heading in ("values", "collectives", "memory per device", "cost per device"):
        assert heading in text
    data = json.loads(report.to_json())
    assert data["mesh"] == {"data": 4, "model": 2}
    assert data["values"][0]["path"] == "args[0]"
    assert f.lower(X, W).report().values == report.values


def test_a_pmap_report_names_the_mapped_axis() -> None:
    def step(x: Any) -> Any:
        return jax.lax.psum(x, "i")

    (c,) = inspect.report(pmap(step, "i"), np.ones((8, 4), np.float32)).collectives
    assert (c.kind, c.axes) == ("all-reduce", ("i",))


def test_report_needs_a_pjit_or_pmap_ed_function() -> None:
    with pytest.raises(TypeError, match="expected a pjit- or pmap-ed function"):
        inspect.report(lambda x: x, X)


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("replica_groups={{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("replica_groups=[2,2]<=[4]", ((0, 1), (2, 3))),
        ("replica_groups=[2,2]<=[2,2]T(1,0)", ((0, 2), (1, 3))),
        (
            "replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_1'}",
            ((0, 2), (1, 3)),
        ),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", ((0, 2), (1, 3))),
        ("source_target_pairs={{0,1},{1,2},{2,3},{3,0}}", ((0, 1), (1, 2), (2, 3), (3, 0))),
    ],
)
def test_every_replica_group_spelling_is_read(text: str, groups: tuple[Any, ...]) -> None:
    assert hlo_replica_groups(f"%x = f32[4] all-reduce(%y), {text}, to_apply=%add", 4) == groups


# --- compare_partitioners, visualize, compiler_ir, the command line ---


def test_compare_partitioners_puts_both_side_by_side(in_mesh_4x2: Mesh) -> None:
    f = pjit(lambda x, w: x @ w, (P(None, "model"), P("model", None)), P())
    comparison = inspect.compare_partitioners(f, X, W)
    assert comparison.gspmd.partitioner == "GSPMD" and comparison.shardy.partitioner == "Shardy"
    rows = {what: (a, b) for what, a, b in comparison.rows}
    assert rows["collective all-reduce"] == ("1x 1,024 B over 'model'",) * 2
    assert rows["output out layout"] == ("P()", "P()")
    assert comparison.differences == tuple(r for r in comparison.rows if r[1] != r[2])
    text = str(comparison)
    assert "GSPMD vs Shardy" in text and "collective all-reduce" in text


def test_visualize_draws_blocks_and_replicas(tmp_path: Any, mesh_4x2: Mesh) -> None:
    x = jax.device_put(np.zeros((8, 4)), jax.sharding.NamedSharding(mesh_4x2, P("data")))
    text = inspect.visualize(x, show=False)
    assert text.splitlines()[0].startswith("4 block(s) of 4 x 1 over shape [8, 4]")
    for pair in ("0,1", "2,3", "4,5", "6,7"):  # each row block on two replicas
        assert f"| {pair}" in text.replace("  ", " ")
    picture = tmp_path / "layout.png"
    rank3 = inspect.visualize(
        spec=P(None, "model", "data"), shape=(2, 4, 8), mesh=mesh_4x2, png=str(picture), show=False
    )
    assert rank3.count("dims 2+") == 4 and picture.stat().st_size > 0
    with pytest.raises(ValueError, match="give a jax.Array, or spec=, shape= and mesh="):
        inspect.visualize(spec=P("data"))


def test_the_picture_colours_each_device_set_and_names_the_mesh_axes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, mesh_4x2: Mesh
) -> None:
    from matplotlib.figure import Figure

    drawn: list[Any] = []
    save = Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))
    )
    x = jax.device_put(np.zeros((8, 6)), jax.sharding.NamedSharding(mesh_4x2, P("data", "model")))
    inspect.visualize(x, png=str(tmp_path / "grid.png"), show=False)
    (ax,) = drawn[0].axes
    colours = [tuple(patch.get_facecolor()) for patch in ax.patches]
    assert len(colours) == 8 and len(set(colours)) == 8  # one colour per device set
    assert sorted(t.get_text().split("\n")[-1] for t in ax.texts) == [str(i) for i in range(8)]
    assert ax.get_ylabel() == "dim 0 (8): split over 'data' (4)"
    assert ax.get_xlabel() == "dim 1 (6): split over 'model' (2)"
    # Replicas share a block and its colour; the title says over which axis.
    inspect.visualize(
        spec=P("data"), shape=(8, 6), mesh=mesh_4x2, png=str(tmp_path / "r.png"), show=False
    )
    (ax,) = drawn[1].axes
    assert len({tuple(p.get_facecolor()) for p in ax.patches}) == 4
    assert "replicated over 'model'" in ax.get_title() and ax.get_xlabel().endswith("not split")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_command_line_prints_the_report(tmp_path: Any) -> None:
    (tmp_path / "mymodel.py").write_text(
        "import jax.numpy as jnp\n\ndef step(x, w):\n    return jnp.tanh(x @ w)\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=str(tmp_path),
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    command = [
        sys.executable, "-m", "partitioner.inspect", "mymodel:step", "--mesh", "data=4,model=2",
        "--arg", "f32[32,16]", "--in", "P(None, 'model')", "--arg", "f32[16,8]", "--in", "P('model')",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all-reduce" in done.stdout and "over 'model'" in done.stdout
    as_json = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert json.loads(as_json.stdout)["collectives"][0]["axes"] == ["model"]


def test_a_report_of_a_step_taking_a_typed_prng_key(in_mesh_4x2: Mesh) -> None:
    def noisy(x: Any, key: Any) -> Any:
        return x + jax.random.normal(key, x.shape)

    f = pjit(noisy, (P("data"), None), P("data"))
    report = inspect.report(f, X, jax.random.key(0))
    key_row = next(v for v in report.values if v.path == "args[1]")
    assert key_row.dtype == str(jax.random.key(0).dtype) and key_row.shape == ()
    assert not any(v.kind == "residual" for v in report.values)  # no vjp through a key
