"""``partitioner.pipeline``: a stack of layers as pipeline stages over a mesh axis.

Every value is compared with jax.jit running the plain scan
``lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)`` on the same inputs
(``benchmarks/models.py``'s ``plain_scan``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from benchmarks import models
from partitioner import PartitionSpec as P
from partitioner import with_sharding_constraint
from partitioner.testing.plugin import MeshFactory

LAYERS, BATCH, WIDTH, HIDDEN = 8, 16, 16, 32
STACK = {"w1": P("stage"), "w2": P("stage"), "b": P("stage")}


def stacked_params(layers: int = LAYERS) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w1": jax.random.normal(k1, (layers, WIDTH, HIDDEN)) / math.sqrt(WIDTH),
        "w2": jax.random.normal(k2, (layers, HIDDEN, WIDTH)) / math.sqrt(HIDDEN),
        "b": jax.random.normal(k3, (layers, WIDTH)) * 0.1,
    }


def batch() -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(1))
    return jax.random.normal(kx, (BATCH, WIDTH)), jax.random.normal(ky, (BATCH, WIDTH))


def layer(p: dict[str, jax.Array], h: jax.Array) -> jax.Array:
    """A residual MLP block, tensor parallel over "model" where the mesh has it."""
    hidden = jax.nn.gelu(h @ p["w1"])
    mesh = jax.sharding.get_abstract_mesh()
    if "model" in mesh.axis_names:
        hidden = with_sharding_constraint(hidden, P("data", "model"))
    return h + hidden @ p["w2"] + p["b"]


plain = models.plain_scan(layer)  # the reference every pipeline is compared with


def train_step(forward):
    def loss(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    return jax.value_and_grad(loss)


def close(ours, theirs, what: str = "") -> None:
    """Microbatches sum the gradient in another order than the plain scan."""
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=what)


# --- values and gradients, side by side with jax.jit's plain scan ---


#: Microbatch counts per (mesh axes, partitioner): each count runs on both meshes and under
#: both partitioners, half of them in each program (the program's compile is the test's time).
MICROBATCHES = {
    (2, "gspmd"): (1, 4, None),
    (2, "shardy"): (2, 8),
    (3, "gspmd"): (2, 8),
    (3, "shardy"): (1, 4, None),
}


@pytest.mark.parametrize("names", [("stage", "data"), ("stage", "data", "model")])
def test_a_train_step_equals_the_plain_scan(names, partitioner_mode, mesh: MeshFactory) -> None:
    """Both schedules and several microbatch counts, in one program (one compile)."""
    params, (x, y) = stacked_params(), batch()
    stages = mesh({2: (4, 2), 3: (2, 2, 2)}[len(names)], names)
    steps = {
        (schedule, m): train_step(
            partitioner.pipeline(layer, axis="stage", microbatches=m, schedule=schedule)
        )
        for schedule in ("gpipe", "circular")
        for m in MICROBATCHES[len(names), partitioner_mode]
    }

    def every(params, x, y):
        return {f"{k[0]}/{k[1]}": step(params, x, y) for k, step in steps.items()}

    f = partitioner.pjit(
        every, in_axis_resources=(STACK, P("data"), P("data")), out_axis_resources=None
    )
    with jax.set_mesh(stages):
        ours = f(params, x, y)
        theirs = jax.jit(train_step(plain))(params, x, y)
    for key, value in ours.items():
        close(value, theirs, key)


def test_the_stages_hold_their_layers_and_pass_activations_to_their_neighbours(
    mesh: MeshFactory,
) -> None:
    params, (x, y) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4)
    f = partitioner.pjit(
        train_step(run), in_axis_resources=(STACK, P("data"), P("data")), out_axis_resources=None
    )
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        compiled = f.lower(params, x, y).compile()
        plan = run.plan(params, x)
    report = compiled.report()
    (table,) = report.pipelines
    assert (table.axis, table.schedule, table.microbatches, table.steps) == ("stage", "gpipe", 4, 7)
    assert table.stage_layers == ("0-1", "2-3", "4-5", "6-7")
    assert table.stage_devices == ((0, 1), (2, 3), (4, 5), (6, 7))
    permutes = [c for c in report.collectives if c.kind == "collective-permute"]
    assert permutes and table.permute_bytes == sum(c.bytes_per_run for c in permutes)
    assert all(c.axes == ("stage",) for c in permutes)  # neighbours along the stage axis only
    text = str(report)
    assert "pipeline over mesh axis 'stage': gpipe, 8 layers on 4 stages, 4 microbatches" in text
    assert "bubble fraction 0.429" in text and "stage 2: layers 4-5 on devices [4, 5]" in text
    (w1,) = [s for s in jax.tree.leaves(compiled.input_shardings[0][0]) if s][:1]
    assert w1.shard_shape((LAYERS, WIDTH, HIDDEN))[0] == LAYERS // 4  # each stage, its layers
    assert plan.stage_devices == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert [plan.schedule.layers_of(k) for k in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan.schedule.bubble_fraction == pytest.approx(3 / 7)
    # one device's shard of a microbatch: the batch over 4 microbatches and the 2 "data" shards
    assert plan.permute_bytes == BATCH // 4 // 2 * WIDTH * 4
    assert "stage 3: layers 6-7 on devices [6, 7]" in str(plan)


def test_circular_puts_layer_i_on_stage_i_mod_s_with_a_smaller_bubble(mesh: MeshFactory) -> None:
    params, (x, _) = stacked_params(), batch()
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        gpipe = partitioner.pipeline(layer, axis="stage", microbatches=4).plan(params, x)
        circ = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule="circular").plan(
            params, x
        )
    assert [circ.schedule.layers_of(k) for k in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert circ.schedule.bubble_fraction == pytest.approx(3 / 11)
    assert circ.schedule.bubble_fraction < gpipe.schedule.bubble_fraction
    # the forwards, then the backward loop's steps in reverse, two columns each
    assert gpipe.chart().splitlines()[1] == (
        "stage 1 |  . F0 F1 F2 F3  .  .  .  .  .  . B3 B3 B2 B2 B1 B1 B0 B0  .  ."
    )
    assert circ.chart().splitlines()[0].startswith("stage 0 | F0a F1a F2a F3a F0b F1b F2b F3b")


def test_partitioner_chooses_the_microbatches_once_and_says_so(mesh: MeshFactory) -> None:
    params, (x, _) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage")
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        plan = run.plan(params, x)
        again = run.plan(params, x)
    assert plan.chosen and plan.schedule.microbatches == again.schedule.microbatches
    assert plan.estimates is again.estimates  # kept, not estimated again
    counts = sorted({e.microbatches for e in plan.estimates})
    assert counts == [d for d in range(1, BATCH + 1) if BATCH % d == 0]
    assert {e.saves for e in plan.estimates} == {"activations", "inputs"}
    # every option priced in time and memory; the chosen one the fastest of those within
    # 1.25x of the least memory (NOTE [pipeline microbatches])
    least = min(e.estimate.memory_bytes for e in plan.estimates)
    near = [e for e in plan.estimates if e.estimate.memory_bytes <= 1.25 * least]
    (mine,) = [
        e for e in plan.estimates
        if (e.microbatches, e.saves) == (plan.schedule.microbatches, plan.saves)
    ]  # fmt: skip
    assert mine in near and mine.estimate == plan.estimate
    assert mine.estimate.time_s <= min(e.estimate.time_s for e in near) * 1.01
    assert "chosen by partitioner" in str(plan)


# --- composing with jax's transformations ---


def test_vmap_over_another_dimension_and_checkpointed_layers(mesh: MeshFactory) -> None:
    params, (x, y) = stacked_params(), batch()
    xs = jnp.stack([x, 2 * x, -x])
    run = partitioner.pipeline(jax.checkpoint(layer), axis="stage", microbatches=2)
    f = partitioner.pjit(jax.vmap(run, in_axes=(None, 0)), in_axis_resources=(STACK, P()))
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        ours = f(params, xs)
        grads = partitioner.pjit(train_step(run), in_axis_resources=(STACK, P("data"), P("data")))(
            params, x, y
        )
        theirs = jax.jit(jax.vmap(plain, in_axes=(None, 0)))(params, xs)
        their_grads = jax.jit(train_step(plain))(params, x, y)
    close(ours, theirs)
    close(grads, their_grads)


def test_auto_chooses_the_parameters_layouts_around_the_stages(
    monkeypatch, mesh: MeshFactory
) -> None:
    from partitioner._src.auto.search import confirm

    monkeypatch.setattr(confirm, "FINALISTS", 1)  # composing is the point, not the ranking
    params, (x, y) = stacked_params(), batch()
    run = partitioner.pipeline(layer, axis="stage", microbatches=4)
    f = partitioner.pjit(
        train_step(run), in_axis_resources=(partitioner.AUTO, P("data"), P("data"))
    )
    with jax.set_mesh(mesh((2, 2, 2), ("stage", "data", "model"))):
        report = f.lower(params, x, y).compile().report()
        ours = f(params, x, y)
        theirs = jax.jit(train_step(plain))(params, x, y)
    close(ours, theirs)
    chosen = dict(zip(report.auto.choice.paths, report.auto.choice.chosen.specs, strict=True))
    assert chosen["args[0]['w1']"].startswith("P('stage'"), chosen  # each stage, its layers
    assert report.pipelines[0].stages == 2


def test_a_flax_scanned_model(mesh: MeshFactory) -> None:
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h):
            return h + nn.Dense(WIDTH)(nn.gelu(nn.Dense(HIDDEN)(h)))

    block = Block()
    x, y = batch()
    keys = jax.random.split(jax.random.key(3), LAYERS)
    stacked = jax.jit(jax.vmap(lambda k: block.init(k, x)["params"]))(keys)

    def apply(p, h):
        return block.apply({"params": p}, h)

    scanned = models.plain_scan(apply)  # what flax's nn.scan over Block computes
    run = partitioner.pipeline(apply, axis="stage", microbatches=4, schedule="circular")
    specs = jax.tree.map(lambda _: P("stage"), stacked)
    f = partitioner.pjit(train_step(run), in_axis_resources=(specs, P("data"), P("data")))
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        ours = f(stacked, x, y)
    close(ours, jax.jit(train_step(scanned))(stacked, x, y))


def test_bubble_slots_put_no_nan_into_the_gradients(mesh: MeshFactory) -> None:
    """A layer undefined at zero: the bubble computes on real activations, never read."""

    def normalised(p, h):  # NaN where h is all zeros
        return layer(p, h / jnp.sqrt(jnp.sum(h**2, axis=-1, keepdims=True)))

    params, (x, y) = stacked_params(), batch()
    run = partitioner.pipeline(normalised, axis="stage", microbatches=2)
    f = partitioner.pjit(
        train_step(run), in_axis_resources=(STACK, P("data"), P("data")), out_axis_resources=None
    )
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        ours = f(params, x, y)
        theirs = jax.jit(train_step(models.plain_scan(normalised)))(params, x, y)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(ours))
    close(ours, theirs)


# --- bad input ---


def _plan(mesh: jax.sharding.Mesh, run, params=None, x=None):
    params = stacked_params() if params is None else params
    x = batch()[0] if x is None else x
    with jax.set_mesh(mesh):
        return run.plan(params, x)


def test_fewer_layers_than_stages(mesh: MeshFactory) -> None:
    run = partitioner.pipeline(layer, axis="stage")
    with pytest.raises(ValueError, match=r"3 layers cannot fill the 4 stages of mesh axis 'stage'"):
        _plan(mesh((4, 2), ("stage", "data")), run, stacked_params(3))


def test_a_batch_not_divisible_by_the_microbatches(mesh: MeshFactory) -> None:
    run = partitioner.pipeline(layer, axis="stage", microbatches=3)
    with pytest.raises(ValueError, match=r"batch .*16.* not divisible by microbatches=3"):
        _plan(mesh((4, 2), ("stage", "data")), run)


def test_an_axis_not_in_the_mesh(mesh: MeshFactory) -> None:
    run = partitioner.pipeline(layer, axis="pipe")
    with pytest.raises(ValueError, match=r"axis 'pipe' is not an axis of the mesh.*'stage': 4"):
        _plan(mesh((4, 2), ("stage", "data")), run)


def test_parameters_without_a_common_leading_dimension(mesh: MeshFactory) -> None:
    params = dict(stacked_params(), b=jnp.zeros((4, WIDTH)))
    with pytest.raises(ValueError, match=r"leading \(layer\) dimensions differ.*\['b'\] has 4"):
        _plan(mesh((4, 2), ("stage", "data")), partitioner.pipeline(layer, axis="stage"), params)
    params = dict(stacked_params(), scale=jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"stacked_params\['scale'\] is a scalar"):
        _plan(mesh((4, 2), ("stage", "data")), partitioner.pipeline(layer, axis="stage"), params)


def test_a_layer_whose_output_differs_from_its_input(mesh: MeshFactory) -> None:
    def widening(p, h):
        return h @ p["w1"]

    with pytest.raises(
        ValueError, match=r"output is float32\[16, 32\] but its input is float32\[16, 16\]"
    ):
        _plan(mesh((4, 2), ("stage", "data")), partitioner.pipeline(widening, axis="stage"))

    def casting(p, h):
        return layer(p, h).astype(jnp.bfloat16)

    with pytest.raises(ValueError, match=r"bfloat16.* but its input is float32"):
        _plan(mesh((4, 2), ("stage", "data")), partitioner.pipeline(casting, axis="stage"))


def test_no_mesh_in_context() -> None:
    run = partitioner.pipeline(layer, axis="stage")
    with pytest.raises(RuntimeError, match="no mesh; pass mesh="):
        run.plan(stacked_params(), batch()[0])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"axis": 0}, TypeError, "axis must be a mesh axis name"),
        ({"axis": "stage", "microbatches": 0}, ValueError, "microbatches must be >= 1"),
        ({"axis": "stage", "microbatches": 2.0}, TypeError, "microbatches must be an int"),
        ({"axis": "stage", "schedule": "pipedream"}, ValueError, "schedule must be one of"),
    ],
)
def test_bad_arguments(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        partitioner.pipeline(layer, **kwargs)
    with pytest.raises(TypeError, match="layer must be callable"):
        partitioner.pipeline(None, axis="stage")


def cli_forward(w1, w2, b, x):
    """A pipelined forward pass as ``python -m partitioner.inspect`` takes it (flat arrays)."""
    run = partitioner.pipeline(layer, axis="stage", microbatches=2, schedule="circular")
    return run({"w1": w1, "w2": w2, "b": b}, x)


def test_the_inspect_shell_shows_the_pipeline(capsys) -> None:
    from partitioner.inspect.__main__ import main

    shapes = [f"f32[{LAYERS},{WIDTH},{HIDDEN}]", f"f32[{LAYERS},{HIDDEN},{WIDTH}]"]
    shapes += [f"f32[{LAYERS},{WIDTH}]", f"f32[{BATCH},{WIDTH}]"]
    argv = ["tests.pipeline.test_pipeline:cli_forward", "--mesh", "stage=4,data=2"]
    for shape, spec in zip(shapes, ["P('stage')"] * 3 + ["P('data')"], strict=True):
        argv += ["--arg", shape, "--in", spec]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pipeline over mesh axis 'stage': circular, 8 layers on 4 stages, 2 microbatches" in out
    assert "stage 1: layers 1, 5 on devices [2, 3]" in out
