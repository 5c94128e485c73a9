"""Figure 7: host-callback throughput and the cost of a tap in a train step.

Why: ``id_tap`` must not be the slow way to see values from inside a program. Its
competitor is jax's own ordered host callback in the same loop:
``jax.debug.callback(..., ordered=True)`` on one device. jax.jit refuses ordered
debug callbacks on more than one device, so on 8 devices the competitor is
``io_callback(..., ordered=True)``, the ordered callback jax does shard.

Throughput: a program runs a ``fori_loop`` whose every iteration taps a fresh
value (a small (4,) float32 or a 1 MiB array; sharded ``P('x')`` over 8 devices or
on one), and a sample is one launch until every tap function has run
(``barrier_wait()`` for ours, ``jax.effects_barrier()`` for jax's, whose callbacks
run inline). Both tap functions do the same: count the call. The table's unit is
time per tap, so the ratio is the inverse of the throughput ratio.

Step overhead: the MLP train step on one device, with one tap of its loss and
gradient norm and without; a row compares the per-round differences (the tap's
cost per step) of id_tap (in a pjit, and in a jax.jit) with that of
debug.callback in a jax.jit.
"""

from __future__ import annotations

import common  # first: sets XLA_FLAGS before jax is imported

# isort: split
import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import models
import numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding

import partitioner
from partitioner import PartitionSpec as P
from partitioner.host_callback import barrier_wait, id_tap

NAME = "callbacks"
#: Issue 33: at most 0.8 of jax's time per tap in every row.
THROUGHPUT = common.Target("<= 0.80x (throughput >= 1.25x)", hi=0.80)
OVERHEAD = common.Target("<= 1.10x", hi=1.10)
MiB = 1 << 20


class Counter:
    """The tap function of both contenders: count, touch nothing."""

    def __init__(self) -> None:
        self.n = 0

    def ours(self, x: Any, transforms: tuple[str, ...]) -> None:
        self.n += 1

    def theirs(self, x: Any) -> None:
        self.n += 1


def tapping_loop(tap: Callable[[Any], None], taps: int) -> Callable[[Any], Any]:
    """A program tapping ``x + i`` in each of ``taps`` iterations."""

    def program(x: Any) -> Any:
        def body(i: Any, x: Any) -> Any:
            y = x + i.astype(x.dtype)
            tap(y)
            return y

        return jax.lax.fori_loop(0, taps, body, x)

    return program


class Launch:
    """A sampler: one launch of ``fn``, then wait until its taps have run."""

    def __init__(
        self, fn: Any, x: Any, wait: Callable[[], None], counter: Counter, taps: int
    ) -> None:
        self.fn, self.x, self.wait, self.counter, self.taps = fn, x, wait, counter, taps

    def __call__(self) -> common.Timing:
        self.counter.n = 0
        with common.stopwatch() as t:
            jax.block_until_ready(self.fn(self.x))
            self.wait()
        if self.counter.n != self.taps:
            raise AssertionError(f"{self.counter.n} of {self.taps} taps arrived")
        return t[0] / self.taps


