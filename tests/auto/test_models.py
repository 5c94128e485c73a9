"""AUTO on the layers models are made of: a CNN, an embedding with a tied softmax, a
mixture-of-experts layer, and a transformer (benchmarks/models.py's RMS block, as
bench_auto's) written as a scan over stacked layers and as its unrolled twin.

Every figure is XLA's (the report's collectives and memory analysis of the compiled
program). For each program the chosen layout is not beaten on both collective bytes
and memory by the replicated layout, by plain data parallelism or by the layout a
person writes; the scanned and unrolled transformers get equal figures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import partitioner
from benchmarks import models
from partitioner import AUTO
from partitioner import PartitionSpec as P

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow


def sgd(loss: Callable[..., Any]) -> Callable[..., Any]:
    def step(params: Any, batch: Any) -> Any:
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

    return step


def _normal(key: int, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    return jax.random.normal(jax.random.key(key), shape) * scale


# --- the programs ---


def cnn_params() -> dict[str, jax.Array]:
    return {
        "conv1": _normal(1, (3, 3, 8, 32), 0.2),
        "conv2": _normal(2, (3, 3, 32, 64), 0.06),
        "dense": _normal(3, (64 * 4 * 4, 16), 0.03),
    }


def cnn_loss(p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch

    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.nn.relu(jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn))

    def pool(x: jax.Array) -> jax.Array:
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    h = pool(conv(pool(conv(x, p["conv1"])), p["conv2"]))
    logits = h.reshape(h.shape[0], -1) @ p["dense"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))


def cnn_batch() -> tuple[jax.Array, jax.Array]:
    return _normal(4, (16, 16, 16, 8)), jax.nn.one_hot(jnp.arange(16) % 16, 16)


VOCAB, WIDTH = 2048, 64


def embed_params() -> dict[str, jax.Array]:
    return {"embed": _normal(5, (VOCAB, WIDTH), 0.1), "w": _normal(6, (WIDTH, WIDTH), 0.1)}


def embed_loss(p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    ids, labels = batch
    h = jnp.tanh(p["embed"][ids] @ p["w"])
    logits = h @ p["embed"].T  # the softmax tied to the embedding
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)
    return -jnp.mean(picked)


def embed_batch() -> tuple[jax.Array, jax.Array]:
    ids = jax.random.randint(jax.random.key(7), (16, 8), 0, VOCAB)
    return ids, (ids * 7 + 3) % VOCAB


EXPERTS, D, F = 8, 64, 256


def moe_params() -> dict[str, jax.Array]:
    return {
        "router": _normal(8, (D, EXPERTS), 0.1),
        "w_in": _normal(9, (EXPERTS, D, F), 1 / math.sqrt(D)),
        "w_out": _normal(10, (EXPERTS, F, D), 1 / math.sqrt(F)),
    }


def moe_loss(p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Top-1 routing by one-hot dispatch: every expert's weights a slice of a stack."""
    x, y = batch
    gates = jax.nn.softmax(x @ p["router"])
    dispatch = jax.nn.one_hot(jnp.argmax(gates, -1), EXPERTS) * gates
    routed = jnp.einsum("te,td->etd", dispatch, x)
    h = jax.nn.gelu(jnp.einsum("etd,edf->etf", routed, p["w_in"]))
    out = jnp.einsum("etf,efd->td", h, p["w_out"])
    return jnp.mean((out - y) ** 2)


def moe_batch() -> tuple[jax.Array, jax.Array]:
    return _normal(11, (128, D)), _normal(12, (128, D))


LAYERS, MODEL, FF = 3, 64, 256  # models.rms_block: 4 heads


