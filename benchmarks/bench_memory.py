"""Figure 4: per-device memory of the train step, partitioner vs jax.jit, under both partitioners.

Why: our lowering must not make XLA keep more live per device than jax.jit does. The
figure reads XLA's own ``memory_analysis()`` of both compiled steps (temp + argument +
output - alias bytes per device). The "nested loss" variant takes the gradient of a
pjit-ed loss inside the pjit-ed step: the values the backward pass keeps (residuals)
are left for XLA to lay out (NOTE [residual shardings]), so it must cost no more than
jax.jit's nested-jit equivalent. The "offloaded optimizer state" row keeps the step's
momentum in ``pinned_host`` memory (NamedShardings with ``memory_kind``, moved to the
device and back with ``jax.device_put`` inside the step): it counts the bytes device 0
holds in *device* memory (its arguments and results that live there, plus XLA's temp),
so a memory kind dropped anywhere would show up as extra device bytes. The "donated step,
no shardings" row is a flax + optax step wrapped as ``jit(step, donate_argnums=0)`` over
a state committed FSDP-style: XLA chooses every layout, and the donated state must be
consumed as under jax.jit (a step that kept it would hold two copies). Memory
statistics are deterministic: one compile each.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
from collections.abc import Callable
from typing import Any

import jax
import models
from jax.sharding import NamedSharding

import partitioner
from partitioner import PartitionSpec as P

NAME = "memory"
TARGET = common.Target("<= 1.00x", hi=1.0)
FIELDS = (
    "temp_size_in_bytes",
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
)


def per_device_bytes(stats: Any) -> tuple[int, dict[str, int]]:
    """temp + argument + output - alias: the bytes a device holds while the step runs."""
    parts = {f: int(getattr(stats, f)) for f in FIELDS}
    total = (
        parts["temp_size_in_bytes"]
        + parts["argument_size_in_bytes"]
        + parts["output_size_in_bytes"]
    )
    return total - parts["alias_size_in_bytes"], parts


def _steps(
    nested: bool,
) -> tuple[Any, Any, Any]:
    """(partitioner step, jax.jit step, partitioner loss or None) for one variant."""
    mesh = models.mesh_4x2()
    in_specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    out_specs = models.BLOCK_PARAM_SPECS
    ours_loss = theirs_loss = None
    if nested:
        ours_loss = partitioner.pjit(models.loss, in_specs, P())
        theirs_loss = jax.jit(
            models.loss,
            in_shardings=models.to_jax(in_specs, mesh),
            out_shardings=NamedSharding(mesh, jax.sharding.PartitionSpec()),
        )
    ours = partitioner.pjit(models.train_step(ours_loss or models.loss), in_specs, out_specs)
    theirs = jax.jit(
        models.train_step(theirs_loss or models.loss),
        in_shardings=models.to_jax(in_specs, mesh),
        out_shardings=models.to_jax(out_specs, mesh),
    )
    return ours, theirs, ours_loss


def measure(mode: str, nested: bool) -> tuple[common.Row, dict[str, Any]]:
    mesh = models.mesh_4x2()
    params, batch = models.block_params(), models.block_batch()
    name = f"{mode}/{'nested_loss_step' if nested else 'train_step'}"
    with partitioner.spmd_partitioner(mode), partitioner.mesh(mesh.devices, mesh.axis_names):
        ours, theirs, ours_loss = _steps(nested)
        ours_total, ours_parts = per_device_bytes(
            ours.lower(params, batch).compile().memory_analysis()
        )
        lowered = theirs.lower(params, batch)
        theirs_total, theirs_parts = per_device_bytes(lowered.compile().memory_analysis())
        jax_annotation = "sdy.sharding" if "sdy.sharding" in lowered.as_text() else "mhlo.sharding"
        residuals = (
            [str(r) for r in partitioner.residuals(ours_loss, params, batch)] if ours_loss else []
        )
    kib = 1 / 1024
    row = common.compare(
        name,
        "KiB/device",
        [ours_total],
        [theirs_total],
        TARGET,
        kib,
        partitioner_bytes=ours_parts,
        jax_jit_bytes=theirs_parts,
        jax_jit_annotation=jax_annotation,
    )
    return row, {"residuals": residuals}


def _held_bytes(f: Callable[..., Any], params: Any, batch: Any) -> tuple[int, int]:
    """(arrays, bytes on device 0) that ``jax.vjp(f, ...)``'s closure holds for the backward pass."""
    _, f_vjp = jax.vjp(f, params, batch)
    held = [x for x in jax.tree.leaves(f_vjp) if isinstance(x, jax.Array)]
    jax.block_until_ready(held)
    device0 = models.mesh_4x2().devices.flat[0]
    per_device = sum(
        s.data.nbytes for x in held for s in x.addressable_shards if s.device == device0
    )
    return len(held), per_device


