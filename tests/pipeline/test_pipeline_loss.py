"""``partitioner.pipeline(layer, axis=..., loss=head)``: the batch's mean loss, and its
gradients, for every schedule (NOTE [pipeline loss]).

Every value is compared with jax.jit running the plain scan followed by the head,
``head(head_params, lax.scan(...)(x), targets)``, on the same inputs.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from benchmarks import models
from partitioner import PartitionSpec as P
from partitioner.testing.plugin import MeshFactory

from .test_pipeline import HIDDEN, LAYERS, WIDTH, close, layer, stacked_params

BATCH, OUT = 32, 4
SCHEDULES = ("gpipe", "circular", "1f1b", "interleaved-1f1b", "zero-bubble")
IN = (P("stage"), P("data"), P(), P("data"))  # params, x, head_params, targets


def head(head_params: dict[str, jax.Array], h: jax.Array, targets: jax.Array) -> jax.Array:
    """One microbatch's mean squared error of a linear read-out."""
    return jnp.mean((h @ head_params["w"] + head_params["b"] - targets) ** 2)


def inputs(batch: int = BATCH) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    kw, kx, ky = jax.random.split(jax.random.key(6), 3)
    head_params = {"w": jax.random.normal(kw, (WIDTH, OUT)) / math.sqrt(WIDTH), "b": jnp.zeros(OUT)}
    return head_params, jax.random.normal(kx, (batch, WIDTH)), jax.random.normal(ky, (batch, OUT))


def plain(params, x, head_params, targets):
    """The reference: the plain scan, then the head on the whole batch."""
    return head(head_params, models.plain_scan(layer)(params, x), targets)


#: What a training step differentiates: the stack, the input and the head.
grad = jax.value_and_grad(plain, argnums=(0, 1, 2))


def step(run):
    return jax.value_and_grad(run, argnums=(0, 1, 2))


#: Microbatch counts per partitioner: every count under Shardy, one under GSPMD (each
#: program's compile is the test's time).
COUNTS = {"shardy": (4, 8, 16), "gspmd": (8,)}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_loss_and_every_gradient_equal_the_plain_scan_and_head(
    schedule, partitioner_mode, mesh: MeshFactory
) -> None:
    params, (head_params, x, y) = stacked_params(), inputs()
    runs = {
        m: partitioner.pipeline(layer, axis="stage", microbatches=m, schedule=schedule, loss=head)
        for m in COUNTS[partitioner_mode]
    }

    def every(params, x, head_params, y):
        return {m: step(run)(params, x, head_params, y) for m, run in runs.items()}

    f = partitioner.jit(every, in_shardings=IN)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        ours = f(params, x, head_params, y)
        loss_alone = partitioner.jit(runs[8], in_shardings=IN)(params, x, head_params, y)
    theirs = jax.jit(grad)(params, x, head_params, y)
    for m, value in ours.items():
        close(value, theirs, f"{schedule}, {m} microbatches")
    close(loss_alone, theirs[0], "the loss without a gradient")


def test_the_gradient_of_the_targets_and_of_the_params_alone(mesh: MeshFactory) -> None:
    """Each gradient asked alone (the others not computed), the targets' too."""
    params, (head_params, x, y) = stacked_params(), inputs()
    run = partitioner.pipeline(layer, axis="stage", microbatches=8, schedule="1f1b", loss=head)
    f = partitioner.jit(
        lambda *a: (jax.grad(run)(*a), jax.grad(run, argnums=3)(*a)), in_shardings=IN
    )
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        ours = f(params, x, head_params, y)
    theirs = jax.jit(lambda *a: (jax.grad(plain)(*a), jax.grad(plain, argnums=3)(*a)))(
        params, x, head_params, y
    )
    close(ours, theirs)


@pytest.mark.parametrize("schedule", ["zero-bubble", "interleaved-1f1b"])
def test_a_layer_count_the_stages_do_not_divide_and_staged_parameters(
    schedule, mesh: MeshFactory
) -> None:
    """Ten layers on four stages: eight pipelined, the other two run in the head; the
    stack staged once (``stage()``), its gradients in the staged form."""
    params, (head_params, x, y) = stacked_params(10), inputs()
    run = partitioner.pipeline(layer, axis="stage", microbatches=8, schedule=schedule, loss=head)
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        staged = run.stage(params)
        specs = dataclasses.replace(  # the staged layers over the stages, the rest as laid
            staged,
            staged=jax.tree.map(lambda _: P("stage"), staged.staged),
            rest=jax.tree.map(lambda _: None, staged.rest),
        )
        f = partitioner.jit(step(run), in_shardings=(specs, *IN[1:]))
        value, (g_params, g_x, g_head) = f(staged, x, head_params, y)
        plan = run.plan(staged, x, head_params, y)
    assert (plan.schedule.layers, plan.rest_layers) == (8, 2)
    close((value, (g_params.unstage(), g_x, g_head)), jax.jit(grad)(params, x, head_params, y))


