"""Draw the pictures the docs show (``nox -s docs`` runs this first).

python docs/make_images.py

The layout pictures of the tutorial (``inspect.visualize``: one colour per device
set, the mesh axes on the axes), the reports page's picture of what the
tutorial's training step communicates per mesh axis (its report's collectives),
the AUTO how-to's pictures of the layouts chosen for its examples
(``report.auto.visualize``), one of them a plan that recomputes its scan to fit a
memory limit, and the pipeline how-to's schedules (``PipelinePlan.chart(png=...)``).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

from partitioner import AUTO, inspect, pjit  # noqa: E402
from partitioner import PartitionSpec as P  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IMAGES = Path(__file__).resolve().parent / "images"


def layouts(mesh: jax.sharding.Mesh) -> None:
    inspect.visualize(
        spec=P("data"), shape=(8, 16), mesh=mesh, png=str(IMAGES / "batch_layout.png"), show=False
    )
    inspect.visualize(
        spec=P(None, "model"),
        shape=(16, 4),
        mesh=mesh,
        png=str(IMAGES / "weight_layout.png"),
        show=False,
    )


def training_step_report(mesh: jax.sharding.Mesh) -> inspect.Report:
    """The report of the tutorial's training step (section 5), on the same shapes."""

    def init(key: jax.Array) -> dict[str, jax.Array]:
        k1, k2 = jax.random.split(key)
        return {
            "w1": jax.random.normal(k1, (16, 32)) * 0.1,
            "w2": jax.random.normal(k2, (32, 1)) * 0.1,
        }

    def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    param_specs = {"w1": P(None, "model"), "w2": P("model", None)}
    train = pjit(step, (param_specs, P("data"), P("data")), (param_specs, None), donate_argnums=0)
    xs = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    ys = np.sin(xs.sum(1, keepdims=True)).astype(np.float32)
    params = init(jax.random.key(0))
    with jax.set_mesh(mesh):
        return inspect.report(train, params, xs, ys)


def collectives_picture(report: inspect.Report, path: Path) -> None:
    """Bytes each device sends per run, one bar per mesh axis, one segment per collective."""
    per_axis: dict[str, list[inspect.Collective]] = defaultdict(list)
    for c in report.collectives:
        per_axis[c.describe_axes()].append(c)
    names = sorted(per_axis)
    colours = {"all-reduce": "tab:blue", "all-gather": "tab:orange", "reduce-scatter": "tab:green"}
    widest = max(c.bytes_per_run for c in report.collectives)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.9 * len(names)))
    for row, name in enumerate(names):
        left = 0
        for c in per_axis[name]:
            width = c.bytes_per_run
            colour = colours.get(c.kind, "tab:gray")
            ax.barh(row, width, left=left, color=colour, alpha=0.7, edgecolor="black")
            shape = "x".join(map(str, c.shape))
            function = c.source.rsplit("(", 1)[-1].rstrip(")").rsplit(".", 1)[-1]
            label = f"{c.kind} {c.dtype}[{shape}], x{c.count}, in {function}: {width} B"
            narrow = width < 0.4 * widest  # the label goes beside a short bar
            ax.text(
                left + width + 0.01 * widest if narrow else left + width / 2,
                row,
                label,
                ha="left" if narrow else "center",
                va="center",
                fontsize=8,
            )
            left += width
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("bytes each device sends per step")
    mesh = " x ".join(f"{a}={n}" for a, n in report.mesh.items())
    ax.set_title(f"collectives of the tutorial's training step, mesh {mesh}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def auto_layouts(mesh: jax.sharding.Mesh, path: Path) -> None:
    """The layouts AUTO chooses for the how-to's example (docs/howto/auto.md)."""

    def loss(params: dict[str, jax.Array], batch: tuple) -> jax.Array:
        x, y = batch
        h = jax.nn.gelu(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params: dict[str, jax.Array], batch: tuple) -> dict[str, jax.Array]:
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(128, 512)).astype(np.float32) / 11,
        "b1": np.zeros(512, np.float32),
        "w2": rng.normal(size=(512, 128)).astype(np.float32) / 22,
    }
    batch = (rng.normal(size=(512, 128)).astype(np.float32),) * 2
    f = pjit(step, in_axis_resources=(AUTO, (P("data"), P("data"))), out_axis_resources=AUTO)
    with jax.set_mesh(mesh):
        report = f.lower(params, batch).report()
    report.auto.visualize(png=str(path), show=False)


