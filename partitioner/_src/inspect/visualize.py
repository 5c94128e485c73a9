"""Which device holds which block of an array: a terminal grid (and a picture).

Why our own (``jax.debug.visualize_array_sharding`` exists): it draws rank 1 and
2 only and needs ``rich``; layouts of any rank show up here, one grid per block of
the dimensions past the second, replicas listed in their cell.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def _blocks(
    index_map: Mapping[Any, tuple[slice, ...]], shape: Sequence[int]
) -> dict[Any, list[int]]:
    """Each distinct block (a tuple of (start, stop) per dim) -> the device ids holding it."""
    held: dict[Any, list[int]] = {}
    for device, index in index_map.items():
        key = tuple(
            (s.start or 0, n if s.stop is None else s.stop)
            for s, n in zip(index, shape, strict=True)
        )
        held.setdefault(key, []).append(device.id)
    return {k: sorted(v) for k, v in sorted(held.items())}


def _grid(cells: dict[tuple[Any, Any], str], rows: list[Any], cols: list[Any]) -> list[str]:
    width = max(6, *(len(t) + 2 for t in cells.values()))
    bar = "+" + "+".join("-" * width for _ in cols) + "+"
    out = [bar]
    for r in rows:
        out.append("|" + "|".join(cells[(r, c)].center(width) for c in cols) + "|")
        out.append(bar)
    return out


def layout_text(index_map: Mapping[Any, tuple[slice, ...]], shape: Sequence[int]) -> str:
    """The grid of blocks of an array of ``shape`` laid out by ``index_map``."""
    blocks = _blocks(index_map, shape)
    rank = len(shape)
    if rank == 0:
        return "\n".join(
            _grid({(0, 0): "devices " + ",".join(map(str, next(iter(blocks.values()))))}, [0], [0])
        )
    dim_blocks = [sorted({b[d] for b in blocks}) for d in range(rank)]
    rows = dim_blocks[0]
    cols = dim_blocks[1] if rank > 1 else [(0, 1)]
    lines: list[str] = []
    for rest in itertools.product(*dim_blocks[2:]):
        if rest:
            lines.append("dims 2+: " + ", ".join(f"[{a}:{b}]" for a, b in rest))
        cells = {}
        for r in rows:
            for c in cols:
                key = (r, c, *rest)[:rank]
                cells[(r, c)] = ",".join(map(str, blocks.get(key, [])))
        lines += _grid(cells, rows, cols)
    header = (
        f"{len(blocks)} block(s) of "
        + " x ".join(f"{len(b)}" for b in dim_blocks)
        + f" over shape {list(shape)}; a cell lists the devices holding that block"
    )
    return "\n".join([header, *lines])


def visualize(
    x: Any = None,
    *,
    spec: PartitionSpec | None = None,
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    png: str | None = None,
    show: bool = True,
) -> str:
    """Draw which device holds which block of ``x`` (a jax.Array), or of ``shape`` laid out
    as ``spec`` over ``mesh``.

    Returns the text grid (also printed unless ``show=False``); ``png=path`` also
    saves a picture (needs matplotlib).

    Raises:
        ValueError: neither an array nor all of ``spec``, ``shape`` and ``mesh``.
    """
    if x is not None:
        if not isinstance(x, jax.Array):
            raise ValueError(f"visualize: expected a jax.Array, got {type(x).__name__}")
        sharding, shape = x.sharding, tuple(x.shape)
    else:
        if spec is None or shape is None or mesh is None:
            raise ValueError("visualize: give a jax.Array, or spec=, shape= and mesh=")
        sharding, shape = NamedSharding(mesh, spec), tuple(shape)
    index_map = sharding.devices_indices_map(tuple(shape))
    text = layout_text(index_map, shape)
    if png is not None:
        _save_png(index_map, shape, png, *_axis_labels(sharding, shape))
    if show:
        print(text)
    return text


def _axis_labels(sharding: Any, shape: Sequence[int]) -> tuple[list[str], str]:
    """Per dimension, the mesh axes that split it; and a title naming the layout.

    A ``NamedSharding`` names its mesh axes (``dim 0 (8): split over 'data' (4)``);
    other shardings only say how many blocks a dimension has.
    """
    if not isinstance(sharding, NamedSharding):
        return [f"dim {d} ({n})" for d, n in enumerate(shape)], f"shape {list(shape)}"
    sizes = dict(sharding.mesh.shape)
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    labels: list[str] = []
    used: set[str] = set()
    for d, (n, entry) in enumerate(zip(shape, spec)):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        axes = tuple(a for a in axes if isinstance(a, str))
        used.update(axes)
        over = " x ".join(f"'{a}' ({sizes[a]})" for a in axes)
        labels.append(f"dim {d} ({n}): " + (f"split over {over}" if axes else "not split"))
    mesh_text = " x ".join(f"{a}={n}" for a, n in sizes.items())
    replicated = [a for a in sizes if a not in used and sizes[a] > 1]
    title = f"{sharding.spec!r} of {list(shape)} over mesh {mesh_text}"
    if replicated:
        title += (
            f"\neach block on {math.prod(sizes[a] for a in replicated)} devices: replicated over "
            + ", ".join(f"'{a}'" for a in replicated)
        )
    return labels, title


def _save_png(
    index_map: Mapping[Any, tuple[slice, ...]],
    shape: Sequence[int],
    path: str,
    labels: list[str],
    title: str,
) -> None:
    """The first grid (dims 0 and 1) as rectangles, one colour per device set (as
    ``jax.debug.visualize_array_sharding`` colours them), each labelled with its devices,
    the axes labelled with the mesh axes that split them."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _draw_blocks(ax, _blocks(index_map, shape), shape, labels, title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib  # optional: only for pictures
    except ImportError:
        raise ImportError(
            "visualize(png=...) draws with matplotlib: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_blocks(
    ax: Any,
    blocks: Mapping[Any, list[int]],
    shape: Sequence[int],
    labels: Sequence[str],
    title: str,
    fontsize: float,
) -> None:
    """Draw the blocks of dims 0 and 1 (the first block of dims 2+) on ``ax``."""
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    rank = len(shape)
    first_rest = tuple(sorted({b[2:] for b in blocks}))[0] if rank > 2 else ()
    shown = [(k, v) for k, v in blocks.items() if rank <= 2 or k[2:] == first_rest]
    colours = _colours(len(shown))
    for i, (key, devices) in enumerate(shown):
        (r0, r1) = key[0] if rank else (0, 1)
        (c0, c1) = key[1] if rank > 1 else (0, 1)
        colour = colours(i % colours.N)
        ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, fc=colour, alpha=0.55, ec="black"))
        name = "device" if len(devices) == 1 else "devices"
        ax.text(
            (c0 + c1) / 2,
            (r0 + r1) / 2,
            f"{name}\n" + ",".join(map(str, devices)),
            ha="center",
            va="center",
            fontsize=fontsize,
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, shape[1] if rank > 1 else 1)
    ax.set_ylim(shape[0] if rank else 1, 0)
    ax.set_ylabel(labels[0] if rank else "", fontsize=fontsize)
    ax.set_xlabel(labels[1] if rank > 1 else "", fontsize=fontsize)
    if rank > 2:
        title += "\nthe first block of dims 2+: " + ", ".join(f"[{a}:{b}]" for a, b in first_rest)
    ax.set_title(title, fontsize=fontsize + 1)