def measure_eager_vjp(mode: str) -> common.Row:
    """Residuals of an eager ``jax.vjp`` of the pjit-ed loss, vs of the jax.jit-ed loss.

    Outside any enclosing program, forward and backward are separate executables
    and the residuals live in between, laid out as XLA chose for each library.
    """
    mesh = models.mesh_4x2()
    in_specs = (models.BLOCK_PARAM_SPECS, models.BATCH_SPECS)
    params = jax.device_put(models.block_params(), models.to_jax(models.BLOCK_PARAM_SPECS, mesh))
    batch = jax.device_put(models.block_batch(), models.to_jax(models.BATCH_SPECS, mesh))
    with partitioner.spmd_partitioner(mode), partitioner.mesh(mesh.devices, mesh.axis_names):
        ours = partitioner.pjit(models.loss, in_specs, P())
        theirs = jax.jit(
            models.loss,
            in_shardings=models.to_jax(in_specs, mesh),
            out_shardings=NamedSharding(mesh, jax.sharding.PartitionSpec()),
        )
        n_ours, b_ours = _held_bytes(ours, params, batch)
        n_theirs, b_theirs = _held_bytes(theirs, params, batch)
    return common.compare(
        f"{mode}/eager_vjp_residuals",
        "KiB/device",
        [b_ours],
        [b_theirs],
        TARGET,
        1 / 1024,
        partitioner_arrays=n_ours,
        jax_jit_arrays=n_theirs,
    )


def _offload_step(device: Any, host: Any) -> Callable[..., Any]:
    """A momentum-SGD step whose optimizer state lives in ``host`` memory between steps."""

    def step(params: Any, momentum: Any, batch: Any) -> tuple[Any, Any]:
        grads = jax.grad(models.loss)(params, batch)
        momentum = jax.device_put(momentum, device)  # host -> device for the update
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 1e-2 * m, params, momentum)
        return params, jax.device_put(momentum, host)  # back to host memory

    return step


def _device_resident_bytes(arrays: Any, temp: int) -> int:
    """Bytes device 0 holds in device memory: its shards of ``arrays`` living there, plus temp."""
    device0 = models.mesh_4x2().devices.flat[0]
    held = sum(
        s.data.nbytes
        for x in jax.tree.leaves(arrays)
        if x.sharding.memory_kind == "device"
        for s in x.addressable_shards
        if s.device == device0
    )
    return held + temp


def measure_offload(mode: str) -> common.Row:
    """Device bytes of a train step with its optimizer state in pinned_host, vs jax.jit."""
    mesh = models.mesh_4x2()
    dev = models.to_jax(models.BLOCK_PARAM_SPECS, mesh)
    host = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), dev)
    batch_s = models.to_jax(models.BATCH_SPECS, mesh)
    params = jax.device_put(models.block_params(), dev)
    momentum = jax.device_put(jax.tree.map(jax.numpy.zeros_like, models.block_params()), host)
    batch = jax.device_put(models.block_batch(), batch_s)
    step = _offload_step(dev, host)
    shardings = {"in_shardings": (dev, host, batch_s), "out_shardings": (dev, host)}
    figures = {}
    with partitioner.spmd_partitioner(mode):
        for who, make in (("partitioner", partitioner.pjit), ("jax_jit", jax.jit)):
            f = make(step, **shardings)
            stats = f.lower(params, momentum, batch).compile().memory_analysis()
            outs = jax.block_until_ready(f(params, momentum, batch))
            figures[who] = {
                "device_bytes": _device_resident_bytes(
                    (params, momentum, batch, outs), int(stats.temp_size_in_bytes)
                ),
                "state_memory_kinds": sorted(
                    {x.sharding.memory_kind for x in jax.tree.leaves(outs[1])}
                ),
                "memory_analysis": per_device_bytes(stats)[1],
            }
    return common.compare(
        f"{mode}/offloaded_opt_state_step",
        "KiB/device",
        [figures["partitioner"]["device_bytes"]],
        [figures["jax_jit"]["device_bytes"]],
        TARGET,
        1 / 1024,
        partitioner_offload=figures["partitioner"],
        jax_jit_offload=figures["jax_jit"],
    )


def _flax_state(mesh: Any) -> tuple[Any, Any, Any]:
    """A flax linen MLP's params and adamw state, committed FSDP-style over "data", and a batch."""
    import flax.linen as nn
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(64)(nn.relu(nn.Dense(256)(x)))

    model, tx = MLP(), optax.adamw(1e-3)
    x = jax.numpy.linspace(-1, 1, 64 * 64, dtype=jax.numpy.float32).reshape(64, 64)
    params = model.init(jax.random.key(0), x[:1])

    def fsdp(leaf: Any) -> NamedSharding:
        split = leaf.ndim and leaf.shape[0] % mesh.shape["data"] == 0
        return NamedSharding(mesh, P("data") if split else P())

    state = {"params": params, "opt": tx.init(params)}
    state = jax.device_put(state, jax.tree.map(fsdp, state))
    batch = jax.device_put((x, jax.numpy.cos(x)), NamedSharding(mesh, P("data")))

    def step(state: Any, batch: Any) -> Any:
        def loss(p: Any) -> Any:
            return jax.numpy.mean((model.apply(p, batch[0]) - batch[1]) ** 2)

        grads = jax.grad(loss)(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}

    return step, state, batch