def auto_remat_layouts(mesh: jax.sharding.Mesh, path: Path) -> None:
    """The how-to's scan of 8 transformer blocks under 60% of its layout-only memory:
    the layouts AUTO chooses, its scan rematerialized (docs/howto/auto.md)."""

    def block(x: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        b, s, m = x.shape
        h = jax.nn.standardize(x)
        q, k, v = (t.reshape(b, s, 2, m // 2) for t in jnp.split(h @ p["wqkv"], 3, -1))
        a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(m // 2), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, m) @ p["wo"]
        return x + jax.nn.gelu(jax.nn.standardize(x) @ p["w1"]) @ p["w2"], None

    def step(params: dict[str, jax.Array], batch: tuple) -> dict[str, jax.Array]:
        def loss(params: dict[str, jax.Array], batch: tuple) -> jax.Array:
            h, _ = jax.lax.scan(block, batch[0], params)
            return jnp.mean((h - batch[1]) ** 2)

        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    rng = np.random.default_rng(0)

    def stacked(*shape: int) -> np.ndarray:
        return rng.normal(size=(8, *shape)).astype(np.float32) / (4 * math.sqrt(shape[0]))

    layers = {"wqkv": stacked(32, 96), "wo": stacked(32, 32), "w1": stacked(32, 128)}
    layers["w2"] = stacked(128, 32)
    tokens = (rng.normal(size=(16, 32, 32)).astype(np.float32),) * 2
    specs = {"in_axis_resources": (AUTO, (P("data"), P("data"))), "out_axis_resources": AUTO}
    with jax.set_mesh(mesh):
        alone = pjit(step, **specs).lower(layers, tokens).report().memory.total
        fitted = pjit(step, **specs, auto_memory_limit=int(0.6 * alone))
        report = fitted.lower(layers, tokens).report()
    report.auto.visualize(png=str(path), show=False)


def pipeline_schedules(path: Path) -> None:
    """The pipeline how-to's schedules, drawn by ``PipelinePlan.chart(png=...)``: gpipe,
    circular, 1F1B, interleaved 1F1B and zero bubble, 8 layers on 4 stages, 4
    microbatches (8 for 1F1B and zero bubble) (docs/howto/pipeline.md)."""
    import partitioner

    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("stage", "data"))
    params = {"w": jnp.zeros((8, 16, 16))}
    x, targets = jnp.zeros((32, 16)), jnp.zeros((32, 16))

    def head(_: jax.Array, h: jax.Array, t: jax.Array) -> jax.Array:
        return jnp.mean((h - t) ** 2)

    for schedule in ("gpipe", "circular", "1f1b", "interleaved-1f1b", "zero-bubble"):
        count = 8 if schedule in ("1f1b", "zero-bubble") else 4
        run = partitioner.pipeline(
            lambda p, h: h @ p["w"], axis="stage", microbatches=count, schedule=schedule,
            loss=head,
        )  # fmt: skip
        with jax.set_mesh(mesh):
            plan = run.plan(params, x, jnp.zeros(()), targets)
            plan.chart(png=str(path / f"pipeline_{schedule}.png"))


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    layouts(mesh)
    collectives_picture(training_step_report(mesh), IMAGES / "step_collectives.png")
    auto_layouts(mesh, IMAGES / "auto_layouts.png")
    auto_remat_layouts(mesh, IMAGES / "auto_remat_layouts.png")
    pipeline_schedules(IMAGES)


if __name__ == "__main__":
    main()