def throughput_row(
    name: str, n_devices: int, payload_bytes: int, taps: int, rounds: int
) -> common.Row:
    devices = np.array(jax.devices()[:n_devices])
    mesh = Mesh(devices, ("x",))
    sharding = NamedSharding(mesh, P("x"))
    x = jax.device_put(np.zeros(payload_bytes // 4, np.float32), sharding)
    counter = Counter()

    def our_tap(y: Any) -> None:
        id_tap(counter.ours, y)

    def their_tap(y: Any) -> None:
        if n_devices == 1:
            jax.debug.callback(counter.theirs, y, ordered=True)
        else:
            io_callback(counter.theirs, None, y, ordered=True)

    with partitioner.mesh(devices, ("x",)):
        ours = partitioner.pjit(tapping_loop(our_tap, taps), P("x"), P("x"))
        theirs = jax.jit(
            tapping_loop(their_tap, taps), in_shardings=sharding, out_shardings=sharding
        )
        samples = common.interleave(
            {
                "partitioner": Launch(ours, x, barrier_wait, counter, taps),
                "jax.jit": Launch(theirs, x, jax.effects_barrier, counter, taps),
            },
            rounds,
        )
    row = common.compare(
        name,
        "us/tap",
        samples["partitioner"],
        samples["jax.jit"],
        THROUGHPUT,
        1e6,
        payload_bytes=payload_bytes,
        devices=n_devices,
        taps_per_launch=taps,
        competitor="jax.debug.callback(ordered=True)"
        if n_devices == 1
        else "io_callback(ordered=True)",
    )
    for side, key in (("partitioner", "partitioner"), ("jax_jit", "jax.jit")):
        per_tap = statistics.median(s.wall for s in samples[key])
        row.extra[f"{side}_taps_per_s"] = 1 / per_tap
        row.extra[f"{side}_MB_per_s"] = payload_bytes / per_tap / 1e6
    return row


# --- a tap in a train step ---


def _tapped_step(tap: Callable[[Any], None] | None) -> Callable[..., Any]:
    def step(params: Any, x: Any) -> Any:
        def loss_fn(p: Any) -> Any:
            return jnp.mean(models.mlp(p, x) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        if tap is not None:
            norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
            tap({"loss": loss, "grad_norm": norm})
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    return step


class Steps:
    """A sampler: ``steps`` blocked steps, then wait for their taps; time per step."""

    def __init__(
        self, step: Any, params: Any, x: Any, wait: Callable[[], None], steps: int
    ) -> None:
        self.step, self.params, self.x, self.wait, self.steps = step, params, x, wait, steps

    def __call__(self) -> common.Timing:
        p = self.params
        with common.stopwatch() as t:
            for _ in range(self.steps):
                p = jax.block_until_ready(self.step(p, self.x))
            self.wait()
        return t[0] / self.steps


def overhead_rows(
    rounds: int, steps: int
) -> tuple[list[common.Row], dict[str, list[common.Timing]]]:
    params, x = models.mlp_args()
    counter = Counter()
    device = np.array(jax.devices()[:1])
    with partitioner.mesh(device, ("x",)):
        contenders = {
            "partitioner+id_tap": partitioner.pjit(
                _tapped_step(lambda m: id_tap(counter.ours, m)), None, None
            ),
            "partitioner": partitioner.pjit(_tapped_step(None), None, None),
            "jax.jit+debug.callback": jax.jit(
                _tapped_step(lambda m: jax.debug.callback(counter.theirs, m, ordered=True))
            ),
            "jax.jit": jax.jit(_tapped_step(None)),
            "jax.jit+id_tap": jax.jit(_tapped_step(lambda m: id_tap(counter.ours, m))),
        }
        waits = {
            "partitioner+id_tap": barrier_wait,
            "jax.jit+id_tap": barrier_wait,
            "jax.jit+debug.callback": jax.effects_barrier,
        }
        samples = common.interleave(
            {
                name: Steps(fn, params, x, waits.get(name, lambda: None), steps)
                for name, fn in contenders.items()
            },
            rounds,
        )

    def cost(tapped: str, plain: str) -> list[float]:
        return [
            1e6 * (a.wall - b.wall) for a, b in zip(samples[tapped], samples[plain], strict=True)
        ]

    theirs = cost("jax.jit+debug.callback", "jax.jit")
    medians = {k: 1e6 * statistics.median(s.wall for s in v) for k, v in samples.items()}
    rows = [
        common.compare(
            name,
            "us/step",
            cost(tapped, plain),
            theirs,
            OVERHEAD,
            steps_per_sample=steps,
            step_us_medians=medians,
            competitor="jax.debug.callback(ordered=True) in jax.jit",
        )
        for name, tapped, plain in (
            ("tap_cost_in_pjit_mlp_step", "partitioner+id_tap", "partitioner"),
            ("tap_cost_in_jax_jit_mlp_step", "jax.jit+id_tap", "jax.jit"),
        )
    ]
    return rows, samples


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    small_taps, big_taps, rounds = (200, 8, 3) if args.quick else (2000, 64, 25)
    rows = [
        throughput_row("small_1dev", 1, 16, small_taps, rounds),
        throughput_row("small_8dev", 8, 32, small_taps // 4, rounds),
        throughput_row("1MiB_1dev", 1, MiB, big_taps, rounds),
        throughput_row("1MiB_8dev", 8, MiB, big_taps // 2, rounds),
    ]
    cost_rows, step_samples = overhead_rows(*((3, 5) if args.quick else (40, 20)))
    rows += cost_rows
    common.print_rows("host callbacks: time per tap, and tap cost per step", rows)
    for r in rows[:4]:
        print(
            f"{r.name:12} ours {r.extra['partitioner_taps_per_s']:9.0f} taps/s "
            f"{r.extra['partitioner_MB_per_s']:8.1f} MB/s | theirs "
            f"{r.extra['jax_jit_taps_per_s']:9.0f} taps/s {r.extra['jax_jit_MB_per_s']:8.1f} MB/s"
        )
    medians = cost_rows[0].extra["step_us_medians"]
    print("step medians (us):", {k: round(v, 1) for k, v in medians.items()})
    common.write_json(NAME, rows, args.quick, step_samples_s=step_samples)
    common.save_plot(NAME, lambda fig: _draw(fig, rows))


def _draw(fig: Any, rows: list[common.Row]) -> None:
    """Throughput (taps/s, log scale) per case, and the per-step tap cost."""
    left = fig.add_subplot(1, 2, 1)
    tput = rows[:4]
    xs = range(len(tput))
    for i, (side, label) in enumerate((("partitioner", "id_tap"), ("jax_jit", "jax callback"))):
        left.bar(
            [x + (i - 0.5) * 0.4 for x in xs],
            [r.extra[f"{side}_taps_per_s"] for r in tput],
            0.4,
            label=label,
        )
    for x, r in enumerate(tput):
        if r.ratio:
            top = max(r.extra["partitioner_taps_per_s"], r.extra["jax_jit_taps_per_s"])
            left.annotate(f"{1 / r.ratio:.2f}x", (x, top), ha="center", va="bottom", fontsize=9)
    left.set_yscale("log")
    left.set_xticks(list(xs))
    left.set_xticklabels([r.name for r in tput], fontsize=8)
    left.set_ylabel("taps per second (higher is better)")
    left.set_title("throughput; label: ours / theirs")
    left.legend(fontsize=8)
    right = fig.add_subplot(1, 2, 2)
    in_pjit, in_jit = rows[4], rows[5]
    right.bar(
        ["id_tap\nin pjit", "id_tap\nin jax.jit", "debug.callback\nin jax.jit"],
        [in_pjit.partitioner, in_jit.partitioner, in_pjit.jax_jit or 0.0],
    )
    for x, r in enumerate((in_pjit, in_jit)):
        if r.ratio is not None:
            right.annotate(f"{r.ratio:.2f}x", (x, r.partitioner), ha="center", va="bottom")
    right.set_ylabel("us per step over the untapped step")
    right.set_title("tap cost in an MLP step (lower is better)")


if __name__ == "__main__":
    main()