def scan_loss(p: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return jnp.mean((models.plain_scan(models.rms_block)(p, x) - y) ** 2)


def unrolled_loss(ps: list[dict[str, jax.Array]], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    for p in ps:
        x = models.rms_block(p, x)
    return jnp.mean((x - y) ** 2)


def unrolled_params() -> list[dict[str, jax.Array]]:
    return [models.rms_block_params(13 + 7 * i, MODEL, FF) for i in range(LAYERS)]


def scan_params() -> dict[str, jax.Array]:
    return models.stack(unrolled_params())


def layers_batch() -> tuple[jax.Array, jax.Array]:
    return _normal(40, (8, 16, MODEL)), _normal(41, (8, 16, MODEL))


MEGATRON = {"ln": P(), "wqkv": P(None, "model"), "wo": P("model"), "w1": P(None, "model"),
            "w2": P("model")}  # fmt: skip


@dataclass(frozen=True)
class Program:
    loss: Callable[..., Any]
    params: Callable[[], Any]
    batch: Callable[[], Any]
    hand: Any  # the layout a person writes for the parameters
    batch_specs: Any = (P("data"), P("data"))


PROGRAMS = {
    # data parallelism, the conv kernels' output features and the head split over "model"
    "cnn": Program(cnn_loss, cnn_params, cnn_batch,
                   {"conv1": P(None, None, None, "model"), "conv2": P(None, None, None, "model"),
                    "dense": P(None, "model")}),
    # a vocabulary-parallel embedding, tied to the softmax
    "embedding": Program(embed_loss, embed_params, embed_batch,
                         {"embed": P("model"), "w": P()}),
    # expert parallelism: each expert's weights on its devices
    "moe": Program(moe_loss, moe_params, moe_batch,
                   {"router": P(), "w_in": P(("data", "model")), "w_out": P(("data", "model"))}),
    "scan": Program(scan_loss, scan_params, layers_batch,
                    {k: P(None, *s) for k, s in MEGATRON.items()}),
    "unrolled": Program(unrolled_loss, unrolled_params, layers_batch, [MEGATRON] * LAYERS),
}  # fmt: skip


def figures(
    mesh: Mesh, prog: Program, specs: Any, params: Any, batch: Any
) -> tuple[float, float, Any]:
    """(collective bytes, memory, report) of ``prog``'s step laid out by ``specs``, XLA's."""
    f = partitioner.pjit(sgd(prog.loss), (specs, prog.batch_specs), specs)
    with jax.set_mesh(mesh):
        report = f.lower(params, batch).compile().report()
    return float(report.collective_bytes), float(report.memory.total), report


@functools.cache
def judge(name: str, mesh: Mesh) -> dict[str, Any]:
    """XLA's figures for ``name`` laid out by AUTO and by hand (once per run), and the
    replicated program's, as the search measured it beside its choice."""
    prog = PROGRAMS[name]
    params, batch = prog.params(), prog.batch()
    auto = figures(mesh, prog, AUTO, params, batch)
    (replicated,) = [b for b in auto[2].auto.choice.baselines if b.name.startswith("replicated")]
    c = replicated.candidate
    return {
        "name": name, "prog": prog, "params": params, "batch": batch, "auto": auto,
        "hand": figures(mesh, prog, prog.hand, params, batch),
        "replicated": (c.measured_collective_bytes, c.measured_memory_bytes, None),
    }  # fmt: skip


@pytest.fixture(params=sorted(PROGRAMS))
def judged(request: pytest.FixtureRequest, mesh_4x2: Mesh) -> dict[str, Any]:
    return judge(request.param, mesh_4x2)


def _beaten(theirs: tuple[Any, ...], ours: tuple[Any, ...]) -> bool:
    return theirs[0] <= ours[0] and theirs[1] <= ours[1] and theirs[:2] != ours[:2]


def test_the_choice_is_not_beaten_by_the_obvious_layouts(judged: dict[str, Any]) -> None:
    """Not by the hand layout, nor by the baselines the search measured beside its
    choice (the replicated and data-parallel programs, shown in the report)."""
    auto = judged["auto"]
    report = auto[2]
    assert not _beaten(judged["hand"], auto), (judged["name"], str(report))
    baselines = report.auto.choice.baselines
    assert baselines and "replicated" in str(report).split("auto:")[1]
    for b in baselines:
        measured = (b.candidate.measured_collective_bytes, b.candidate.measured_memory_bytes)
        assert not _beaten(measured, auto), (judged["name"], b.name, str(report))


def test_a_baseline_is_measured_as_its_own_program(mesh_4x2: Mesh) -> None:
    """The replicated baseline's figures are XLA's for the replicated program (compiled
    quickly during the search, as the program it is)."""
    found = judge("embedding", mesh_4x2)
    prog = found["prog"]
    replicated = jax.tree.map(lambda _: P(), prog.hand, is_leaf=lambda x: isinstance(x, P))
    assert (
        figures(mesh_4x2, prog, replicated, found["params"], found["batch"])[:2]
        == found["replicated"][:2]
    )


@pytest.mark.parametrize("name", ["cnn", "embedding", "moe", "scan"])
def test_the_choice_trains_as_jax_jit(name: str, mesh_4x2: Mesh) -> None:
    judged = judge(name, mesh_4x2)
    prog, params, batch = judged["prog"], judged["params"], judged["batch"]
    step = sgd(prog.loss)
    f = partitioner.pjit(step, (AUTO, prog.batch_specs), AUTO)
    with jax.set_mesh(mesh_4x2):
        ours = f(params, batch)
    theirs = jax.jit(step)(params, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), ours, theirs)


def test_scan_and_unrolled_twins_get_equal_figures(mesh_4x2: Mesh) -> None:
    """The same layers as a scan over stacked parameters and unrolled: equal collective
    bytes, and memory close: the scan's body keeps only its matmuls' outputs, as XLA
    does for the unrolled twin (NOTE [auto scan residuals]; without it the scan held
    1.47x here). Within 15% over 3 layers, where the loop's own buffers weigh more
    than over bench_auto's 8 (0.90x there)."""
    scan, unrolled = judge("scan", mesh_4x2)["auto"], judge("unrolled", mesh_4x2)["auto"]
    assert scan[0] == pytest.approx(unrolled[0], rel=0.05)
    assert scan[1] <= 1.15 * unrolled[1], (scan[:2], unrolled[:2])
    assert scan[2].auto.choice.remat == ((f"scan #1 ({LAYERS} steps)", "dots_saveable"),)
    assert not scan[2].auto.choice.remat_to_fit