def _colours(n: int) -> Any:
    import matplotlib.pyplot as plt

    return plt.get_cmap("tab20" if n > 10 else "tab10")


# --- the picture of an AUTO choice ---

#: Panels drawn at most in a choice's picture (the text lists every input).
MAX_PANELS = 12


def choice_index_map(
    shape: Sequence[int], layout: Sequence[Sequence[str]], mesh: Mapping[str, int]
) -> dict[int, tuple[slice, ...]]:
    """Device position -> its block of ``shape`` laid out as ``layout`` over ``mesh``
    (each dimension's axes major to minor, as a ``NamedSharding`` reads a spec)."""
    names, sizes = list(mesh), list(mesh.values())
    out: dict[int, tuple[slice, ...]] = {}
    for p in range(math.prod(sizes)):
        coords = dict(zip(names, _unravel(p, sizes), strict=True))
        index = []
        for n, axes in zip(shape, layout, strict=True):
            parts = math.prod(mesh[a] for a in axes)
            k = 0
            for a in axes:
                k = k * mesh[a] + coords[a]
            index.append(slice(k * n // parts, (k + 1) * n // parts))
        out[p] = tuple(index)
    return out


def _unravel(p: int, sizes: Sequence[int]) -> list[int]:
    coords = []
    for n in reversed(sizes):
        coords.append(p % n)
        p //= n
    return coords[::-1]


@dataclasses.dataclass(frozen=True)
class ChosenLayout:
    """One AUTO input as the choice's picture draws it.

    Attributes:
        path: the input leaf (``args[0]['w1']``).
        shape: its global shape.
        layout: per dimension, the mesh axes that split it, major to minor.
        spec: the chosen spec as the report prints it.
    """

    path: str
    shape: tuple[int, ...]
    layout: tuple[tuple[str, ...], ...]
    spec: str

    def dim_labels(self, mesh: Mapping[str, int]) -> list[str]:
        """``dim 0 (8): split over 'data' (4)`` for each dimension."""
        return [
            f"dim {d} ({n}): "
            + (
                "split over " + " x ".join(f"'{a}' ({mesh[a]})" for a in axes)
                if axes
                else "not split"
            )
            for d, (n, axes) in enumerate(zip(self.shape, self.layout, strict=True))
        ]


def visualize_choice(
    inputs: Sequence[ChosenLayout],
    mesh: Mapping[str, int],
    device_ids: Sequence[int],
    png: str | None = None,
    note: str = "",
) -> str:
    """Per AUTO input, which mesh axes split which dimension: a line each, and with
    ``png`` a picture with a panel each (up to :data:`MAX_PANELS`), blocks coloured by
    the devices holding them as :func:`visualize` colours them. ``device_ids`` are
    the mesh's devices in mesh order; ``note`` (what the plan recomputes) ends the text
    and titles the picture."""
    lines = [f"{i.path} {list(i.shape)} {i.spec}: " + "; ".join(i.dim_labels(mesh)) for i in inputs]
    if png is not None:
        _choice_png(inputs, mesh, device_ids, png, note)
    return "\n".join(lines + ([note] if note else []))


def _choice_png(
    inputs: Sequence[ChosenLayout],
    mesh: Mapping[str, int],
    device_ids: Sequence[int],
    png: str,
    note: str,
) -> None:
    plt = _pyplot()
    n = min(len(inputs), MAX_PANELS)
    cols = min(n, 4)
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        one = inputs[k]
        where = choice_index_map(one.shape, one.layout, mesh)
        blocks = _blocks({_Device(device_ids[p]): s for p, s in where.items()}, one.shape)
        title = f"{one.path}\n{one.spec}"
        _draw_blocks(ax, blocks, one.shape, one.dim_labels(mesh), title, fontsize=7)
    more = len(inputs) - n
    mesh_text = " x ".join(f"{a}={s}" for a, s in mesh.items())
    fig.suptitle(
        f"AUTO layouts over mesh {mesh_text}"
        + (f" (and {more} more inputs)" if more else "")
        + (f"\n{note}" if note else "")
    )
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


@dataclasses.dataclass(frozen=True)
class _Device:
    """A device as :func:`_blocks` reads one (by its id)."""

    id: int


# --- the picture of a pipeline's schedule ---


def schedule_png(cells: Sequence[Sequence[tuple[str, int, int]]], path: str, title: str) -> None:
    """A pipeline's schedule as a picture (``PipelinePlan.chart(png=...)``): a row per
    stage, a column per step, each cell ``cells[stage][step] = (letter, microbatch,
    visit)``: a forward (``F``) coloured by its microbatch, a backward (``B``) the same
    colour hatched, a weight gradient (``W``) the same colour pale and dotted, the bubble
    (``.``) left blank; later visits paler."""
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    stages, steps = len(cells), len(cells[0])
    busy = [c for row in cells for c in row if c[0] != "."]
    visits = 1 + max((visit for _, _, visit in busy), default=0)
    micros = 1 + max((micro for _, micro, _ in busy), default=0)
    colours = _colours(micros)
    fig, ax = plt.subplots(figsize=(min(1.2 + 0.42 * steps, 24), 0.9 + 0.55 * stages))
    for stage, row in enumerate(cells):
        for step, (letter, micro, visit) in enumerate(row):
            if letter == ".":
                ax.add_patch(Rectangle((step, stage), 1, 1, fc="white", ec="lightgray"))
                continue
            alpha = 0.85 - 0.5 * visit / max(visits - 1, 1) if visits > 1 else 0.7
            ax.add_patch(
                Rectangle(
                    (step, stage), 1, 1, fc=colours(micro % colours.N), ec="black",
                    alpha=0.3 if letter == "W" else alpha,
                    hatch={"B": "///", "W": "..."}.get(letter),
                )
            )  # fmt: skip
            label = letter + str(micro) + (chr(ord("a") + visit) if visits > 1 else "")
            ax.text(step + 0.5, stage + 0.5, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, steps)
    ax.set_ylim(stages, 0)
    ticks = range(0, steps, max(1, steps // 30))
    ax.set_xticks([s + 0.5 for s in ticks], [str(s) for s in ticks], fontsize=8)
    ax.set_yticks([s + 0.5 for s in range(stages)], [f"stage {s}" for s in range(stages)])
    ax.set_xlabel(
        "step, one forward's time (F forward, B backward, W weight gradient; blank: the bubble)"
    )
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
