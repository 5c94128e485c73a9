"""bench_auto's rematerialization rows: AUTO under a memory limit against the hand plan
"Megatron + ``jax.checkpoint`` on every block".

Why a module of its own: the case is one program written twice (as a user writes it,
and with ``jax.checkpoint`` on its block by hand) and the rows read XLA's memory and
cost analyses, none of bench_auto's timing machinery.

The program: an activation-heavy train step, a ``lax.scan`` of 8 transformer blocks
(``models.remat_block``, the block tests/auto/test_remat.py recomputes at smaller
sizes) over stacked parameters on the 4x2 mesh. The hand plan lays the parameters out as
Megatron does and checkpoints each block (jax's default policy: nothing saved but the
block's inputs). AUTO gets the hand plan's memory as ``auto_memory_limit``; the targets:
its memory <= the hand plan's, and the flops it recomputes (XLA's cost analysis of the
program minus that of the same layouts recomputing nothing) <= the hand plan's. The
flops recomputed depend on the layouts as well as on the policy (a layout that splits
less recomputes more per device), so each program's flops per device are shown too.
"""

from __future__ import annotations

from typing import Any

import common
import jax
import jax.numpy as jnp
import models

import partitioner
from partitioner import AUTO
from partitioner import PartitionSpec as P

LAYERS, BATCH, SEQ, WIDTH, HIDDEN = 8, 32, 64, 64, 256  # models.remat_block: 4 heads
MEGATRON = {
    "wqkv": P(None, None, "model"),
    "wo": P(None, "model", None),
    "w1": P(None, None, "model"),
    "w2": P(None, "model", None),
}
AT_MOST = common.Target("<= 1.00x", hi=1.0)


def _step(block: Any, unrolled: bool = False) -> Any:
    def loss(p: Any, batch: models.Batch) -> jax.Array:
        if unrolled:  # a Python loop over a list of per-layer dicts
            h = batch[0]
            for layer in p:
                h, _ = block(h, layer)
        else:
            h, _ = jax.lax.scan(block, batch[0], p)
        return jnp.mean((h - batch[1]) ** 2)

    def step(p: Any, batch: models.Batch) -> Any:
        value, grads = jax.value_and_grad(loss)(p, batch)
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), value

    return step


def _report(step: Any, specs: Any, unrolled: bool = False, **kw: Any) -> Any:
    params: Any = models.remat_params(LAYERS, WIDTH, HIDDEN)
    if unrolled:
        params = [jax.tree.map(lambda a, i=i: a[i], params) for i in range(LAYERS)]
    batch = models.batch((BATCH, SEQ, WIDTH), jax.random.key(2))
    f = partitioner.pjit(step, (specs, models.BATCH_SPECS), (specs, P()), **kw)
    return f.lower(params, batch).compile().report()


def _against_hand(
    name: str, ours: Any, hand: Any, hand_added: float, extra: dict[str, Any]
) -> list[common.Row]:
    """The two targets: AUTO's memory and recomputed flops, each <= the hand plan's."""
    return [
        common.compare(
            f"{name}: memory / Megatron + checkpoint",
            "KiB/device",
            [ours.memory.total],
            [hand.memory.total],
            AT_MOST,
            1 / 1024,
            **extra,
        ),
        common.compare(
            f"{name}: flops recomputed / Megatron + checkpoint",
            "Mflop",
            [ours.auto.choice.flops_added or 0.0],
            [hand_added],
            AT_MOST,
            1e-6,
        ),
    ]


def remat_rows() -> list[common.Row]:
    """AUTO's plan under the hand plan's memory against the hand plan (module docstring)."""
    plain = _report(_step(models.remat_block), MEGATRON)
    hand = _report(_step(jax.checkpoint(models.remat_block)), MEGATRON)
    layout_only = _report(_step(models.remat_block), AUTO)
    ours = _report(_step(models.remat_block), AUTO, auto_memory_limit=hand.memory.total)
    choice = ours.auto.choice
    hand_added = hand.cost.flops - plain.cost.flops
    extra = {
        "policy": choice.remat,
        "auto_memory_bytes": ours.memory.total,
        "hand_memory_bytes": hand.memory.total,
        "megatron_memory_bytes": plain.memory.total,
        "auto_layout_only_memory_bytes": layout_only.memory.total,
        "auto_flops_added": choice.flops_added,
        "hand_flops_added": hand_added,
        "search_s": choice.search_s,
        "auto_collective_bytes": ours.collective_bytes,
        "hand_collective_bytes": hand.collective_bytes,
        "auto_specs": dict(zip(choice.paths, choice.chosen.specs, strict=True)),
    }
    return [
        *_against_hand("remat", ours, hand, hand_added, extra),
        common.compare(
            "remat: flops per device / Megatron + checkpoint",
            "Mflop",
            [ours.cost.flops],
            [hand.cost.flops],
            None,
            1e-6,
        ),
        common.compare(
            "remat: layout-only memory / with checkpoint",
            "KiB/device",
            [layout_only.memory.total],
            [hand.memory.total],
            None,
            1 / 1024,
        ),
    ]


def unrolled_rows() -> list[common.Row]:
    """The same blocks unrolled (a Python loop over per-layer dicts), under a limit of
    0.6x AUTO's layout-only memory: AUTO recomputes layers (NOTE [auto remat unrolled]);
    the hand plan is Megatron + ``jax.checkpoint`` on every block, unrolled. On XLA:CPU
    that hand plan holds what Megatron alone holds: XLA's pipeline drops the
    checkpoint's optimization barriers before merging common subexpressions, and the
    recomputation is merged back into the forward pass."""
    megatron = [{n: P(*spec[1:]) for n, spec in MEGATRON.items()}] * LAYERS
    plain = _report(_step(models.remat_block, True), megatron, True)
    hand = _report(_step(jax.checkpoint(models.remat_block), True), megatron, True)
    layout_only = _report(_step(models.remat_block, True), AUTO, True)
    limit = int(0.6 * layout_only.memory.total)
    ours = _report(_step(models.remat_block, True), AUTO, True, auto_memory_limit=limit)
    choice = ours.auto.choice
    hand_added = hand.cost.flops - plain.cost.flops
    extra = {
        "policy": choice.remat,
        "limit_bytes": limit,
        "auto_layout_only_memory_bytes": layout_only.memory.total,
        "megatron_memory_bytes": plain.memory.total,
        "auto_flops_added": choice.flops_added,
        "hand_flops_added": hand_added,
        "search_s": choice.search_s,
    }
    return [
        *_against_hand("remat unrolled", ours, hand, hand_added, extra),
        common.compare(
            "remat unrolled: memory / AUTO layout-only",
            "KiB/device",
            [ours.memory.total],
            [layout_only.memory.total],
            common.Target("<= 0.60x", hi=0.6),
            1 / 1024,
        ),
    ]


if __name__ == "__main__":  # the rows alone: python benchmarks/remat_case.py
    with partitioner.mesh(models.mesh_4x2().devices, ("data", "model")):
        rows = remat_rows() + unrolled_rows()
    common.print_rows("AUTO under a memory limit vs Megatron + jax.checkpoint, 4x2 mesh", rows)
    for row in rows:
        for k, v in row.extra.items():
            print(f"  {k}: {v}")