def measure_donated_no_shardings(mode: str) -> common.Row:
    """A donated flax + optax step with no shardings given (``jit(step, donate_argnums=0)``),
    its state committed sharded: per-device bytes, and whether the donated inputs are
    consumed, as under jax.jit (a step that keeps them holds two copies of the state)."""
    mesh = models.mesh_4x2()
    figures = {}
    with partitioner.spmd_partitioner(mode):
        for who, make in (("partitioner", partitioner.jit), ("jax_jit", jax.jit)):
            step, state, batch = _flax_state(mesh)
            f = make(step, donate_argnums=0)
            stats = f.lower(state, batch).compile().memory_analysis()
            total, parts = per_device_bytes(stats)
            consumed = []
            for _ in range(3):
                new = jax.block_until_ready(f(state, batch))
                consumed.append(all(x.is_deleted() for x in jax.tree.leaves(state)))
                state = new
            figures[who] = {"bytes": total, "parts": parts, "consumed": consumed}
    return common.compare(
        f"{mode}/donated_step_no_shardings",
        "KiB/device",
        [figures["partitioner"]["bytes"]],
        [figures["jax_jit"]["bytes"]],
        TARGET,
        1 / 1024,
        partitioner_bytes=figures["partitioner"]["parts"],
        jax_jit_bytes=figures["jax_jit"]["parts"],
        partitioner_consumed=figures["partitioner"]["consumed"],
        jax_jit_consumed=figures["jax_jit"]["consumed"],
    )


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    # Quick: the nested variant alone (it runs every code path the plain one does).
    modes, variants = (("shardy",), (True,)) if args.quick else (("shardy", "gspmd"), (False, True))
    rows: list[common.Row] = []
    details: dict[str, Any] = {}
    for mode in modes:
        for nested in variants:
            row, info = measure(mode, nested)
            rows.append(row)
            details[row.name] = info
        rows.append(measure_eager_vjp(mode))
        rows.append(measure_offload(mode))
        rows.append(measure_donated_no_shardings(mode))
    common.print_rows("per-device memory of the train step", rows)
    for name, info in details.items():
        if info.get("residuals"):
            print(f"\nresiduals XLA laid out ({name}):")
            print("\n".join(f"  {r}" for r in info["residuals"]))
    common.write_json(NAME, rows, args.quick, details=details)
    common.save_plot(NAME, lambda fig: _draw(fig, rows))


def _draw(fig: Any, rows: list[common.Row]) -> None:
    """Left: stacked per-device bytes of the steps. Right: eager vjp residual bytes."""
    steps = [r for r in rows if "partitioner_bytes" in r.extra]
    held = [r for r in rows if "partitioner_bytes" not in r.extra]
    ax = fig.add_subplot(1, 3, (1, 2))
    width = 0.38
    parts = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    for i, who in enumerate(("partitioner_bytes", "jax_jit_bytes")):
        xs = [x + (i - 0.5) * width for x in range(len(steps))]
        bottom = [0.0] * len(steps)
        for j, part in enumerate(parts):
            vals = [r.extra[who][part] / 1024 for r in steps]
            label = f"{'partitioner' if i == 0 else 'jax.jit'}: {part.split('_')[0]}"
            ax.bar(xs, vals, width, bottom=bottom, label=label, color=f"C{3 * i + j}")
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    common.annotate_ratios(ax, steps)
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([r.name for r in steps], fontsize=7)
    ax.set_ylabel("KiB per device")
    ax.set_title("train step (memory_analysis)")
    ax.set_ylim(
        top=1.45 * max(max(r.partitioner, r.jax_jit or 0) for r in steps)
    )  # room for the legend
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    if held:
        right = fig.add_subplot(1, 3, 3)
        pos = range(len(held))
        right.bar([x - 0.2 for x in pos], [r.partitioner for r in held], 0.4, label="partitioner")
        right.bar([x + 0.2 for x in pos], [r.jax_jit or 0.0 for r in held], 0.4, label="jax.jit")
        right.set_xticks(list(pos))
        short = {"eager_vjp_residuals": "vjp", "offloaded_opt_state_step": "offload"}
        right.set_xticklabels(
            [f"{r.name.split('/')[0]}\n{short.get(r.name.split('/')[1], '')}" for r in held],
            fontsize=7,
        )
        right.set_title("vjp residuals | step, state on host", fontsize=9)
        right.set_ylabel("KiB per device")
        right.set_ylim(top=1.3 * max(r.partitioner for r in held))
        right.legend(fontsize=7, loc="upper center")
    fig.suptitle("per-device memory, 4x2 mesh (lower is better)")


if __name__ == "__main__":
    main()