def test_tensor_parallel_inside_the_stages(mesh: MeshFactory) -> None:
    """A layer splitting its hidden activations over "model": that axis stays XLA's to
    partition inside the stages' region (Shardy), the batch split over "data"."""
    params, (head_params, x, y) = stacked_params(4), inputs(16)
    runs = [
        partitioner.pipeline(layer, axis="stage", microbatches=4, schedule=kind, loss=head)
        for kind in ("1f1b", "zero-bubble")
    ]
    f = partitioner.jit(lambda *a: [step(run)(*a) for run in runs], in_shardings=IN)
    with partitioner.spmd_partitioner("shardy"):
        with jax.set_mesh(mesh((2, 2, 2), ("stage", "data", "model"))):
            ours = f(params, x, head_params, y)
            plan = runs[0].plan(params, x, head_params, y)
    assert plan.placement.batch == ("data",)
    for value in ours:
        close(value, jax.jit(grad)(params, x, head_params, y), "tensor parallel")


def test_two_batch_axes(mesh: MeshFactory) -> None:
    """A layer that constrains nothing on a three-axis mesh: each stage's microbatch split
    over both other axes, a region nested in the stages' for each (Shardy)."""
    params, (head_params, x, y) = stacked_params(4), inputs(16)
    mlp = {"w1": params["w1"], "w2": params["w2"]}
    run = partitioner.pipeline(
        models.residual_mlp, axis="stage", microbatches=4, schedule="zero-bubble", loss=head
    )
    with partitioner.spmd_partitioner("shardy"):
        with jax.set_mesh(mesh((2, 2, 2), ("stage", "data", "model"))):
            ours = partitioner.jit(step(run), in_shardings=IN)(mlp, x, head_params, y)
            plan = run.plan(mlp, x, head_params, y)
    assert plan.placement.batch == ("data", "model")
    reference = jax.value_and_grad(
        lambda p, x, w, t: head(w, models.plain_scan(models.residual_mlp)(p, x), t),
        argnums=(0, 1, 2),
    )
    close(ours, jax.jit(reference)(mlp, x, head_params, y), "two batch axes")


def test_a_flax_stack_trained_20_steps_with_optax(mesh: MeshFactory) -> None:
    """A flax linen stack and read-out, optax's Adam, 20 steps of 1F1B: the parameters
    stay those of jax.jit's plain scan, step by step."""
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h):
            return h + nn.Dense(WIDTH)(nn.gelu(nn.Dense(HIDDEN)(nn.LayerNorm()(h))))

    block, readout = Block(), nn.Dense(OUT)
    _, x, y = inputs()
    keys = jax.random.split(jax.random.key(7), LAYERS)
    stack = jax.jit(jax.vmap(lambda k: block.init(k, x)["params"]))(keys)
    top = readout.init(jax.random.key(8), x)["params"]

    def apply(p, h):
        return block.apply({"params": p}, h)

    def flax_head(p, h, t):
        return jnp.mean((readout.apply({"params": p}, h) - t) ** 2)

    optimizer = optax.adam(1e-2)

    def training(loss):
        def train(state, x, y):
            (stack, top), opt = state
            grads = jax.grad(loss, argnums=(0, 2))(stack, x, top, y)
            updates, opt = optimizer.update(grads, opt, (stack, top))
            return (optax.apply_updates((stack, top), updates), opt)

        return train

    run = partitioner.pipeline(apply, axis="stage", microbatches=8, schedule="1f1b", loss=flax_head)
    scanned = models.plain_scan(apply)
    state = ((stack, top), optimizer.init((stack, top)))
    specs = jax.tree.map(lambda _: P("stage"), stack)
    ours = partitioner.jit(
        training(run),
        in_shardings=((((specs, P()), P())), P("data"), P("data")),
        out_shardings=((specs, P()), P()),
    )
    theirs = jax.jit(training(lambda s, x, t, y: flax_head(t, scanned(s, x), y)))
    mine = want = state
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        for _ in range(20):
            mine, want = ours(mine, x, y), theirs(want, x, y)
    for a, b in zip(jax.tree.leaves(mine[0]), jax.tree.leaves(want[0]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


# --- bad input ---


def _plan(mesh, run, *args):
    with jax.set_mesh(mesh):
        return run.plan(*args)


def test_the_new_schedules_need_a_loss() -> None:
    for schedule in ("1f1b", "interleaved-1f1b", "zero-bubble"):
        with pytest.raises(ValueError, match=rf"schedule='{schedule}'.*give loss=head"):
            partitioner.pipeline(layer, axis="stage", schedule=schedule)
    with pytest.raises(TypeError, match="loss must be callable"):
        partitioner.pipeline(layer, axis="stage", loss="mse")


def test_a_head_that_does_not_return_a_scalar(mesh: MeshFactory) -> None:
    def per_example(head_params, h, targets):
        return jnp.mean((h @ head_params["w"] - targets) ** 2, axis=-1)

    params, (head_params, x, y) = stacked_params(), inputs()
    run = partitioner.pipeline(layer, axis="stage", microbatches=8, loss=per_example)
    with pytest.raises(
        ValueError, match=r"a scalar; head\(head_params, h, targets\) returns float32\[4\]"
    ):
        _plan(mesh((4, 2), ("stage", "data")), run, params, x, head_params, y)


def test_targets_whose_batch_is_not_xs(mesh: MeshFactory) -> None:
    params, (head_params, x, y) = stacked_params(), inputs()
    run = partitioner.pipeline(layer, axis="stage", microbatches=8, schedule="1f1b", loss=head)
    with pytest.raises(ValueError, match=r"targets has shape \(24, 4\).*must be x's, 32"):
        _plan(mesh((4, 2), ("stage", "data")), run, params, x, head_params, y[:24])


def test_fewer_microbatches_than_the_schedule_needs(mesh: MeshFactory) -> None:
    params, (head_params, x, y) = stacked_params(), inputs()
    m = mesh((4, 2), ("stage", "data"))
    few = partitioner.pipeline(layer, axis="stage", microbatches=2, schedule="1f1b", loss=head)
    with pytest.raises(
        ValueError, match=r"'1f1b' needs at least one microbatch per stage: 4 stages"
    ):
        _plan(m, few, params, x, head_params, y)
    odd = partitioner.pipeline(
        layer, axis="stage", microbatches=8, schedule="interleaved-1f1b", loss=head
    )
    with pytest.raises(ValueError, match=r"even stage count; mesh axis 'stage' has 3"):
        _plan(mesh((3, 2), ("stage", "data")), odd, stacked_params(6), x[:24], head_params, y[:24])
    six = partitioner.pipeline(
        layer, axis="stage", microbatches=16 // 16 * 6, schedule="interleaved-1f1b", loss=head
    )
    with pytest.raises(ValueError, match=r"needs a multiple of one microbatch per stage"):
        _plan(m, six, params, x[:24], head_params, y[:24])


def test_x_of_several_dtypes(mesh: MeshFactory) -> None:
    params, (head_params, x, y) = stacked_params(), inputs()
    run = partitioner.pipeline(
        lambda p, h: (layer(p, h[0]), h[1]), axis="stage", microbatches=8, schedule="1f1b",
        loss=lambda w, h, t: head(w, h[0], t),
    )  # fmt: skip
    pair = (x, x.astype(jnp.int32))
    with pytest.raises(TypeError, match=r"x's leaves to share one floating dtype.*int32"):
        _plan(mesh((4, 2), ("stage", "data")), run, params, pair, head_params, y)


def test_a_loss_pipeline_is_called_with_the_head_and_the_targets(mesh: MeshFactory) -> None:
    params, (head_params, x, y) = stacked_params(), inputs()
    run = partitioner.pipeline(layer, axis="stage", microbatches=8, loss=head)
    with pytest.raises(TypeError, match=r"called run\(params, x, head_params, targets\)"):
        run(params, x)
    plain_run = partitioner.pipeline(layer, axis="stage", microbatches=8)
    with pytest.raises(TypeError, match=r"no loss=, so it is called run\(params, x\)"):
        plain_run(params, x, head_params, y)


def test_gspmd_with_axes_left_to_xla_inside_the_stages(mesh: MeshFactory) -> None:
    params, (head_params, x, y) = stacked_params(4), inputs(16)
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule="1f1b", loss=head)
    f = partitioner.jit(step(run), in_shardings=IN)
    with partitioner.spmd_partitioner("gspmd"):
        with jax.set_mesh(mesh((2, 2, 2), ("stage", "data", "model"))):
            with pytest.raises(
                ValueError, match=r"leaving \['model'\].*Use the Shardy partitioner"
            ):
                f(params, x, head_params, y)
